"""The Python version against the wheels of the framework release (each torch / TensorFlow
row's python range, from the release's own compatibility table)."""

from __future__ import annotations

import re
from pathlib import Path

from _doctor_helpers import doctor

from dnnctl.compat.matrix import load_matrix
from dnnctl.compat.versions import VersionRange


def test_tensorflow_28_has_no_wheel_for_python_313(tmp_path: Path) -> None:
    # tensorflow/tensorflow#85298: 'There was no python [3].13 at the time of tensorflow 2.8'
    got = doctor(tmp_path, "os: Windows 10\npython: '3.13'\nframeworks: {tensorflow: "
                 "{version: '2.8'}}\n")
    [f] = got.of("python-version", "tensorflow")
    assert f["severity"] == "error" and "from versions: none" in f["message"]
    assert f["evidence"] == {"python": "3.13", "supported": ">=3.7, <3.11"}
    assert ">=3.7, <3.11" in f["fix"] and "WSL2" in f["fix"]  # 2.20 is CPU-only on Windows
    assert 'pip install "tensorflow==2.20.*"' in got.text
    # a Python inside the range is not a finding
    ok = doctor(tmp_path, "python: '3.10'\nframeworks: {tensorflow: {version: '2.8'}}\n")
    assert not ok.of("python-version")


def test_torch_release_and_python(tmp_path: Path) -> None:
    gpu = "gpus: [{name: NVIDIA A100-SXM4-80GB}]\ndriver: {version: 570.124.06}\n"
    got = doctor(tmp_path, gpu + "python: '3.12.3'\nframeworks: {torch: {version: "
                 "2.1.2+cu121}}\n")
    [f] = got.of("python-version", "torch")
    assert f["evidence"]["python"] == "3.12" and "download.pytorch.org" in f["fix"]
    assert not doctor(tmp_path, gpu + "python: '3.11'\nframeworks: {torch: {version: "
                      "2.1.2+cu121}}\n").of("python-version")
    # no python given: nothing said
    assert not doctor(tmp_path, gpu + "frameworks: {torch: {version: 2.1.2+cu121}}\n"
                      ).of("python-version")


# pytorch/pytorch#112478 (audit 12, case 11): `pip install torch` on Python 3.12.0, Windows, on
# the day torch 2.1.0 was the newest release: 'there are no binary builds for Python-3.12 yet'
CASE11 = "os: Windows\npython: 3.12.0\nframeworks:\n  torch: {version: 2.1.0}\n"


def _torch_lines(text: str) -> list[str]:
    """The release lines of every torch the text tells to install."""
    return re.findall(r"[\"']torch==(\d+\.\d+)\.\*[\"']", text)


def _python_range(line: str) -> VersionRange:
    return VersionRange.parse(load_matrix().torch_rows(line)[0]["python"])


def test_the_range_is_the_release_s_whatever_the_build(tmp_path: Path) -> None:
    got = doctor(tmp_path, CASE11)  # an untagged Windows wheel: PyPI's CPU build
    [f] = got.of("python-version", "torch")
    assert f["severity"] == "error" and got.code == 1
    assert f["evidence"] == {"python": "3.12", "supported": ">=3.8, <3.12"}
    for name in ("2.1.0+cpu", "2.1.0+cu118", "2.1.0+cu121"):  # every wheel of the release
        d = doctor(tmp_path, f"python: '3.12'\nframeworks: {{torch: {{version: {name}}}}}\n")
        assert d.of("python-version", "torch"), name
    # a source or vendor build and a nightly are not the release's wheels: not judged so
    for name in ("2.1.0a0+32f93b1", "2.1.0.dev20230801+cu121"):
        d = doctor(tmp_path, f"python: '3.12'\nframeworks: {{torch: {{version: '{name}'}}}}\n")
        assert not d.of("python-version"), name
    conda = doctor(tmp_path, "python: '3.12'\nframeworks: {torch: {version: 2.1.0, "
                   "installer: conda}}\n")
    assert not conda.of("python-version")


def test_every_torch_the_fixes_name_installs_on_this_python(tmp_path: Path) -> None:
    got = doctor(tmp_path, CASE11)
    lines = _torch_lines(got.fixes)
    assert lines and "2.1" not in lines
    assert all(_python_range(line).contains("3.12") for line in lines), lines
    # with a GPU and driver known, the fix also has code for the GPU and runs on the driver
    gpu = doctor(tmp_path, CASE11 + "gpus: [{name: NVIDIA GeForce GTX 1080}]\n"
                 "driver: {version: '537.13'}\n")
    lines = _torch_lines(gpu.fixes)
    assert lines and all(_python_range(line).contains("3.12") for line in lines), lines
    assert "cu118" in gpu.fixes  # Pascal: the CUDA 11.8 wheels have sm_61 code
    assert not any(f["code"] == "arch-unsupported" and f["severity"] == "error"
                   for f in gpu.findings)
    # a CUDA build of a release this Python has: the same line is kept
    ok = doctor(tmp_path, CASE11.replace("3.12.0", "3.11.4"))
    # the CPU-only torch with no GPU in view is an ok finding, which carries no fix
    assert not ok.of("python-version") and _torch_lines(ok.fixes) == []


def test_releases_before_1_13_have_their_range(tmp_path: Path) -> None:
    # pytorch/pytorch#67669: torch 1.9 has no wheel for Python 3.10 (vision README: 1.9 is
    # '>=3.6, <=3.9'); 1.2 had Python 2.7 wheels, and none for 3.4
    got = doctor(tmp_path, "python: '3.10'\nframeworks: {torch: {version: 1.9.1+cu111}}\n")
    [f] = got.of("python-version", "torch")
    assert f["evidence"]["supported"] == ">=3.6, <3.10"
    assert "vision README" in f["source"]
    assert not doctor(tmp_path, "python: '2.7.18'\nframeworks: {torch: {version: 1.2.0}}\n"
                      ).of("python-version")
    assert doctor(tmp_path, "python: '3.4'\nframeworks: {torch: {version: 1.2.0}}\n"
                  ).of("python-version")
