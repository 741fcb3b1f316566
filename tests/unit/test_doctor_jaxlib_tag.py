"""jaxlib before the CUDA plugins (before 0.4.13 in the matrix) carried its build in the
version: ``0.3.25+cuda11.cudnn82`` (CUDA 11, built with cuDNN 8.2), ``0.1.68+cuda111``
(CUDA 11.1). With no row, what the version says is still judged; the GPUs are not."""

from __future__ import annotations

from pathlib import Path

from tests.unit._doctor_helpers import doctor

SNAP = """
os: Linux
driver: {version: "%s"}
gpus: [{name: NVIDIA A100-SXM4-40GB}]
%s
%s
"""
CUDNN81 = 'cudnn: [{version: "8.1.1", source: "system:/usr/local/cuda", loaded_first: true}]'


def test_jaxlib_listed_only_in_packages_is_judged(tmp_path: Path) -> None:
    # it used to pass unjudged when the snapshot had no frameworks.jax entry
    d = doctor(tmp_path, SNAP % ("535.54.03", CUDNN81,
                                 'packages: {jax: "0.3.25", jaxlib: "0.3.25+cuda11.cudnn82"}'))
    [f] = d.of("cudnn-shadowed")
    assert "built against cuDNN 8.2" in f["message"] and "8.1.1" in f["message"]
    assert "+cuda11.cudnnXY" in f["fix"] and "jax_cuda_releases.html" in f["fix"]
    [u] = d.of("unknown-version", "jax")
    assert "judged by its version string only (CUDA 11, cuDNN 8.2)" in u["message"]
    assert "0.4.13" in u["message"]
    assert d.data["verdict"] == "fail"


def test_jaxlib_cuda111_needs_a_cuda11_runtime(tmp_path: Path) -> None:
    runtimes = 'cuda_runtimes: [{version: "10.2", source: "system:/usr/local/cuda"}]'
    d = doctor(tmp_path, SNAP % ("535.54.03", runtimes,
                                 'frameworks: {jax: {version: "0.2.17", jaxlib: '
                                 '"0.1.68+cuda111"}}'))
    [f] = d.of("cuda-mismatch", "jax")
    assert "libcudart.so.11" in f["message"]
    assert "CUDA 11.1 runtime libraries" in f["fix"]


def test_jaxlib_cuda102_loads_the_10_2_soname(tmp_path: Path) -> None:
    runtimes = 'cuda_runtimes: [{version: "11.8", source: "system:/usr/local/cuda"}]'
    d = doctor(tmp_path, SNAP % ("535.54.03", runtimes,
                                 'frameworks: {jax: {version: "0.2.10", jaxlib: '
                                 '"0.1.62+cuda102"}}'))
    [f] = d.of("cuda-mismatch", "jax")
    assert "libcudart.so.10.2" in f["message"]


def test_cuda11_build_below_the_major_floor(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % ("440.33.01", "",
                                 'frameworks: {jax: {version: "0.3.25", jaxlib: '
                                 '"0.3.25+cuda11.cudnn82"}}'))
    [f] = d.of("driver-too-old", "jax")
    assert f["severity"] == "warning" and "450.80.02" in f["message"]


def test_a_fitting_old_jaxlib_is_no_error_but_not_a_pass(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % (
        "535.54.03", 'cuda_runtimes: [{version: "11.8", source: "system:/usr/local/cuda"}]\n'
        'cudnn: [{version: "8.6.0", source: "system:/usr/local/cuda", loaded_first: true}]',
        'frameworks: {jax: {version: "0.3.25", jaxlib: "0.3.25+cuda11.cudnn82"}}'))
    assert {f["code"] for f in d.findings if f["severity"] == "error"} == set()
    assert d.codes("jax") == {"unknown-version"}
    assert d.data["verdict"] == "warn"
