"""Nothing known is not nothing wrong: a CUDA jax whose libraries are absent from the
snapshot is shown as not judged (never "no problem found"), and a CPU-only torch is a warning
when the snapshot shows CUDA is meant to be used (a toolkit, a +cuXXX package)."""

from __future__ import annotations

from pathlib import Path

from tests.unit._doctor_helpers import doctor

JAX = """
gpus: [{name: Tesla V100-SXM2-32GB}]
frameworks:
  jax: {version: "0.4.26", jaxlib: "0.4.26+cuda12.cudnn89", cuda: "12", cudnn: "8.9"}
packages: {jax: "0.4.26", jaxlib: "0.4.26+cuda12.cudnn89"%s}
"""


def test_cuda_jax_without_libraries_is_not_judged(tmp_path: Path) -> None:
    d = doctor(tmp_path, JAX % "")
    [f] = d.of("not-judged", "jax")
    assert 'pip install "jax[cuda12]==0.4.26"' in f["fix"]
    assert not [x for x in d.of("ok", "jax")]
    assert "no problem found" not in d.text
    assert "? jax" in d.text and "PASS for what was judged" in d.text
    assert "1 not judged" in d.text


def test_cuda_jax_with_pip_libraries_is_judged(tmp_path: Path) -> None:
    d = doctor(tmp_path, JAX % ', nvidia-cudnn-cu12: "8.9.2.26"')
    assert not d.of("not-judged")
    assert d.of("ok", "jax") and "not judged" not in d.text


TORCH_CPU = """
os: Windows
%s
frameworks:
  torch: {version: "2.1.2+cpu"}
packages: {torch: "2.1.2+cpu"%s}
"""


def test_cpu_torch_beside_a_cuda_toolkit_is_a_warning(tmp_path: Path) -> None:
    d = doctor(tmp_path, TORCH_CPU % ('cuda_runtimes: [{version: "12.2.79", source: '
                                      '"system:CUDA_PATH"}]', ""))
    [f] = d.of("cuda-mismatch", "torch")
    assert f["severity"] == "warning"
    assert "CUDA 12.2.79" in f["message"]
    assert "torch==2.1.*' --index-url https://download.pytorch.org/whl/cu121" in f["fix"]


def test_cpu_torch_beside_a_cu_package_is_a_warning(tmp_path: Path) -> None:
    d = doctor(tmp_path, TORCH_CPU % ("", ', xformers: "0.0.23.post1+cu121"'))
    [f] = d.of("cuda-mismatch", "torch")
    assert "xformers" in f["message"]


def test_cpu_torch_with_no_cuda_evidence_is_a_note(tmp_path: Path) -> None:
    d = doctor(tmp_path, TORCH_CPU % ("", ""))
    assert "cuda-mismatch" not in d.codes()
    assert any("CPU-only build" in f["message"] for f in d.of("ok", "torch"))
