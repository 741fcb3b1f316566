"""cuInit failing while NVML lists GPUs: the probe records it (driver.cuinit, from the libcuda
child) and the doctor names nvidia_uvm after a suspend for CUDA_ERROR_UNKNOWN (999)."""

from __future__ import annotations

import pytest
from _doctor_helpers import doctor, probe_fakes

from dnnctl.doctor.probe_driver import probe_driver

fakes = probe_fakes()
LD = {"libcuda.so.1": ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"]}
DRIVER = {
    "/proc/driver/nvidia/version": fakes.canned("proc-version-550.txt"),
    "/dev/nvidia0": None, "/dev/nvidiactl": None,
    "/usr/lib/x86_64-linux-gnu/libcuda.so.550.90.07": None,
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1": fakes.Link("libcuda.so.550.90.07"),
}
GPU = [{"name": "NVIDIA GeForce RTX 3090", "cc": (8, 6), "memory": 25769803776}]
LIBCUDA = ("int cuDriverGetVersion(int *v) {{ *v = 12040; return 0; }}\n"
           "int cuInit(unsigned int flags) {{ return {rc}; }}\n"
           "int cuGetErrorName(int e, const char **s) {{ *s = \"{name}\"; return 0; }}\n")
BASE = ("os: Ubuntu 22.04.4 LTS; Linux 6.5.0-41-generic x86_64\n"
        "driver: {{version: 550.90.07, gpu_count: 1, cuinit: {{code: {code}, name: {name}}}}}\n"
        "gpus: [{{index: 0, name: NVIDIA GeForce RTX 3090}}]\n")


def _probe(tmp_path, source: str | None):
    host = fakes.make_host(tmp_path, files=DRIVER,
                           nvml=lambda: fakes.FakeNvml("550.90.07", 12040, GPU))
    if source is not None and fakes.compile_lib(
            host.path("/usr/lib/x86_64-linux-gnu/libcuda.so.550.90.07"), source) is None:
        pytest.skip("no C compiler to build a stand-in libcuda")
    return probe_driver(host, LD)


def test_the_probe_records_cuinit_beside_nvml(tmp_path):
    out = _probe(tmp_path / "a", LIBCUDA.format(rc=999, name="CUDA_ERROR_UNKNOWN"))
    assert out.driver["cuinit"] == {"code": 999, "name": "CUDA_ERROR_UNKNOWN"}
    assert len(out.gpus) == 1 and out.driver["version"] == "550.90.07"
    out = _probe(tmp_path / "b", LIBCUDA.format(rc=0, name="CUDA_SUCCESS"))
    assert out.driver["cuinit"] == {"code": 0, "name": "CUDA_SUCCESS"}
    # a libcuda that cannot be asked costs nothing here: no field, no note
    out = _probe(tmp_path / "c", fakes.FAKE_LIBCUDA.format(version=12040))  # no cuInit
    assert "cuinit" not in out.driver and out.notes == []
    out = _probe(tmp_path / "d", None)  # not a library at all
    assert "cuinit" not in out.driver and out.notes == []


def test_999_with_gpus_listed_is_nvidia_uvm_after_a_suspend(tmp_path):
    d = doctor(tmp_path, BASE.format(code=999, name="CUDA_ERROR_UNKNOWN")
               + "frameworks: {torch: {version: 2.5.1+cu124, cuda_available: false}}\n")
    [f] = d.of("cuda-init", "driver")
    assert f["severity"] == "error" and d.code == 1
    assert f["message"].startswith("cuInit fails with CUDA_ERROR_UNKNOWN (999) although the "
                                   "driver lists 1 GPU")
    assert "nvidia_uvm" in f["message"] and "suspend" in f["message"]
    assert "`sudo rmmod nvidia_uvm && sudo modprobe nvidia_uvm`" in f["fix"]
    assert "NVreg_PreserveVideoMemoryAllocations=1" in f["fix"]
    assert "nvidia-resume.service" in f["fix"]
    assert "powermanagement.html" in f["source"] and "pop-os/default-settings#64" in f["source"]
    assert d.of("cuda-unavailable") == []  # the cause is named: no 'no cause' warning


def test_only_where_the_driver_lists_gpus_and_on_native_linux(tmp_path):
    ok = BASE.format(code=0, name="CUDA_SUCCESS")
    assert doctor(tmp_path, ok).of("cuda-init") == []
    no_gpu = ("driver: {version: 550.90.07, gpu_count: 0, cuinit: {code: 999}}\n")
    assert doctor(tmp_path, no_gpu).of("cuda-init") == []
    wsl = BASE.format(code=999, name="CUDA_ERROR_UNKNOWN").replace(
        "Linux 6.5.0-41-generic", "Linux 5.15.153.1-microsoft-standard-WSL2")
    assert doctor(tmp_path, wsl).of("cuda-init") == []


def test_another_cuinit_failure_is_said_when_nothing_else_explains_it(tmp_path):
    d = doctor(tmp_path, BASE.format(code=100, name="CUDA_ERROR_NO_DEVICE"))
    [f] = d.of("cuda-init", "driver")
    assert f["severity"] == "warning"
    assert "cuInit fails with CUDA_ERROR_NO_DEVICE (100)" in f["message"]
    assert "nvidia_uvm" not in f["message"]
    # a driver error above already says why: nothing more
    d = doctor(tmp_path, BASE.format(code=100, name="CUDA_ERROR_NO_DEVICE").replace(
        "{index: 0, name: NVIDIA GeForce RTX 3090}", "{index: 0, name: B200}"))
    assert d.of("cuda-init") == [] and d.of("driver-too-old")
