"""Fermi GPUs (compute capability 2.x; compat/gpus_legacy.yaml): the toolkits that dropped
sm_2x are named with the release to install, and drivers past R390 with their last branch."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor

FERMI = 'gpus: [{name: NVIDIA GeForce GT 625M, compute_capability: "2.1"}]\n'


def test_a_fermi_gpu_has_an_architecture_row(tmp_path: Path) -> None:
    d = doctor(tmp_path, FERMI)
    assert not d.of("unknown-version") and "compute capability 2.1 (Fermi)" in d.text


def test_a_toolkit_past_cuda_8_gets_the_last_one_that_targets_sm_2x(tmp_path: Path) -> None:
    d = doctor(tmp_path, FERMI + "cuda_runtimes: [{version: '9.1', "
               "source: 'system:/usr/local/cuda-9.1'}]\n")
    [f] = d.of("cuda-mismatch", "cuda")
    assert f["fix"].startswith("use a CUDA toolkit >= 3.0 and <= 8.0: "
                               "`sudo apt-get install cuda-toolkit-8-0`")
    assert "\nsudo apt-get install cuda-toolkit-8-0\n" in d.text


def test_the_toolkit_named_runs_on_the_driver_here(tmp_path: Path) -> None:
    # a GTX 1070 (sm_61) on driver 390.48: the newest toolkit that targets it and that this
    # driver runs is CUDA 9.1 (390.46), not the newest that targets sm_61
    d = doctor(tmp_path, 'driver: {version: "390.48"}\ngpus: [{name: GeForce GTX 1070}]\n'
               "cuda_runtimes: [{version: '7.5', source: 'system:/usr/local/cuda'}]\n")
    assert "`sudo apt-get install cuda-toolkit-9-1`" in d.of("cuda-mismatch", "cuda")[0]["fix"]


def test_fermi_past_its_last_driver_branch_and_without_torch_code(tmp_path: Path) -> None:
    d = doctor(tmp_path, FERMI + 'driver: {version: "418.39"}\n')
    [f] = d.of("arch-unsupported", "driver")
    assert "R390 was the last branch" in f["message"]
    d = doctor(tmp_path, FERMI + 'driver: {version: "390.48"}\n'
               'frameworks: {torch: {version: "1.4.0", cuda: "10.1"}}\n')
    assert d.code == 1 and d.of("arch-unsupported", "torch")
