"""torch's NVRTC (jiterator) on a GPU newer than torch's CUDA targets: CUDA 11.1-11.7 builds
before torch 1.13.0 fail on sm_89 (pytorch/pytorch#87595, fixed by #87611); a build on 11.8,
a release with the cap, or a GPU the NVRTC knows is not flagged."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor


def _nvrtc(d):  # noqa: ANN001, ANN202
    return [f for f in d.of("arch-unsupported", "torch") if "NVRTC" in f["message"]]


ADA = """
gpus: [{name: NVIDIA GeForce RTX 4090}, {name: NVIDIA GeForce RTX 3090}]
driver: {version: "525.60.13"}
frameworks:
  torch: {version: "%s"}
"""


def test_cu116_release_before_the_cap_fails_on_sm_89_only(tmp_path: Path) -> None:
    d = doctor(tmp_path, ADA % "1.12.1+cu116")
    (f,) = _nvrtc(d)
    assert f["severity"] == "error"
    assert "sm_89" in f["message"] and "invalid value for --gpu-architecture" in f["message"]
    assert f["evidence"] == {"torch_cuda": "11.6", "compute_capability": "8.9",
                             "fixed_in": "1.13.0"}
    assert "pip install 'torch==1.13.*' --index-url https://download.pytorch.org/whl/cu116" \
        in f["fix"]
    assert d.data["verdict"] == "fail"


def test_nightly_dates_around_the_fix(tmp_path: Path) -> None:
    before = _nvrtc(doctor(tmp_path, ADA % "1.14.0.dev20221020+cu117"))
    assert [f["severity"] for f in before] == ["error"]
    after = _nvrtc(doctor(tmp_path, ADA % "1.14.0.dev20221101+cu117"))
    assert after == []
    undated = _nvrtc(doctor(tmp_path, """
gpus: [{name: NVIDIA GeForce RTX 4090}]
frameworks:
  torch: {version: "1.14.0", cuda: "11.7"}
"""))
    assert [f["severity"] for f in undated] == ["warning"]
    assert "2022-10-25" in undated[0]["message"]


def test_capped_release_cu118_and_ampere_are_not_flagged(tmp_path: Path) -> None:
    assert _nvrtc(doctor(tmp_path, ADA % "1.13.1+cu117")) == []
    assert _nvrtc(doctor(tmp_path, ADA % "2.0.1+cu118")) == []
    ampere = doctor(tmp_path, """
gpus: [{name: NVIDIA GeForce RTX 3090}]
frameworks:
  torch: {version: "1.12.1+cu116"}
""")
    assert _nvrtc(ampere) == []


def test_cuda_11_0_before_1_7_1_on_sm_86(tmp_path: Path) -> None:
    d = doctor(tmp_path, """
gpus: [{name: NVIDIA GeForce RTX 3080}]
frameworks:
  torch: {version: "1.7.0+cu110"}
""")
    (f,) = _nvrtc(d)
    assert f["evidence"]["fixed_in"] == "1.7.1" and "sm_86" in f["message"]
    assert _nvrtc(doctor(tmp_path, """
gpus: [{name: NVIDIA GeForce RTX 3080}]
frameworks:
  torch: {version: "1.7.1+cu110"}
""")) == []
