"""A GPU that drives a display runs kernels under the watchdog: the snapshot's watchdog /
display_active fields, NVML's display state, and the rule through `dnnctl doctor --from`."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor, probe_fakes

from dnnctl.doctor.probe_driver import probe_driver

fakes = probe_fakes()


def test_watchdog_on_is_a_warning_with_the_display_fixes(tmp_path):
    """numba/numba#9381: a GTX 980 driving the desktop, 'Watchdog: Enabled'."""
    d = doctor(tmp_path, "gpus: [{name: NVIDIA GeForce GTX 980, watchdog: true}]\n"
               "driver: {present: true}\npackages: {numba: null}\n")
    [f] = d.of("kernel-timeout", "gpu")
    assert f["severity"] == "warning" and "conditional" not in f["evidence"]
    assert f["message"].startswith("GPU 0 (NVIDIA GeForce GTX 980) runs kernels under the "
                                   "display watchdog")
    assert "CUDA_ERROR_LAUNCH_TIMEOUT" in f["message"]
    assert "`sudo systemctl isolate multi-user.target`" in f["fix"]
    assert "shorter kernel launches" in f["fix"] and "numba#9381" in f["source"]
    assert "(kernel run-time limit)" in d.text


def test_a_display_is_conditional_and_names_the_headless_gpu(tmp_path):
    d = doctor(tmp_path, "gpus:\n  - {index: 0, name: NVIDIA GeForce RTX 3090, "
               "display_active: true}\n  - {index: 1, name: NVIDIA GeForce RTX 3090, "
               "display_active: false}\n")
    [f] = d.of("kernel-timeout")
    assert f["evidence"]["conditional"] is True
    assert f["message"].startswith("GPU 0 (NVIDIA GeForce RTX 3090) drives a display")
    assert f["fix"].startswith("run the long kernels on GPU 1, which drives no display")
    win = doctor(tmp_path, "os: Windows 11\ngpus: [{index: 0, name: NVIDIA GeForce RTX 3090, "
                 "watchdog: true}]\n")
    [f] = win.of("kernel-timeout")
    assert "TdrDelay" in f["fix"] and "`nvidia-smi -i 0 -dm 1`" in f["fix"]
    off = doctor(tmp_path, "gpus: [{name: NVIDIA GeForce RTX 3090, display_active: true, "
                 "watchdog: false}]\n")
    assert off.of("kernel-timeout") == []


def test_nvml_and_nvidia_smi_report_the_display(tmp_path: Path) -> None:
    nvml = fakes.FakeNvml("550.90.07", 12040, [
        {"name": "NVIDIA GeForce GTX 980", "cc": (5, 2), "memory": 4 << 30, "display_active": 1},
        {"name": "NVIDIA GeForce GTX 980", "cc": (5, 2), "memory": 4 << 30}])
    host = fakes.make_host(tmp_path / "nvml", nvml=lambda: nvml)
    assert [g.display_active for g in probe_driver(host, {}).gpus] == [True, None]
    smi = ("0, NVIDIA GeForce GTX 980, 5.2, 4096 MiB, 550.90.07, GPU-1a2b, Default, Enabled\n"
           "1, NVIDIA GeForce GTX 980, 5.2, 4096 MiB, 550.90.07, GPU-3c4d, Default, Disabled\n")
    host = fakes.make_host(tmp_path / "smi", files={
        "/proc/driver/nvidia/version": "NVRM version: NVIDIA UNIX x86_64 Kernel Module  "
        "550.90.07\n", "/dev/nvidia0": None, "/usr/lib/libcuda.so.550.90.07": None,
        "/usr/lib/libcuda.so.1": fakes.Link("libcuda.so.550.90.07"), "/usr/bin/nvidia-smi": ""},
        runner=fakes.FakeRunner(commands={"nvidia-smi": smi}))
    host.path("/usr/bin/nvidia-smi").chmod(0o755)
    gpus = probe_driver(host, {"libcuda.so.1": ["/usr/lib/libcuda.so.1"]}).gpus
    assert [g.display_active for g in gpus] == [True, False]
