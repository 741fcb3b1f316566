"""cuDNN 7 (CUDA 9.x / 10.x builds) and cuDNN 8 for CUDA 10.2 have rows (the cuDNN support
matrices of 7.6.0, 7.6.4, 8.0.3, 8.2.2 and 8.4.0): a framework built with them is judged
against the GPU instead of `unknown-version`."""

from __future__ import annotations

from pathlib import Path

from dnnctl.compat.matrix import load_matrix
from dnnctl.compat.versions import Version
from tests.unit._doctor_helpers import doctor

TORCH = """
driver: {version: "%s"}
gpus: [{name: %s}]
frameworks:
  torch: {version: "%s", cuda: "%s", cudnn: "%s"}
"""


def test_rows_cover_cudnn_7_and_8_for_cuda_9_and_10() -> None:
    m = load_matrix()
    for cudnn, major in (("7.5.1", 9), ("7.6.5", 10), ("7.4.2", 10), ("8.2.1", 10)):
        assert m.cudnn_rows(Version.parse(cudnn), major), (cudnn, major)
    # 7.0-7.3.0 were not read: still no row (never guessed)
    assert not m.cudnn_rows(Version.parse("7.0.5"), 9)
    # no cuDNN 8.5+ build for CUDA 10.x is listed
    assert not m.cudnn_rows(Version.parse("8.6.0"), 10)


def test_torch_11_cu90_cudnn_751_on_pascal_has_no_unknown_cudnn(tmp_path: Path) -> None:
    d = doctor(tmp_path, TORCH % ("384.130", "GeForce GTX 1080", "1.1.0", "9.0.176", "7.5.1"))
    assert not [f for f in d.of("unknown-version") if "cuDNN" in f["message"]]
    assert "cudnn-mismatch" not in d.codes()


def test_cudnn_7_has_no_ampere_kernels(tmp_path: Path) -> None:
    # cuDNN 7.6 lists Kepler ... Turing (7.5): no cubin of major 8 runs an A100
    # (TensorFlow 2.1: CUDA 10.1, cuDNN 7.6; its row has no arch list, so cuDNN is judged)
    d = doctor(tmp_path, """
driver: {version: "450.80.02"}
gpus: [{name: NVIDIA A100-SXM4-40GB}]
frameworks:
  tensorflow: {version: "2.1.0"}
""")
    msgs = [f["message"] for f in d.of("cudnn-mismatch")]
    assert any("7.6" in m and "sm_80" in m for m in msgs), d.text
    assert not [f for f in d.of("unknown-version") if "cuDNN" in f["message"]]


def test_cudnn_7_built_for_cuda_10_runs_turing(tmp_path: Path) -> None:
    d = doctor(tmp_path, TORCH % ("418.39", "GeForce RTX 2080 Ti", "1.1.0", "10.0.130", "7.5.1"))
    assert not [f for f in d.of("cudnn-mismatch") if "sm_75" in f["message"]]
    assert not [f for f in d.of("unknown-version") if "cuDNN" in f["message"]]


def test_cudnn_8_for_cuda_102_supports_kepler_30(tmp_path: Path) -> None:
    # "SM 3.0 and later" for the CUDA 10.2 builds of cuDNN 8.0-8.4
    m = load_matrix()
    [row] = m.cudnn_rows(Version.parse("8.2.1"), 10)
    assert "3.0" in row["cc"] and "8.0" not in row["cc"]
