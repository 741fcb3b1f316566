"""A JIT compiler's ptxas (``libraries.ptxas``: Triton's bundled copy, the one XLA finds)
assembles only the targets of its CUDA release (triton-lang/triton#1121: Triton 2.0's ptxas
on an RTX 4090, "Value 'sm_89' is not defined for option 'gpu-name'")."""

from __future__ import annotations

from pathlib import Path

from tests.unit._doctor_helpers import doctor

SNAP = """
os: Linux
driver: {version: "550.54.15"}
gpus: [{name: %s}]
libraries:
  ptxas: [{version: "%s", source: "%s"}]
"""


def test_old_triton_ptxas_does_not_know_ada(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % ("NVIDIA GeForce RTX 4090", "11.4.48", "pip:triton"))
    [f] = d.of("arch-unsupported", "ptxas")
    assert f["severity"] == "error"
    assert "sm_89" in f["message"] and "not defined for option 'gpu-name'" in f["message"]
    assert "TRITON_PTXAS_PATH" in f["fix"] and "CUDA >= 11.8" in f["fix"]
    assert d.data["verdict"] == "fail"


def test_ptxas_that_lists_the_gpu_is_fine(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % ("NVIDIA GeForce RTX 4090", "12.1.105", "pip:triton"))
    assert not d.of("arch-unsupported")
    assert any(f["code"] == "ok" and f["component"] == "ptxas" for f in d.findings)


def test_ptxas_12x_before_128_does_not_know_blackwell(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % ("NVIDIA GeForce RTX 5090", "12.4.131",
                                 "pip:nvidia-cuda-nvcc-cu12 (jax)"))
    [f] = d.of("arch-unsupported", "ptxas")
    assert "sm_120" in f["message"]
    assert "nvidia-cuda-nvcc-cu12" in f["fix"] and "CUDA >= 12.8" in f["fix"]


def test_ptxas_13_no_longer_targets_pascal(tmp_path: Path) -> None:
    # CUDA 13.0 dropped the offline compilation of Maxwell, Pascal and Volta
    d = doctor(tmp_path, SNAP % ("NVIDIA GeForce GTX 1080 Ti", "13.0.48", "system:/usr/local/cuda"))
    [f] = d.of("arch-unsupported", "ptxas")
    assert "no longer targets" in f["message"] and "sm_61" in f["message"]


def test_ptxas_of_unknown_version_is_not_judged(tmp_path: Path) -> None:
    d = doctor(tmp_path, """
gpus: [{name: NVIDIA GeForce RTX 4090}]
libraries:
  ptxas: [{source: "pip:triton"}]
""")
    assert not d.of("arch-unsupported")
    assert d.of("not-judged", "ptxas")


def test_ptxas_is_never_a_shadowed_library(tmp_path: Path) -> None:
    d = doctor(tmp_path, """
gpus: [{name: NVIDIA H100 80GB HBM3}]
libraries:
  ptxas:
    - {version: "12.0.76", source: "system:/usr/local/cuda", loaded_first: true}
    - {version: "12.4.131", source: "pip:nvidia-cuda-nvcc-cu12"}
""")
    assert not d.of("library-shadowed")
    assert not d.of("arch-unsupported")
