"""Kepler cc 3.5 (Tesla K20/K40, GTX TITAN Black) and the torch 1.x release binaries: the
builds from 1.3.1 on are made with TORCH_CUDA_ARCH_LIST 3.7;5.0;... (pytorch/builder
2aac90bd), so 1.4-1.12 have no code for sm_35 and 1.3 depends on the point release; an
installed 1.x line is pointed at the newest line that still has sm_35, or a source build."""

from __future__ import annotations

from pathlib import Path

import pytest

from dnnctl.compat.matrix import load_matrix
from dnnctl.compat.suggest import legacy_torch_fix
from dnnctl.compat.versions import CC
from tests.unit._doctor_helpers import doctor

# pyg-team/pytorch_geometric#1106: PyG on a Tesla K40m with torch 1.4 -> "no kernel image is
# available"; the reporter: "DOWNGRADED pytorch 1.2 version will be OK"
K40_TORCH = """
gpus: [{name: "Tesla K40m", compute_capability: "3.5"}]
frameworks:
  torch: {version: "%s"%s}
"""


@pytest.mark.parametrize("version,cuda", [
    ("1.4.0", ""), ("1.5.1", ", cuda: '10.2'"), ("1.7.1", ", cuda: '11.0'"),
    ("1.9.0", ", cuda: '11.1'"), ("1.12.1", ", cuda: '11.3'")])
def test_torch_1x_after_131_has_no_sm35(tmp_path: Path, version: str, cuda: str) -> None:
    d = doctor(tmp_path, K40_TORCH % (version, cuda))
    assert d.data["verdict"] == "fail"
    [f] = d.of("arch-unsupported", "torch")
    assert "sm_35" in f["message"] and "sm_35" not in f["evidence"]["arch_list"]
    assert "2aac90bd" in f["source"]
    assert "torch 1.2" in f["fix"] and "pip install 'torch==1.2.*'" in f["fix"]
    assert 'TORCH_CUDA_ARCH_LIST="3.5"' in f["fix"]
    assert not d.of("ok", "torch")


def test_torch_12_still_has_sm35(tmp_path: Path) -> None:
    d = doctor(tmp_path, K40_TORCH % ("1.2.0", ""))
    assert "arch-unsupported" not in d.codes()
    assert d.data["verdict"] == "pass"
    [ok] = d.of("ok", "torch")
    assert "has code for sm_35" in ok["message"] and "cu100" in ok["message"]


def test_torch_13_depends_on_the_point_release(tmp_path: Path) -> None:
    # 1.3.0 (2019-10-10) was built before the switch, 1.3.1 after: never a pass, never a guess
    d = doctor(tmp_path, K40_TORCH % ("1.3.1", ", cuda: '10.1'"))
    assert d.codes("torch") == {"unknown-version"}
    assert "sm_35" in d.of("unknown-version", "torch")[0]["message"]


def test_k80_keeps_its_code(tmp_path: Path) -> None:
    d = doctor(tmp_path, "gpus: [{name: Tesla K80, compute_capability: '3.7'}]\n"
               "frameworks:\n  torch: {version: '1.8.1', cuda: '10.2'}\n")
    assert "arch-unsupported" not in d.codes()


def test_current_torch_on_sm35_is_not_offered_an_old_line(tmp_path: Path) -> None:
    # a 2.x install is not told to go back to 1.2: only the source build
    d = doctor(tmp_path, K40_TORCH % ("2.1.0", ", cuda: '11.8'"))
    [f] = d.of("arch-unsupported", "torch")
    assert "from source" in f["fix"] and "torch==1.2" not in f["fix"]


def test_no_torch_row_before_13_claims_sm35_after_the_switch() -> None:
    m = load_matrix()
    for row in m.rows("torch"):
        line = tuple(int(x) for x in row["torch"].split("."))
        if (1, 4) <= line < (1, 13):
            assert "sm_35" not in row["arch_list"], row
            assert "sm_35" not in (row.get("arch_uncertain") or []), row
    assert all("sm_35" in r["arch_uncertain"] for r in m.torch_rows("1.3"))


def test_legacy_fix_names_the_newest_line_with_a_cubin() -> None:
    m = load_matrix()
    text = legacy_torch_fix(m, CC.parse("3.5"))
    assert text is not None and text.startswith("torch 1.2,") and "410.48" in text
    assert legacy_torch_fix(m, CC.parse("3.0")) is None  # no 1.x binary has sm_30
    win = legacy_torch_fix(m, CC.parse("3.5"), windows=True)
    assert win is not None and "pip install" not in win and "previous-versions" in win
