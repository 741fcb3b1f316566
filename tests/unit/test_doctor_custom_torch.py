"""A torch that is no pytorch.org wheel (an NGC container's ``2.2.0a0+<commit>``, a source
build) is judged by what it reports, never as the PyPI wheel of its line; prebuilt flash-attn
wheels beside it are a build-mismatch risk."""

from __future__ import annotations

from pathlib import Path

from dnnctl.compat.versions import TorchVersion
from tests.unit._doctor_helpers import doctor

SNAP = """
os: "Ubuntu 22.04; container nvcr.io/nvidia/pytorch:23.12-py3"
driver: {version: "545.23.08"}
gpus: [{name: NVIDIA A100-SXM4-80GB}]
frameworks:
  torch: %s
packages: {torch: "2.2.0a0+81ea7a4"%s}
"""


def test_local_tags_that_are_no_wheel_variant_are_custom() -> None:
    for text in ("2.2.0a0+81ea7a4", "2.1.0a0+41361538.nv23.06", "1.6.0a0+b31f58d"):
        assert TorchVersion.parse(text).custom, text
    for text in ("2.2.0+cu121", "2.2.0", "2.4.0+cpu", "2.3.0+rocm6.0", "2.1.0+cpu.cxx11.abi"):
        assert not TorchVersion.parse(text).custom, text


def test_ngc_torch_is_not_judged_as_the_pypi_wheel(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % ('{version: "2.2.0a0+81ea7a4"}', ""))
    torch = [f for f in d.findings if f["component"] == "torch"]
    assert [f["code"] for f in torch] == ["not-judged"]
    assert "custom build" in torch[0]["message"]
    text = " ".join(f["message"] for f in d.findings)
    assert "cu121" not in text and "8.9.2" not in text  # not the PyPI wheel's row


def test_ngc_torch_is_judged_by_the_cuda_it_reports(tmp_path: Path) -> None:
    old_driver = SNAP.replace("545.23.08", "470.82.01")  # CUDA 11.4
    d = doctor(tmp_path, old_driver % ('{version: "2.2.0a0+81ea7a4", cuda: "12.3"}', ""))
    assert "not-judged" in d.codes("torch", info=True)
    assert any("12.3" in f["message"] for f in d.findings if f["severity"] != "info")


def test_prebuilt_flash_attn_beside_a_custom_torch(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % ('{version: "2.2.0a0+81ea7a4"}', ', flash-attn: "2.5.0"'))
    [f] = d.of("build-mismatch", "flash-attn")
    assert f["severity"] == "warning" and "custom build" in f["message"]
    assert "export FLASH_ATTENTION_FORCE_BUILD=TRUE" in f["fix"]
    assert "flash-attention#709" in f["source"]
    commands = d.text.split("commands (one per line):")[1]
    assert "pip install --no-build-isolation --no-cache-dir flash-attn" in commands
    assert d.data["verdict"] == "warn"


def test_flash_attn_built_against_this_very_torch_is_no_risk(tmp_path: Path) -> None:
    built = '  flash-attn: {version: "2.5.0", torch: "2.2.0a0+81ea7a4"}\npackages:'
    d = doctor(tmp_path, SNAP.replace("packages:", built) % ('{version: "2.2.0a0+81ea7a4"}', ""))
    assert not [f for f in d.of("build-mismatch") if "custom build" in f["message"]]
