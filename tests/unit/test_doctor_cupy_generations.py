"""CuPy releases against the GPU generation: a release whose run-time (NVRTC) kernels are
for an older generation fails on it (table cupy_gpus); the fix names a release that runs."""

from __future__ import annotations

import pytest
from _doctor_helpers import doctor

from dnnctl.compat.matrix import load_matrix
from dnnctl.compat.versions import CC


def _snap(cc: str, name: str, cupy: str, package: str, driver: str = "575.57.08") -> str:
    return (f"driver: {{version: '{driver}'}}\n"
            f"gpus: [{{index: 0, name: {name}, compute_capability: '{cc}'}}]\n"
            f"frameworks: {{cupy: {{version: '{cupy}', package: {package}}}}}\n")


def test_hopper_with_cupy_before_11_3_is_an_error_fixed_by_11_3(tmp_path) -> None:
    d = doctor(tmp_path, _snap("9.0", "NVIDIA H100 80GB HBM3", "11.2.0", "cupy-cuda11x"))
    bad = d.of("arch-unsupported", "cupy")
    assert len(bad) == 1 and bad[0]["severity"] == "error"
    assert "CuPy >= 11.3.0" in bad[0]["message"]
    assert "`pip install -U 'cupy-cuda11x>=11.3.0'`" in bad[0]["fix"]
    assert "nvidia-cuda-nvrtc-cu11>=11.8" in bad[0]["fix"]  # sm_90 needs CUDA 11.8's NVRTC
    assert "#7100" in bad[0]["source"] and d.code == 1


def test_hopper_with_cupy_11_3_passes(tmp_path) -> None:
    d = doctor(tmp_path, _snap("9.0", "NVIDIA H100 80GB HBM3", "11.3.0", "cupy-cuda11x"))
    assert not d.of("arch-unsupported", "cupy")


@pytest.mark.parametrize("cc,name", [("8.9", "NVIDIA GeForce RTX 4090"),
                                     ("8.6", "NVIDIA GeForce RTX 3090")])
def test_ampere_and_ada_run_older_code(tmp_path, cc, name) -> None:
    """sm_86 cubins (CuPy 9.4-11.2) load on 8.9: an older release is no error there."""
    d = doctor(tmp_path, _snap(cc, name, "11.0.0", "cupy-cuda11x"))
    assert not d.of("arch-unsupported", "cupy")


def test_blackwell_with_cupy_before_13_4_names_the_release(tmp_path) -> None:
    d = doctor(tmp_path, _snap("12.0", "NVIDIA GeForce RTX 5090", "13.3.0", "cupy-cuda12x"))
    bad = d.of("arch-unsupported", "cupy")
    assert len(bad) == 1 and "CuPy >= 13.4.0" in bad[0]["message"]
    assert "`pip install -U 'cupy-cuda12x>=13.4.0'`" in bad[0]["fix"]
    assert "nvidia-cuda-nvrtc-cu12>=12.8" in bad[0]["fix"]


def test_blackwell_with_a_cuda11_wheel_moves_to_a_package_the_driver_runs(tmp_path) -> None:
    """cupy-cuda11x can never target 12.0: the fix is another package, one whose CUDA this
    driver (575: CUDA 12.9) runs, so cupy-cuda12x and not cupy-cuda13x."""
    d = doctor(tmp_path, _snap("12.0", "NVIDIA GeForce RTX 5090", "12.0.0", "cupy-cuda11x"))
    bad = d.of("arch-unsupported", "cupy")
    assert bad and bad[0]["fix"].startswith(
        "`pip uninstall -y cupy-cuda11x && pip install 'cupy-cuda12x>=13.4.0'`")


def test_every_generation_row_names_a_known_architecture() -> None:
    m = load_matrix()
    archs = {CC.parse(r["cc"]) for r in m.rows("architectures")}
    rows = m.rows("cupy_gpus")
    assert {"8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "12.0"} <= {c for r in rows for c in r["cc"]}
    assert all(CC.parse(c) in archs for r in rows for c in r["cc"])
    assert m.cupy_gpu(m.arch(CC.parse("9.0")))["first"] == "11.3.0"
