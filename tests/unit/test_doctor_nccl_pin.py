"""The NCCL loaded first against the NCCL the torch wheel pins (torch 2.2: nvidia-nccl-cu12
2.19.3; ncclCommRegister is new in 2.19): older fails at import, unknown is said, not passed."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor

TORCH22 = "os: Linux\nframeworks: {torch: {version: 2.2.0}}\n"


def _nccl(version: str | None, source: str = "env:LD_LIBRARY_PATH",
          path: str = "/opt/nccl/lib/libnccl.so.2") -> str:
    v = f'version: "{version}", ' if version else ""
    return f'libraries: {{nccl: [{{{v}source: "{source}", path: {path}, loaded_first: true}}]}}\n'


def test_an_older_nccl_loaded_first_fails(tmp_path: Path) -> None:
    got = doctor(tmp_path, TORCH22 + _nccl("2.18.1"))
    [f] = got.of("library-shadowed", "nccl")
    assert f["severity"] == "error" and f["evidence"]["pinned"] == "2.19.3"
    assert "remove /opt/nccl/lib from LD_LIBRARY_PATH" in f["fix"]
    assert "torch 2.1, whose wheel pins NCCL 2.18.1" in f["fix"]
    # the pin itself or newer is fine
    assert not doctor(tmp_path, TORCH22 + _nccl("2.21.5")).of("library-shadowed")


def test_an_nccl_of_unknown_version_loaded_first_is_never_a_pass(tmp_path: Path) -> None:
    # pytorch/pytorch#119932: 'undefined symbol: ncclCommRegister' from another package's NCCL
    got = doctor(tmp_path, TORCH22 + _nccl(None, source="another package (not named)",
                                            path="unknown"))
    [f] = got.of("unknown-version", "nccl")
    assert "2.19.3" in f["message"] and "ncclCommRegister" in f["message"]
    assert "✓ nccl" not in got.text and "⚠ nccl" in got.text


def test_torchs_own_copy_first_is_not_judged_here(tmp_path: Path) -> None:
    got = doctor(tmp_path, TORCH22 + _nccl("2.19.3", source="pip:nvidia-nccl-cu12",
                                            path="/site/nvidia/nccl/lib/libnccl.so.2"))
    assert not got.of("library-shadowed") and not got.of("unknown-version", "nccl")
