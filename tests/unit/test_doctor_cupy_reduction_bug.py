"""CuPy 13.0.0 cannot JIT reduction kernels below compute capability 7.0 (cupy/cupy#8184,
fixed in 13.1.0): an error on a pre-Volta GPU, a warning with the GPU unknown, nothing on a
newer GPU or another release."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor


def _bug(d):  # noqa: ANN001, ANN202
    return [f for f in d.of("arch-unsupported", "cupy") if "sm_70" in f["message"]]


def test_pascal_gpu_with_cupy_13_0_0_is_an_error_with_the_upgrade(tmp_path: Path) -> None:
    d = doctor(tmp_path, """
gpus: [{name: Tesla P100-PCIE-16GB}]
driver: {version: "535.104.05"}
cuda_runtimes: [{version: "12.2", source: "system:/usr/local/cuda"}]
packages: {cupy-cuda12x: "13.0.0"}
""")
    (f,) = _bug(d)
    assert f["severity"] == "error"
    assert "sm_60" in f["message"] and "13.0.0" in f["message"]
    assert "pip install -U 'cupy-cuda12x>=13.1.0'" in f["fix"]
    assert d.data["verdict"] == "fail"


def test_gpu_unknown_warns_and_names_the_fixed_release(tmp_path: Path) -> None:
    d = doctor(tmp_path, """
frameworks:
  cupy: {version: "13.0.0", package: cupy-cuda11x}
""")
    (f,) = _bug(d)
    assert f["severity"] == "warning"
    assert f["evidence"]["fixed_in"] == "13.1.0"
    assert "cupy-cuda11x>=13.1.0" in f["fix"]


def test_volta_gpu_and_fixed_release_are_not_flagged(tmp_path: Path) -> None:
    volta = doctor(tmp_path, """
gpus: [{name: Tesla V100-SXM2-16GB}]
packages: {cupy-cuda12x: "13.0.0"}
""")
    assert not _bug(volta)
    fixed = doctor(tmp_path, """
gpus: [{name: Tesla P100-PCIE-16GB}]
packages: {cupy-cuda12x: "13.1.0"}
""")
    assert not _bug(fixed)
    unknown = doctor(tmp_path, """
packages: {cupy-cuda12x: null}
""")
    assert not _bug(unknown)
