"""vLLM against the torch beside it: each vLLM wheel is built for one torch."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor

from dnnctl.compat.matrix import load_matrix
from dnnctl.compat.versions import VersionRange

SNAP = """
frameworks:
  torch: {version: "%s"}
packages: {vllm: "%s", torch: "%s"}
"""


def _run(tmp_path: Path, vllm: str, torch: str):
    return doctor(tmp_path, SNAP % (torch, vllm, torch))


def test_vllm_0_2_2_with_torch_2_0_1_is_an_error_fixed_by_its_torch(tmp_path: Path) -> None:
    d = _run(tmp_path, "0.2.2+cu118", "2.0.1+cu118")  # vllm-project/vllm#1807
    [f] = d.of("build-mismatch", "vllm")
    assert f["severity"] == "error" and d.data["verdict"] == "fail"
    assert "undefined symbol" in f["message"] and "torch>=2.1.0" in f["message"]
    commands = d.text.split("commands (one per line):")[1]
    assert "pip install torch==2.1.0 --index-url https://download.pytorch.org/whl/cu118" \
        in commands
    assert "vllm>=0.2.1,<0.2.2" in f["fix"]  # the release built for torch 2.0.1
    assert "vllm#1807" in f["source"] and "compat/pins.yaml" in f["source"]


def test_an_exact_pin_of_another_line_is_an_error(tmp_path: Path) -> None:
    d = _run(tmp_path, "0.6.4.post1", "2.6.0+cu124")  # pins torch==2.5.1
    [f] = d.of("build-mismatch", "vllm")
    assert f["severity"] == "error" and f["evidence"]["torch_required"] == "==2.5.1"
    assert "pip install torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124" in d.text
    assert "vllm>=0.8.0,<0.9.0" in f["fix"]


def test_another_patch_of_the_pinned_line_warns(tmp_path: Path) -> None:
    d = _run(tmp_path, "0.3.0", "2.1.1")  # pins torch==2.1.2
    [f] = d.of("build-mismatch", "vllm")
    assert f["severity"] == "warning" and "same torch line" in f["message"]


def test_the_pinned_torch_passes(tmp_path: Path) -> None:
    for vllm, torch in (("0.6.4", "2.5.1+cu124"), ("0.2.2", "2.1.0"), ("0.2.4", "2.1.1+cu121"),
                        ("0.10.1.1", "2.7.1"), ("0.20.1", "2.11.0")):
        assert not _run(tmp_path, vllm, torch).of("build-mismatch"), (vllm, torch)


def test_a_floor_release_is_judged_against_the_line_it_was_built_with(tmp_path: Path) -> None:
    # 0.2.0 requires torch>=2.0.0 but its wheel was built with torch 2.0.x
    f = _run(tmp_path, "0.2.0", "2.1.0").of("build-mismatch", "vllm")
    assert f and f[0]["severity"] == "error"


def test_a_vllm_release_without_a_row_is_not_judged(tmp_path: Path) -> None:
    d = _run(tmp_path, "0.1.2", "2.0.1")  # a source distribution only
    assert not d.of("build-mismatch")
    assert d.of("not-judged", "vllm")


def test_vllm_rows_tile_the_releases() -> None:
    rows = sorted(load_matrix().rows("vllm_torch"),
                  key=lambda r: VersionRange.parse(r["vllm"]).lowest())
    for a, b in zip(rows, rows[1:]):
        assert VersionRange.parse(a["vllm"]).upper() == VersionRange.parse(b["vllm"]).lowest()
    for r in rows:
        floor = r["torch"].startswith(">=")
        assert floor == bool(r.get("built_line")), r.where
