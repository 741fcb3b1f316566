"""``dnnctl plan report``: one self-contained HTML file with each problem's figure, PNGs that
decode, the comparison against another plan; real numpy plans written in memory."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from typer.testing import CliRunner  # noqa: E402

from dnnctl.backends.registry import get_backend  # noqa: E402
from dnnctl.cli.app import app  # noqa: E402
from dnnctl.errors import UsageError  # noqa: E402
from dnnctl.ops import registry  # noqa: E402
from dnnctl.ops.base import Choice  # noqa: E402
from dnnctl.plan import Plan, PlanEntry, Section, Timing, kernels_digest, write_plan  # noqa: E402
from dnnctl.plan.report import build_report, entry_row, parse_ceilings  # noqa: E402
from dnnctl.plan.schema import Alternative  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def _entry(op, key, choice, med, default=None, runner=None):
    """choice / default / runner: (variant, params[, median_us])."""
    problem = registry.get_op(op).problem(key)
    return PlanEntry(problem, Choice.of(*choice), Timing(med, med * 0.95, med * 1.1, 50),
                     runner_up=None if runner is None else Alternative(
                         Choice.of(runner[0], runner[1]), runner[2]),
                     default=None if default is None else Alternative(
                         Choice.of(default[0], default[1]), default[2]), tried=4)


def _plan(tmp_path: Path, name: str, scale: float = 1.0) -> Path:
    conv = {"n": 2, "c": 8, "h": 16, "w": 16, "k": 8, "r": 3, "s": 3, "pad": 1,
            "dtype": "float32", "layout": "NCHW"}
    entries = [
        _entry("conv2d", conv, ("im2col_gemm", {"chunk": 0}), 120.0 * scale,
               ("fft", {"size": "fast"}, 300.0), ("direct", {"order": "tap"}, 150.0)),
        _entry("softmax", {"rows": 64, "cols": 100, "dtype": "float32"},
               ("numpy_rows", {"chunk_rows": 16}), 20.0 * scale, ("numpy_whole", {}, 30.0)),
        _entry("matmul", {"m": 64, "n": 64, "k": 64, "dtype": "float32"}, ("numpy", {}),
               15.0, None, ("blocked", {"block": 32}, 30.0))]
    fp = get_backend("numpy").device(0).fingerprint()
    path = tmp_path / name
    write_plan(Plan([Section(fp, kernels_digest(), "2026-12-01T00:00:00Z", {}, entries)]),
               path)
    return path


def _decode_all(html_text: str) -> list[bytes]:
    return [base64.b64decode(b) for b in
            re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html_text)]


def test_html_is_self_contained_with_each_problems_figure_and_the_pngs_decode(tmp_path):
    plan = _plan(tmp_path, "plan.yaml")
    pngs = tmp_path / "png"
    info = build_report(plan, tmp_path / "r.html", png_dir=pngs,
                        ceilings={"gbps": 100.0, "tflops": 1.0})
    text = (tmp_path / "r.html").read_text()
    assert "http://" not in text and "https://" not in text  # nothing fetched to view it
    images = _decode_all(text)
    # speed-up + roofline per section, one candidates figure per problem
    assert len(images) == 2 + 3 == info["sections"][0]["figures"]
    assert all(img.startswith(PNG) for img in images)
    for fig_id in ("s0-speedup", "s0-roofline"):
        assert f'id="{fig_id}"' in text
    assert len(re.findall(r'<figure id="s0-p\d{3}-', text)) == 3
    assert sorted(Path(p).name for p in info["pngs"]) == sorted(
        p.name for p in pngs.iterdir())
    import matplotlib.image as mpimg

    for p in pngs.iterdir():
        assert mpimg.imread(p).shape[0] > 50  # decodes to real pixels


def test_rows_carry_speedups_vendor_and_throughput():
    # in memory: a CUDA plan's matmul entry whose runner-up is cuBLAS
    e = _entry("matmul", {"m": 64, "n": 64, "k": 64, "dtype": "float32"}, ("wgmma", {}),
               15.0, ("mma", {}, 45.0), ("cublas", {}, 30.0))
    row = entry_row(e)
    assert row["x_default"] == pytest.approx(3.0) and row["x_vendor"] == pytest.approx(2.0)
    assert [c["role"] for c in row["candidates"]] == ["winner", "vendor", "default"]
    assert row["tflops"] == pytest.approx(2 * 64**3 / 15e-6 / 1e12, rel=1e-6)


def test_against_shows_what_changed(tmp_path):
    old = _plan(tmp_path, "old.yaml", scale=2.0)
    new = _plan(tmp_path, "new.yaml")
    build_report(new, tmp_path / "r.html", against=old)
    text = (tmp_path / "r.html").read_text()
    assert 'id="s0-against"' in text
    assert "3 problems in both, 0 with another choice" in text


def test_cli_report_and_bad_ceilings(tmp_path):
    plan = _plan(tmp_path, "plan.yaml")
    res = CliRunner().invoke(app, ["plan", "report", str(plan), "-o", str(tmp_path / "r.html"),
                                   "--png", str(tmp_path / "png"), "--json"])
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.output)["pngs"]) == 5
    with pytest.raises(UsageError, match="GBPS,TFLOPS"):
        parse_ceilings("fast")
