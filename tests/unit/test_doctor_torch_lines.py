"""torch versions the matrix has no rows for: a nightly judged by the nearest release line's
wheel of its CUDA tag (and said so); a 0.x release by the GPUs its binaries dropped."""

from __future__ import annotations

from pathlib import Path

from tests.unit._doctor_helpers import doctor

SNAP = """
os: Linux
driver: {version: "%s"}
gpus: [{name: %s}]
frameworks:
  torch: %s
"""


def test_a_nightly_of_a_line_never_released_uses_the_next_release(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % ("520.61.05", "NVIDIA GeForce RTX 3090",
                                 '{version: "1.14.0.dev20221020", cuda: "11.7"}'))
    [note] = d.of("not-judged", "torch")
    assert "pre-release (nightly) of torch 1.14" in note["message"]
    assert "cu117 wheel of torch 2.0" in note["message"]
    assert note["evidence"] == {"line": "2.0", "variant": "cu117"}
    assert not d.of("unknown-version")
    assert d.data["verdict"] == "pass"


def test_a_nightly_is_judged_against_the_driver(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % ("418.67", "Tesla V100-SXM2-16GB",
                                 '{version: "1.14.0.dev20221020+cu117"}'))
    assert "driver-too-old" in d.codes("torch") and d.data["verdict"] == "fail"
    assert d.of("not-judged", "torch")


def test_a_release_newer_than_the_matrix_is_still_unknown(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % ("580.65.06", "NVIDIA H100 80GB HBM3",
                                 '{version: "9.1.0", cuda: "13.0"}'))
    assert d.of("unknown-version", "torch")


def test_torch_031_binaries_have_no_sm50(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % ("390.48", "GeForce GTX 960M", '{version: "0.3.1"}'))
    [f] = d.of("arch-unsupported", "torch")
    assert "sm_50" in f["message"] and "0.4.1 added it back" in f["message"]
    assert "TORCH_CUDA_ARCH_LIST=5.0" in f["fix"] and "pytorch/pytorch#4841" in f["source"]
    assert d.data["verdict"] == "fail"
    ok = doctor(tmp_path, SNAP % ("390.48", "GeForce GTX 960M", '{version: "0.4.1"}'))
    assert not ok.of("arch-unsupported")
