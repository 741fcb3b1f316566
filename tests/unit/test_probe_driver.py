"""Driver and GPU probes with canned NVML / /proc / nvidia-smi answers and real files."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from dnnctl.doctor.host import Host
from dnnctl.doctor.probe_driver import probe_driver


def _load_fakes():
    path = Path(__file__).resolve().parents[1] / "data" / "probes" / "fakes.py"
    if "dnnctl_probe_fakes" not in sys.modules:
        spec = importlib.util.spec_from_file_location("dnnctl_probe_fakes", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    return sys.modules["dnnctl_probe_fakes"]


fakes = _load_fakes()
LD = {"libcuda.so.1": ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"],
      "libnvidia-ml.so.1": ["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"]}
DRIVER_550 = {
    "/proc/driver/nvidia/version": fakes.canned("proc-version-550.txt"),
    "/dev/nvidia0": None, "/dev/nvidiactl": None,
    "/usr/lib/x86_64-linux-gnu/libcuda.so.550.90.07": None,
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1": fakes.Link("libcuda.so.550.90.07"),
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.90.07": None,
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1": fakes.Link("libnvidia-ml.so.550.90.07"),
}


def test_h200_through_nvml(tmp_path):
    host, _, nvml = fakes.h200_host(tmp_path)
    from dnnctl.doctor.detect import ldconfig_cache

    out = probe_driver(host, ldconfig_cache(host)[0])
    assert out.driver == {
        "present": True, "kernel_module": "580.159.04", "device_nodes": 1,
        "libcuda": "/usr/local/nvidia/lib64/libcuda.so.1", "library": "580.159.04",
        "version": "580.159.04", "source": "nvml", "cuda": "13.0"}
    assert [(g.index, g.name, g.compute_capability, g.memory_mib) for g in out.gpus] == \
        [(0, "NVIDIA H200", "9.0", 143771)]
    assert out.gpus[0].uuid.startswith("GPU-1668e940")
    assert out.gpus_known and out.notes == []
    assert nvml.shutdown


def test_no_driver_anywhere(tmp_path):
    host = fakes.make_host(tmp_path, nvml=lambda: fakes.FakeNvml(init_error=12))
    out = probe_driver(host, {})
    assert out.driver["present"] is False
    assert "no nvidia kernel module" in out.driver["reason"]
    assert "error" not in out.driver  # not a probe problem: there is simply no driver
    assert out.gpus == [] and not out.gpus_known


def test_no_pynvml_and_no_driver(tmp_path):
    out = probe_driver(fakes.make_host(tmp_path), {})
    assert out.driver["present"] is False and out.driver["device_nodes"] == 0


def test_container_without_device_nodes(tmp_path):
    host = fakes.make_host(tmp_path, files={
        "/proc/driver/nvidia/version": fakes.canned("proc-version-550.txt")},
        nvml=lambda: fakes.FakeNvml(init_error=12))
    out = probe_driver(host, {})
    assert out.driver["present"] is False
    assert out.driver["kernel_module"] == "550.90.07"
    assert "no /dev/nvidia* device nodes" in out.driver["reason"]
    assert "--gpus" in out.driver["reason"]


def test_kernel_module_without_userspace_library(tmp_path):
    host = fakes.make_host(tmp_path, files={
        "/proc/driver/nvidia/version": fakes.canned("proc-version-550.txt"),
        "/dev/nvidia0": None}, nvml=lambda: fakes.FakeNvml(init_error=12))
    out = probe_driver(host, {})
    assert out.driver["present"] is False
    assert "libcuda.so.1 is missing" in out.driver["reason"]


def test_library_without_kernel_module(tmp_path):
    files = {k: v for k, v in DRIVER_550.items() if not k.startswith(("/proc", "/dev"))}
    host = fakes.make_host(tmp_path, files=files, nvml=lambda: fakes.FakeNvml(init_error=9))
    out = probe_driver(host, LD)
    assert out.driver["present"] is False
    assert "kernel module is not loaded" in out.driver["reason"]
    assert out.driver["library"] == "550.90.07"


def test_driver_library_mismatch_after_upgrade(tmp_path):
    files = dict(DRIVER_550)
    files["/usr/lib/x86_64-linux-gnu/libcuda.so.1"] = fakes.Link("libcuda.so.550.127.05")
    files["/usr/lib/x86_64-linux-gnu/libcuda.so.550.127.05"] = None
    host = fakes.make_host(tmp_path, files=files, nvml=lambda: fakes.FakeNvml(init_error=18))
    out = probe_driver(host, LD)
    d = out.driver
    assert d["present"] is True and d["mismatch"] is True
    assert (d["kernel_module"], d["library"], d["version"]) == \
        ("550.90.07", "550.127.05", "550.90.07")
    assert "version mismatch" in d["error"]
    assert any("Driver/library version mismatch" in n for n in out.notes)


def test_permission_denied_on_nvml(tmp_path):
    host = fakes.make_host(tmp_path, files=DRIVER_550, nvml=lambda: fakes.FakeNvml(init_error=4))
    out = probe_driver(host, LD)
    assert out.driver["present"] is True
    assert "Insufficient Permissions" in out.driver["error"]
    assert "/dev/nvidia" in out.driver["error"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_proc_file(tmp_path):
    host = fakes.make_host(tmp_path, files={"/proc/driver/nvidia/version": "x"})
    host.path("/proc/driver/nvidia/version").chmod(0)
    out = probe_driver(host, {})
    assert any("permission denied" in n for n in out.notes)


def test_garbage_kernel_module_text(tmp_path):
    host = fakes.make_host(tmp_path, files={
        "/proc/driver/nvidia/version": fakes.canned("proc-version-garbage.txt")})
    out = probe_driver(host, {})
    assert out.driver["present"] is False and "kernel_module" not in out.driver
    assert any("unrecognised kernel module version" in n for n in out.notes)


def test_nvml_binding_missing_falls_back_to_libcuda_and_nvidia_smi(tmp_path):
    host = fakes.make_host(tmp_path, files={**DRIVER_550, "/usr/bin/nvidia-smi": "#!/bin/sh\n"},
                           runner=fakes.FakeRunner(commands={
                               "nvidia-smi": fakes.canned("nvidia-smi-query-8xh100.csv")}))
    host.path("/usr/bin/nvidia-smi").chmod(0o755)
    lib = fakes.compile_lib(host.path("/usr/lib/x86_64-linux-gnu/libcuda.so.550.90.07"),
                            fakes.FAKE_LIBCUDA.format(version=12040))
    if lib is None:
        pytest.skip("no C compiler to build a stand-in libcuda")
    out = probe_driver(host, LD)
    d = out.driver
    assert d["present"] is True and d["cuda"] == "12.4"
    assert d["version"] == "550.90.07" and d["source"] == "proc"
    assert "pynvml" in d["error"]
    assert len(out.gpus) == 8 and out.gpus[7].memory_mib is None
    assert {g.compute_capability for g in out.gpus} == {"9.0"}


def test_libcuda_that_cannot_load_is_a_note(tmp_path):
    host = fakes.make_host(tmp_path, files={**DRIVER_550,
                           "/usr/lib/x86_64-linux-gnu/libcuda.so.550.90.07": "not an ELF"})
    out = probe_driver(host, LD)
    assert any(n.startswith("libcuda:") for n in out.notes)
    assert out.driver["present"] is True  # kernel module + library + device nodes
    assert "cuda" not in out.driver


def test_gpu_names_from_proc_when_nothing_else_lists_them(tmp_path):
    host = fakes.make_host(tmp_path, files={
        **DRIVER_550, "/proc/driver/nvidia/gpus/0000:07:00.0/information":
            fakes.canned("proc-gpu-information-a100.txt")},
        nvml=lambda: fakes.FakeNvml(init_error=999))
    out = probe_driver(host, LD)
    assert [(g.index, g.name, g.compute_capability) for g in out.gpus] == \
        [(0, "NVIDIA A100-SXM4-80GB", None)]


def test_lost_gpu_keeps_the_others(tmp_path):
    gpus = [{"name": "NVIDIA A100-SXM4-80GB", "cc": (8, 0), "memory": 85899345920}] * 2
    host = fakes.make_host(tmp_path, files=DRIVER_550,
                           nvml=lambda: fakes.FakeNvml("550.90.07", 12040, gpus, lost=[1]))
    out = probe_driver(host, LD)
    assert out.gpus[0].compute_capability == "8.0" and out.gpus[0].memory_mib == 81920
    assert out.gpus[1].name is None and out.gpus[1].index == 1
    assert any("GPU 1" in n and "lost" in n for n in out.notes)


def test_driver_sees_no_gpu(tmp_path):
    host = fakes.make_host(tmp_path, files=DRIVER_550,
                           nvml=lambda: fakes.FakeNvml("550.90.07", 12040, []))
    out = probe_driver(host, LD)
    assert out.driver["present"] is True and out.gpus == [] and out.gpus_known


def test_forward_compat_library(tmp_path):
    files = {**DRIVER_550, "/usr/local/cuda-12.8/compat/libcuda.so.570.124.06": None,
             "/usr/local/cuda-12.8/compat/libcuda.so.1": fakes.Link("libcuda.so.570.124.06")}
    host = fakes.make_host(tmp_path, files=files,
                           environ={"LD_LIBRARY_PATH": "/usr/local/cuda-12.8/compat"},
                           nvml=lambda: fakes.FakeNvml("550.90.07", 12040, []))
    if fakes.compile_lib(host.path("/usr/local/cuda-12.8/compat/libcuda.so.570.124.06"),
                         fakes.FAKE_LIBCUDA.format(version=12080)) is None:
        pytest.skip("no C compiler to build a stand-in libcuda")
    out = probe_driver(host, LD)
    d = out.driver
    assert d["forward_compat"] == "12.8"
    assert d["libcuda"] == "/usr/local/cuda-12.8/compat/libcuda.so.1"
    assert d["library"] == "550.90.07" and "mismatch" not in d  # from libnvidia-ml


def test_realpath_follows_absolute_links_inside_root(tmp_path):
    root = fakes.make_root(tmp_path, {"/usr/local/cuda-12.4/lib64/libcudart.so.12.4.127": None,
                                      "/etc/alternatives/cuda": fakes.Link("/usr/local/cuda-12.4"),
                                      "/usr/local/cuda": fakes.Link("/etc/alternatives/cuda")})
    host = Host(root=root)
    assert host.realpath("/usr/local/cuda/lib64") == "/usr/local/cuda-12.4/lib64"
    assert host.exists("/usr/local/cuda/lib64/libcudart.so.12.4.127")
    assert host.glob("/usr/local/cuda/lib64/libcudart.so.*") == [
        "/usr/local/cuda-12.4/lib64/libcudart.so.12.4.127"]
