"""A `+cpu` torch is a warning only where the snapshot shows CUDA is meant to be used: a
CUDA-only package (cupy-cuda12x, onnxruntime-gpu, ...) counts, a bare CPU machine does not."""

from __future__ import annotations

from pathlib import Path

import pytest
from _doctor_helpers import doctor

CPU_TORCH = 'frameworks: {torch: {version: "2.2.0+cpu"}}\n'


@pytest.mark.parametrize("package", ["cupy-cuda12x", "onnxruntime-gpu", "jax-cuda12-plugin",
                                     "paddlepaddle-gpu", "pycuda"])
def test_a_cuda_only_package_beside_a_cpu_torch_warns_with_a_cuda_wheel(
        tmp_path: Path, package: str) -> None:
    d = doctor(tmp_path, CPU_TORCH + f'packages: {{torch: "2.2.0+cpu", {package}: "1.0"}}\n')
    [f] = d.of("cuda-mismatch", "torch")
    assert f["severity"] == "warning" and package in f["message"]
    # (the CPU build removed first: pip takes 2.2.0+cpu as meeting torch==2.2.*)
    assert f["fix"] == ("`pip uninstall -y torch`, then `pip install 'torch==2.2.*' "
                        "--index-url https://download.pytorch.org/whl/cu121`")


def test_a_cpu_torch_alone_or_beside_cpu_packages_is_no_warning(tmp_path: Path) -> None:
    for extra in ("", ", onnxruntime: 1.17.0, numpy: 1.26.4"):
        d = doctor(tmp_path, CPU_TORCH + f'packages: {{torch: "2.2.0+cpu"{extra}}}\n')
        assert not d.of("cuda-mismatch", "torch") and d.of("ok", "torch"), extra
