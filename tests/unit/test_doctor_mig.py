"""MIG devices: detected through NVML (and `nvidia-smi -L`), carried in the snapshot, and judged:
more MIG devices visible to one process than CUDA enumerates is a warning (NVIDIA MIG user guide,
"CUDA Device Enumeration"; pytorch/pytorch#130181)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _doctor_helpers import doctor, probe_fakes
from typer.testing import CliRunner

from dnnctl.cli.app import app
from dnnctl.compat.matrix import load_matrix
from dnnctl.doctor import parse
from dnnctl.doctor.envfile import load_env, parse_env, save_env
from dnnctl.doctor.host import Host
from dnnctl.doctor.probe_driver import DriverProbe, _with_smi_migs, probe_nvml
from dnnctl.doctor.rules import judge
from dnnctl.errors import InputFileError

_fakes = probe_fakes


A, B = "MIG-c788539f-c1ea-5a36-8b4d-9b07d024b1bb", "MIG-405bbda1-6b05-535f-9702-f95e8cd170ce"
PARENT = "GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77"
A100 = "NVIDIA A100-SXM4-80GB"


def _detected(driver: str, profiles: tuple[str, str] = ("3g.40gb", "3g.40gb"),
              gis: tuple[int, int] = (1, 2), visible: str | None = None) -> str:
    text = (f"schema: dnnctl-env/1\nos: Linux\ndriver: {{version: {driver}}}\ngpus:\n"
            f"  - {{index: 0, name: {A100}, uuid: {PARENT}, compute_capability: '8.0', "
            "mig: {mode: true}}\n")
    for uuid, profile, gi in zip((A, B), profiles, gis):
        text += (f"  - {{name: {A100} MIG {profile}, uuid: {uuid}, compute_capability: '8.0', "
                 f"mig: {{profile: {profile}, parent: {PARENT}, gpu_instance: {gi}, "
                 "compute_instance: 0}}\n")
    if visible is not None:
        text += f"environment: {{CUDA_VISIBLE_DEVICES: '{visible}'}}\n"
    return text + "frameworks: {torch: {version: 2.5.1+cu124}}\n"


def _doctor(tmp_path: Path, text: str) -> tuple[int, str, list[tuple[str, str, str]]]:
    d = doctor(tmp_path, text)
    mig = [(f["severity"], f["code"], f["fix"] or "") for f in d.of("mig-enumeration")]
    return d.code, d.text, mig


def test_two_slices_in_one_process_before_r570(tmp_path: Path) -> None:
    code, out, mig = _doctor(tmp_path, _detected("535.183.01"))
    assert code == 0 and [(s, c) for s, c, _ in mig] == [("warning", "mig-enumeration")]
    assert f"export CUDA_VISIBLE_DEVICES={A}" in mig[0][2] and "nvidia-smi -L" in mig[0][2]
    assert "driver 535.183.01 (before R570)" in " ".join(out.split())
    assert "MIG device:" in out and "(MIG mode)" in out
    assert "not a whole GPU" in " ".join(out.split())
    strict = CliRunner().invoke(app, ["doctor", "--strict", "--from", str(tmp_path / "env.yaml")])
    assert strict.exit_code == 1


def test_one_slice_per_process_is_fine(tmp_path: Path) -> None:
    for visible in (A, A[:12], f"{B}"):
        code, _, mig = _doctor(tmp_path, _detected("535.183.01", visible=visible))
        assert code == 0 and mig == [], visible
    # a hand-written list names two slices the snapshot does not otherwise know
    code, _, mig = _doctor(tmp_path, _detected("535.183.01", visible="MIG-aaaa,MIG-bbbb"))
    assert [(s, c) for s, c, _ in mig] == [("warning", "mig-enumeration")]


def test_r570_enumerates_one_compute_instance_per_gpu_instance(tmp_path: Path) -> None:
    # two GPU instances: both usable from one process
    assert _doctor(tmp_path, _detected("570.124.06"))[2] == []
    # two compute instances of one GPU instance: CUDA picks one of them
    shared = _detected("570.124.06", profiles=("1c.3g.40gb", "2c.3g.40gb"), gis=(1, 1))
    code, out, mig = _doctor(tmp_path, shared)
    assert [(s, c) for s, c, _ in mig] == [("warning", "mig-enumeration")]
    assert "same GPU instance" in " ".join(out.split())


def test_a_bug_report_that_only_names_the_slices(tmp_path: Path) -> None:
    # pytorch/pytorch#130181: "2 GPU NVIDIA-A100-SXM4-80GB-MIG-3g.40gb", no driver stated
    text = ("schema: dnnctl-env/1\nos: Linux\ngpus:\n  - {name: NVIDIA A100-SXM4-80GB MIG 3g.40gb}\n"
            "  - {name: NVIDIA A100-SXM4-80GB MIG 3g.40gb}\n")
    code, out, mig = _doctor(tmp_path, text)
    assert code == 0 and [(s, c) for s, c, _ in mig] == [("warning", "mig-enumeration")]
    flat = " ".join(out.split())
    assert "with a driver before R570" in flat and "R570 and later" in flat
    assert "2 on NVIDIA A100-SXM4-80GB (3g.40gb, 3g.40gb)" in flat


def test_whole_gpus_are_not_mig(tmp_path: Path) -> None:
    text = ("schema: dnnctl-env/1\ndriver: {version: 535.183.01}\n"
            "gpus: [{name: NVIDIA H100 80GB HBM3}, {name: NVIDIA H100 80GB HBM3}]\n")
    code, out, mig = _doctor(tmp_path, text)
    assert code == 0 and mig == [] and "MIG" not in out


def test_snapshot_fields_round_trip_and_are_checked(tmp_path: Path) -> None:
    env = parse_env(_detected("535.183.01", visible=A))
    assert env.gpus[1].mig == {"profile": "3g.40gb", "parent": PARENT, "gpu_instance": 1,
                               "compute_instance": 0}
    assert env.gpus[0].mig == {"mode": True} and env.environment == {"CUDA_VISIBLE_DEVICES": A}
    assert load_env(save_env(env, tmp_path / "env.yaml")) == env
    with pytest.raises(InputFileError, match="unknown field 'slice'"):
        parse_env("gpus: [{name: A100, mig: {slice: 3g.40gb}}]\n")
    with pytest.raises(InputFileError, match="unknown field 'PATH'"):
        parse_env("environment: {PATH: /usr/bin}\n")
    with pytest.raises(InputFileError, match="whole number"):
        parse_env("gpus: [{name: A100, mig: {gpu_instance: one}}]\n")


class MigNvml(_fakes().FakeNvml):
    """FakeNvml with GPU 0 in MIG mode: slots 0 and 2 hold MIG devices, slot 1 is empty."""

    def nvmlDeviceGetMigMode(self, h):  # noqa: N802
        if isinstance(h, tuple) or h != 0:
            raise self.NVMLError(3)
        return [1, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):  # noqa: N802
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, slot):  # noqa: N802
        if slot not in (0, 2):
            raise self.NVMLError(6)
        return (h, slot)

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return f"{A100} MIG 3g.40gb".encode() if isinstance(h, tuple) else super() \
            .nvmlDeviceGetName(h)

    def nvmlDeviceGetUUID(self, h):  # noqa: N802
        return (A if h[1] == 0 else B) if isinstance(h, tuple) else super().nvmlDeviceGetUUID(h)

    def nvmlDeviceGetGpuInstanceId(self, h):  # noqa: N802
        return 1 + h[1]

    def nvmlDeviceGetComputeInstanceId(self, h):  # noqa: N802
        return 0

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        return super().nvmlDeviceGetMemoryInfo(h[0] if isinstance(h, tuple) else h)


def test_nvml_lists_mig_devices_under_their_gpu(tmp_path: Path) -> None:
    gpus = [{"name": A100, "cc": (8, 0), "memory": 81920 << 20, "uuid": PARENT},
            {"name": A100, "cc": (8, 0), "memory": 81920 << 20}]
    host = _fakes().make_host(tmp_path, nvml=lambda: MigNvml("535.183.01", 12020, gpus))
    out = DriverProbe()
    assert probe_nvml(host, out) is None
    got = [(g.index, g.name, g.uuid, g.mig) for g in out.gpus]
    assert got == [
        (0, A100, PARENT, {"mode": True}),
        (None, f"{A100} MIG 3g.40gb", A, {"parent": PARENT, "gpu_instance": 1,
                                           "compute_instance": 0, "profile": "3g.40gb"}),
        (None, f"{A100} MIG 3g.40gb", B, {"parent": PARENT, "gpu_instance": 3,
                                           "compute_instance": 0, "profile": "3g.40gb"}),
        (1, A100, "GPU-00000001", None)]
    assert all(g.compute_capability == "8.0" for g in out.gpus) and out.notes == []


NVML_MIG_C = r"""
#include <string.h>
typedef struct { unsigned long long total, free, used; } Mem;
static int mig(void *h) { return (size_t)h >= 100; }
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int rc) { return rc == 3 ? "Not Supported" : "Not Found"; }
int nvmlSystemGetDriverVersion(char *b, unsigned n) { strncpy(b, "535.183.01", n); return 0; }
int nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 12020; return 0; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) { *h = (void *)(size_t)(i + 1); return 0; }
int nvmlDeviceGetName(void *h, char *b, unsigned n) {
  strncpy(b, mig(h) ? "NVIDIA A100-SXM4-80GB MIG 3g.40gb" : "NVIDIA A100-SXM4-80GB", n); return 0; }
int nvmlDeviceGetUUID(void *h, char *b, unsigned n) {
  size_t k = (size_t)h;
  strncpy(b, k == 100 ? "MIG-aaaa" : k == 102 ? "MIG-bbbb" : k == 1 ? "GPU-1111" : "GPU-2222", n);
  return 0; }
int nvmlDeviceGetCudaComputeCapability(void *h, int *a, int *b) { *a = 8; *b = 0; return 0; }
int nvmlDeviceGetMemoryInfo(void *h, Mem *m) { m->total = (mig(h) ? 40192ULL : 81920ULL) << 20;
  return 0; }
int nvmlDeviceGetMigMode(void *h, unsigned *cur, unsigned *pend) {
  if ((size_t)h != 1) return 3; *cur = *pend = 1; return 0; }
int nvmlDeviceGetMaxMigDeviceCount(void *h, unsigned *n) { *n = 7; return 0; }
int nvmlDeviceGetMigDeviceHandleByIndex(void *h, unsigned i, void **m) {
  if (i != 0 && i != 2) return 6; *m = (void *)(size_t)(100 + i); return 0; }
int nvmlDeviceGetGpuInstanceId(void *h, unsigned *id) { *id = (size_t)h == 100 ? 1 : 2; return 0; }
int nvmlDeviceGetComputeInstanceId(void *h, unsigned *id) { *id = 0; return 0; }
"""


def test_nvml_child_reads_mig_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = _fakes().compile_lib(tmp_path / "lib" / "libnvidia-ml.so.1", NVML_MIG_C)
    if lib is None:
        pytest.skip("no C compiler to build a stand-in libnvidia-ml")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(lib.parent))
    out = DriverProbe()
    assert probe_nvml(Host(python=sys.executable), out) is None
    got = [(g.index, g.uuid, g.memory_mib, g.mig) for g in out.gpus]
    assert got == [
        (0, "GPU-1111", 81920, {"mode": True}),
        (None, "MIG-aaaa", 40192, {"parent": "GPU-1111", "gpu_instance": 1,
                                   "compute_instance": 0, "profile": "3g.40gb"}),
        (None, "MIG-bbbb", 40192, {"parent": "GPU-1111", "gpu_instance": 2,
                                   "compute_instance": 0, "profile": "3g.40gb"}),
        (1, "GPU-2222", 81920, None)]
    from dnnctl.doctor.model import EnvSnapshot

    env = EnvSnapshot(driver={"version": "535.183.01"}, gpus=out.gpus)
    codes = [(f.severity, f.code) for f in judge(env, load_matrix()) if f.severity != "info"]
    assert codes == [("warning", "mig-enumeration")]


def test_nvidia_smi_listing_adds_mig_devices() -> None:
    text = (f"GPU 0: {A100} (UUID: {PARENT})\n"
            f"  MIG 3g.40gb     Device  0: (UUID: {A})\n"
            f"  MIG 3g.40gb     Device  1: (UUID: {B})\n"
            "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-0aa11ebd-627f-af3f-1a0d-4e1fd92fd7b0)\n")
    listing = parse.nvidia_smi_list(text)
    assert [len(g["migs"]) for g in listing] == [2, 0]
    from dnnctl.doctor.model import Gpu

    gpus = _with_smi_migs([Gpu(index=0, name=A100, uuid=PARENT, compute_capability="8.0"),
                           Gpu(index=1, name=A100)], listing)
    assert [(g.index, g.uuid, (g.mig or {}).get("profile")) for g in gpus] == [
        (0, PARENT, None), (None, A, "3g.40gb"), (None, B, "3g.40gb"), (1, None, None)]
    assert gpus[0].mig == {"mode": True} and gpus[1].mig["parent"] == PARENT
    assert parse.mig_profile("NVIDIA-A100-SXM4-80GB-MIG-3g.40gb") == "3g.40gb"
    assert parse.mig_profile("NVIDIA H100 80GB HBM3") is None
