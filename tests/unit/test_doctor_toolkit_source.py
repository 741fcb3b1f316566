"""Only ``nvcc:<path>`` and ``system:<toolkit dir>`` mark a CUDA toolkit (README, the
snapshot's fields): a CUDA runtime listed without a source may or may not be one, so what a
toolkit of its release could not do is said as not judged, and no message shows an empty
'()' where the source would be."""

from __future__ import annotations

from pathlib import Path

import pytest
from _doctor_helpers import doctor

# PaddlePaddle/Paddle#56908 (audit 12, case 12), as reported: Windows 11, RTX 2050 (sm_86),
# 'CUDA 10.2', paddlepaddle-gpu of unknown version
CASE12 = ("os: Windows 11\npython: '3.11'\n"
          "gpus: [{name: NVIDIA GeForce RTX 2050, compute_capability: '8.6'}]\n"
          "cuda_runtimes: [{version: '10.2'}]\npackages: {paddlepaddle-gpu: null}\n")


def test_a_runtime_without_source_is_not_taken_for_a_toolkit(tmp_path: Path) -> None:
    got = doctor(tmp_path, CASE12)
    assert not got.of("cuda-mismatch", "cuda")
    [f] = [f for f in got.of("not-judged", "cuda")]
    assert f["severity"] == "info" and "source not given" in f["message"]
    assert "if it is a toolkit" in f["message"] and "sm_86" in f["message"]
    assert "nvcc:<path to nvcc>" in f["fix"] and "apt" not in f["fix"]
    assert "? cuda" in got.text and "✓ cuda" not in got.text


@pytest.mark.parametrize("source", ["pip:nvidia-cuda-runtime-cu11", "system:ldconfig",
                                    "conda:/opt/conda", "env:LD_LIBRARY_PATH"])
def test_runtime_libraries_are_not_toolkits(tmp_path: Path, source: str) -> None:
    got = doctor(tmp_path, CASE12.replace("{version: '10.2'}",
                                          f"{{version: '10.2', source: '{source}'}}"))
    # no toolkit question (with no driver, only the driver question is left open)
    assert not got.of("cuda-mismatch", "cuda") and not [
        f for f in got.of("not-judged", "cuda") if "toolkit" in f["message"]]


@pytest.mark.parametrize("source", ["nvcc:/usr/local/cuda-10.2/bin/nvcc",
                                    "system:/usr/local/cuda-10.2"])
def test_a_toolkit_is_judged(tmp_path: Path, source: str) -> None:
    got = doctor(tmp_path, CASE12.replace("{version: '10.2'}",
                                          f"{{version: '10.2', source: '{source}'}}"))
    [f] = got.of("cuda-mismatch", "cuda")
    assert f"({source})" in f["message"]


SOURCELESS = [
    CASE12,
    "gpus: [{name: NVIDIA GeForce RTX 3090}]\ndriver: {version: '450.80.02'}\n"
    "cuda_runtimes: [{version: '11.8'}, {version: '12.4'}]\n",
    "gpus: [{name: Tesla K80}]\ncuda_runtimes: [{version: '12.0'}]\n"
    "cudnn: [{version: '8.2.0', loaded_first: true}, {version: '8.9.7'}]\n"
    "frameworks: {torch: {version: 2.1.0+cu121}}\n",
    "gpus: [{name: NVIDIA H100 80GB HBM3}]\ndriver: {version: '535.104.05'}\n"
    "cuda_runtimes: [{version: '12.4'}]\nlibraries: {nccl: [{version: 2.18.1, "
    "loaded_first: true}, {version: 2.21.5, source: 'pip:nvidia-nccl-cu12'}], "
    "nvjitlink: [{version: '12.1', loaded_first: true}]}\n"
    "frameworks: {torch: {version: 2.5.1+cu124}}\n",
]


@pytest.mark.parametrize("text", SOURCELESS)
def test_no_empty_parentheses(tmp_path: Path, text: str) -> None:
    got = doctor(tmp_path, text)
    for f in got.findings:
        for part in (f["message"], f["fix"] or ""):
            assert "()" not in part and "( )" not in part, part
