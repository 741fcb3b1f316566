"""The NVML child process against a real stand-in ``libnvidia-ml.so.1`` (compiled here):
the ctypes calls, a GPU list, an NVML error, a library that hangs and one that crashes."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from _doctor_helpers import probe_fakes

from dnnctl.doctor.host import Host
from dnnctl.doctor.probe_driver import DriverProbe, probe_nvml

_fakes = probe_fakes


NVML_C = r"""
#include <string.h>
#include <unistd.h>
#include <stdlib.h>
typedef struct { unsigned long long total, free, used; } Mem;
static const char *names[] = {"NVIDIA H200", "NVIDIA B200"};
int nvmlInit_v2(void) { MODE_INIT; return 0; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int rc) { return rc == 999 ? "Unknown Error" : "other"; }
int nvmlSystemGetDriverVersion(char *b, unsigned n) { strncpy(b, "580.159.04", n); return 0; }
int nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 13000; return 0; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) { *h = (void *)(size_t)(i + 1); return 0; }
int nvmlDeviceGetName(void *h, char *b, unsigned n) { strncpy(b, names[(size_t)h - 1], n); return 0; }
int nvmlDeviceGetUUID(void *h, char *b, unsigned n) { return 999; }
int nvmlDeviceGetCudaComputeCapability(void *h, int *a, int *b) {
  *a = (size_t)h == 1 ? 9 : 10; *b = 0; return 0; }
int nvmlDeviceGetMemoryInfo(void *h, Mem *m) { m->total = 143771ULL << 20; return 0; }
int nvmlDeviceGetComputeMode(void *h, unsigned *m) {  /* H200 exclusive process; B200 error */
  if ((size_t)h != 1) return 999;
  *m = 3; return 0; }
int nvmlDeviceGetDisplayActive(void *h, unsigned *a) {  /* the B200 drives a display */
  *a = (size_t)h == 1 ? 0 : 1; return 0; }
typedef struct { char uuid[16]; int status; unsigned clique; unsigned char state; } Fab;
int nvmlDeviceGetGpuFabricInfo(void *h, Fab *f) {  /* the H200 on a fabric; B200: 3 */
  if ((size_t)h != 1) return 3;
  memset(f, 0, sizeof *f); f->state = 3; f->clique = 7; return 0; }
"""


def _host(tmp_path: Path, init: str, monkeypatch: pytest.MonkeyPatch) -> Host:
    fakes = _fakes()
    lib = fakes.compile_lib(tmp_path / "lib" / "libnvidia-ml.so.1",
                            NVML_C.replace("MODE_INIT", init))
    if lib is None:
        pytest.skip("no C compiler to build a stand-in libnvidia-ml")
    # the child inherits this process's environment and finds the library as the real one
    # is found: through the dynamic loader
    monkeypatch.setenv("LD_LIBRARY_PATH", str(lib.parent))
    return Host(python=sys.executable)


def test_child_reads_gpus_through_ctypes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = DriverProbe()
    assert probe_nvml(_host(tmp_path, "(void)0", monkeypatch), out) is None
    assert out.driver == {"version": "580.159.04", "source": "nvml", "cuda": "13.0"}
    assert [(g.name, g.compute_capability, g.memory_mib) for g in out.gpus] == [
        ("NVIDIA H200", "9.0", 143771), ("NVIDIA B200", "10.0", 143771)]
    assert any("uuid" in n and "Unknown Error" in n for n in out.notes)
    # nvmlGpuFabricInfo_t read through ctypes; NOT_SUPPORTED leaves the state unknown
    assert [g.fabric for g in out.gpus] == [{"state": "completed", "status": "success"}, None]
    # nvmlComputeMode_t 3 is exclusive_process; a GPU that does not answer stays unknown
    assert [g.compute_mode for g in out.gpus] == ["exclusive_process", None]
    # nvmlEnableState_t read as a flag
    assert [g.display_active for g in out.gpus] == [False, True]


def test_init_error_code_comes_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = DriverProbe()
    assert probe_nvml(_host(tmp_path, "return 999", monkeypatch), out) == (999, "Unknown Error")


def test_hanging_library_is_cut_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = DriverProbe()
    started = time.monotonic()
    failed = probe_nvml(_host(tmp_path, "sleep(60)", monkeypatch), out)
    assert time.monotonic() - started < 4
    assert failed is not None and "timed out" in failed[1]
    assert any(n.startswith("probe failed: NVML") for n in out.notes)


def test_crashing_library_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = DriverProbe()
    failed = probe_nvml(_host(tmp_path, "abort()", monkeypatch), out)
    assert failed is not None and "crashed" in failed[1]
