"""A conda pytorch build for CUDA X.Y needs the env's cudatoolkit X.Y; that fix comes before a
driver upgrade when the driver runs X.Y (pytorch/pytorch#11138)."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor

CASE = ("os: Ubuntu 18.04\npython: '3.6'\ndriver: {present: true, version: '390'}\n"
        "frameworks:\n  torch: {version: 0.4.1, cuda: '9.0', "
        "source: 'conda (build py36_cuda9.0.176_cudnn7.1.2_1)'}\n")


def test_cuda90_build_with_cudatoolkit_92_asks_for_cudatoolkit_90(tmp_path: Path) -> None:
    d = doctor(tmp_path, CASE + "cuda_runtimes: [{version: '9.2', source: conda:cudatoolkit}]\n"
               "packages: {pytorch: 0.4.1, cudatoolkit: '9.2'}\n")
    [f] = d.of("cuda-mismatch", "torch")
    assert f["severity"] == "error" and "cudatoolkit is 9.2" in f["message"]
    assert "conda install pytorch=0.4.1 cudatoolkit=9.0 -c pytorch" in f["fix"]
    assert "driver R390 runs CUDA 9.0" in f["fix"]  # every driver of the 390 branch
    assert "pytorch/pytorch#11138" in f["source"] and "previous-versions" in f["source"]
    [old] = d.of("driver-too-old", "cuda")  # the driver upgrade is offered second
    assert old["fix"].startswith("`conda install pytorch=0.4.1 cudatoolkit=9.0")
    assert old["fix"].index("cudatoolkit=9.0") < old["fix"].index("396.26")


def test_matching_cudatoolkit_or_none_listed_says_nothing(tmp_path: Path) -> None:
    same = doctor(tmp_path, CASE + "packages: {pytorch: 0.4.1, cudatoolkit: '9.0'}\n")
    assert not same.of("cuda-mismatch", "torch")
    absent = doctor(tmp_path, CASE + "packages: {pytorch: 0.4.1}\n")
    assert not absent.of("cuda-mismatch", "torch")


def test_a_pip_torch_is_not_judged_against_a_conda_cudatoolkit(tmp_path: Path) -> None:
    d = doctor(tmp_path, "driver: {present: true, version: '535.54.03'}\nframeworks:\n"
               "  torch: {version: 1.12.1+cu113, cuda: '11.3', source: pip}\n"
               "packages: {torch: 1.12.1+cu113, cudatoolkit: '11.6'}\n")
    assert not d.of("cuda-mismatch", "torch")
