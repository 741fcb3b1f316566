"""The GPU table covers NVIDIA's CUDA GPU lists product line by product line, compute
capability 3.0 (Kepler GK10x) included: a listed model is judged, never 'not in the matrix'."""

from __future__ import annotations

import pytest
from _doctor_helpers import doctor

from dnnctl.compat.gpus import resolve_gpu
from dnnctl.compat.matrix import load_matrix


@pytest.mark.parametrize(("name", "cc"), [
    ("Quadro K4000", "3.0"), ("Tesla K10", "3.0"), ("GeForce GTX 680", "3.0"),
    ("Quadro K6000", "3.5"), ("GeForce GTX TITAN Black", "3.5"),
    ("Quadro K2200", "5.0"), ("GeForce GTX 960M", "5.0"), ("NVIDIA NVS 810", "5.0"),
    ("Quadro M2000", "5.2"), ("GeForce GTX 960", "5.2"), ("GeForce GTX 980M", "5.2"),
    ("Quadro GP100", "6.0"), ("Quadro P2200", "6.1"), ("Quadro P400", "6.1"),
    ("NVIDIA T1000", "7.5"), ("NVIDIA T400 4GB", "7.5"),
    ("NVIDIA RTX 4500 Ada Generation", "8.9"), ("NVIDIA RTX 4000 SFF Ada Generation", "8.9"),
    ("NVIDIA RTX PRO 4500 Blackwell Server Edition", "12.0"),
])
def test_listed_models_resolve(name: str, cc: str) -> None:
    gpu = resolve_gpu(load_matrix(), name, None)
    assert gpu.model is not None, name
    assert str(gpu.cc) == cc and gpu.arch is not None


def test_longest_match_keeps_maxwell_titan_x_and_the_server_edition_class() -> None:
    m = load_matrix()
    assert str(resolve_gpu(m, "GeForce GTX TITAN X", None).cc) == "5.2"
    assert resolve_gpu(m, "NVIDIA RTX PRO 4500 Blackwell Server Edition",
                       None).gpu_class == "datacenter"
    assert resolve_gpu(m, "NVIDIA RTX PRO 4500 Blackwell", None).gpu_class == "workstation"


def test_quadro_k4000_is_judged_not_unknown(tmp_path) -> None:
    d = doctor(tmp_path, 'driver: {version: "352.39"}\ngpus: [{name: Quadro K4000}]\n'
               'cuda_runtimes: [{version: "7.5", source: "system:/usr/local/cuda"}]\n')
    assert "unknown-version" not in d.codes()
    ok = [f for f in d.of("ok", "gpu") if "Quadro K4000" in f["message"]]
    assert ok and "3.0 (Kepler)" in ok[0]["message"]
    assert d.data["verdict"] == "pass"


def test_kepler_3_0_is_past_its_last_driver_branch_on_r535(tmp_path) -> None:
    d = doctor(tmp_path, 'driver: {version: "535.54.03"}\ngpus: [{name: Quadro K4000}]\n')
    bad = d.of("arch-unsupported", "driver")
    assert bad and "R470" in bad[0]["message"]


def test_cuda_11_toolkit_cannot_target_compute_capability_3_0(tmp_path) -> None:
    d = doctor(tmp_path, 'driver: {version: "470.82.01"}\ngpus: [{name: GeForce GTX 680}]\n'
               'cuda_runtimes: [{version: "11.4", source: "system:/usr/local/cuda"}]\n')
    warn = d.of("cuda-mismatch", "cuda")
    assert warn and "sm_30" in warn[0]["message"]
    assert "<= 10.2" in warn[0]["fix"]
