"""A GPU's compute mode (exclusive-process: one process at a time; prohibited: none), through
the real `dnnctl doctor --from`."""

from __future__ import annotations

from _doctor_helpers import doctor

V100 = "Tesla V100-SXM2-16GB"


def test_exclusive_process_is_a_warning_with_the_per_process_and_admin_fixes(tmp_path):
    """iffiX/machin#25: several processes on cuda:0 of a GPU in exclusive mode."""
    d = doctor(tmp_path, "driver: {version: 535.183.01}\n"
               f"gpus: [{{index: 0, name: {V100}, compute_mode: Exclusive_Process}}]\n")
    [f] = d.of("compute-mode", "gpu")
    assert f["severity"] == "warning" and d.data["verdict"] == "warn"
    assert f["message"].startswith(f"GPU 0 ({V100}) is in the exclusive-process compute mode: "
                                   "one process at a time can hold a CUDA context on it")
    assert "'all CUDA-capable devices are busy or unavailable'" in f["message"]
    assert "`sudo nvidia-smi -i 0 -c DEFAULT`" in f["fix"]
    assert "CUDA_VISIBLE_DEVICES" in f["fix"] and "nvidia-cuda-mps-control -d" in f["fix"]
    assert "Compute Modes" in f["source"] and "machin#25" in f["source"]
    assert "(compute mode exclusive process)" in d.text


def test_prohibited_is_an_error_and_default_is_silent(tmp_path):
    d = doctor(tmp_path, "driver: {version: 535.183.01}\ngpus:\n"
               f"  - {{index: 0, name: {V100}, compute_mode: default}}\n"
               f"  - {{index: 3, name: {V100}, compute_mode: 2}}\n")
    [f] = d.of("compute-mode", "gpu")
    assert f["severity"] == "error" and d.code == 1
    assert f["message"].startswith(f"GPU 3 ({V100}) is in the prohibited compute mode")
    assert "`sudo nvidia-smi -i 3 -c DEFAULT`" in f["fix"]


def test_unknown_mode_says_nothing(tmp_path):
    d = doctor(tmp_path, f"driver: {{version: 535.183.01}}\ngpus: [{{name: {V100}}}]\n")
    assert d.of("compute-mode") == []
