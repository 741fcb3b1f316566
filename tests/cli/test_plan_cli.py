"""``dnnctl plan show | validate | diff | merge | coverage | pin`` through the CLI, on real
plans (numpy conv2d entries for this machine) built in memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dnnctl.backends.registry import get_backend
from dnnctl.cli.app import app
from dnnctl.ops import registry
from dnnctl.ops.base import Choice
from dnnctl.plan import Plan, PlanEntry, Section, Timing, kernels_digest, read_plan, write_plan
from dnnctl.workloads import Workload, write_workload

runner = CliRunner()
BASE = {"n": 2, "c": 16, "h": 12, "w": 12, "k": 16, "r": 3, "s": 3, "pad": 1,
        "dtype": "float32", "layout": "NCHW"}


def conv(**kw):
    return registry.get_op("conv2d").problem({**BASE, **kw})


def entry(problem, variant, params, median, pinned=False):
    return PlanEntry(problem, Choice.of(variant, params), Timing(median, median - 1,
                                                                 median + 1, 40),
                     tried=5, pinned=pinned)


def section(entries, **dev):
    fp = get_backend("numpy").device(0).fingerprint()
    fp.update(dev)
    return Section(fp, kernels_digest(), "2026-01-01T00:00:00Z", {"strategy": "exhaustive"},
                   entries)


def plan_file(tmp_path: Path, name: str, *sections: Section) -> Path:
    path = tmp_path / name
    write_plan(Plan(list(sections)), path)
    return path


def cli(*args):
    res = runner.invoke(app, ["plan", *map(str, args)], env={"COLUMNS": "250"})
    return res, " ".join(res.output.split())


@pytest.fixture
def a(tmp_path):
    return plan_file(tmp_path, "a.yaml", section([
        entry(conv(), "im2col_gemm", {"chunk": 0}, 100.0),
        entry(conv(n=8), "direct", {"order": "tap"}, 300.0),
        entry(conv(groups=16), "direct", {"order": "image"}, 50.0)]))


@pytest.fixture
def b(tmp_path):
    return plan_file(tmp_path, "b.yaml", section([
        entry(conv(), "direct", {"order": "tap"}, 90.0),  # re-chosen
        entry(conv(groups=16), "direct", {"order": "image"}, 70.0),  # re-timed
        entry(conv(n=4), "fft", {"size": "fast"}, 200.0)]))  # added; n=8 removed


def test_show_and_validate(a):
    res, text = cli("show", a)
    assert res.exit_code == 0, res.output
    assert "this machine" in text and "im2col_gemm(chunk=0)" in text and "100.0 us" in text
    res, _ = cli("show", a, "--json", "--op", "conv2d")
    info = json.loads(res.stdout)
    assert info["sections"][0]["this_machine"] is True
    assert [e["choice"] for e in info["sections"][0]["entries"]][0] == "im2col_gemm(chunk=0)"
    res, text = cli("validate", a)
    assert res.exit_code == 0 and "is a valid dnnctl-plan/1" in text and "3 entries" in text


def test_validate_rejects_a_hostile_plan_with_exit_2(tmp_path, a):
    bad = tmp_path / "bad.yaml"
    text = a.read_text()
    assert '"variant": "direct", "params": {"order": "tap"}' in text
    bad.write_text(text.replace('"variant": "direct", "params": {"order": "tap"}',
                                '"variant": "direct", "params": {"order": "spiral"}'))
    res, text = cli("validate", bad)
    assert res.exit_code == 2
    assert "bad.yaml" in text and "entry 1" in text and "choice.params.order" in text
    res, _ = cli("validate", bad, "--json")
    assert json.loads(res.stdout)["error"]["code"] == "bad-plan"
    evil = tmp_path / "evil.yaml"
    evil.write_text("!!python/object/apply:os.system ['true']\n")
    res, text = cli("show", evil)
    assert res.exit_code == 2 and "tag" in text


def test_diff(a, b):
    res, text = cli("diff", a, b)
    assert res.exit_code == 0, res.output
    assert "+ conv2d" in text and "fft(size=fast)" in text
    assert "- conv2d" in text and "n=8" in text
    assert "~ conv2d" in text and "im2col_gemm(chunk=0) 100.0 us -> direct(order=tap)" in text
    res, _ = cli("diff", a, b, "--json")
    d = json.loads(res.stdout)["sections"][0]
    assert [len(d[k]) for k in ("added", "removed", "changed", "retimed")] == [1, 1, 1, 1]
    assert cli("diff", a, b, "--exit-code")[0].exit_code == 1
    res, text = cli("diff", a, a, "--exit-code")
    assert res.exit_code == 0 and "plans are identical" in text


def test_merge_adds_devices_and_resolves_conflicts(tmp_path, a, b):
    other = plan_file(tmp_path, "other.yaml", section(
        [entry(conv(), "fft", {"size": "exact"}, 10.0)], name="Other CPU"))
    out = tmp_path / "c.yaml"
    res, text = cli("merge", a, other, "-o", out)
    assert res.exit_code == 0 and "2 section(s)" in text
    assert [s.device["name"] for s in read_plan(out).sections][1] == "Other CPU"
    res, text = cli("merge", a, b, "-o", out, "--json")
    m = json.loads(res.stdout)
    assert m["entries"] == 4 and m["conflicts"][0]["kept"] == "b"  # b's choice is faster
    merged = read_plan(out).sections[0]
    assert merged.find(conv()).choice.variant == "direct"
    assert merged.find(conv(groups=16)).stats.median_us == 50.0  # same choice: A kept
    res, _ = cli("merge", a, b, "-o", out, "--prefer", "a", "--json")
    assert json.loads(res.stdout)["conflicts"][0]["kept"] == "a"


def test_merge_refuses_conflicting_pins(tmp_path):
    p1 = plan_file(tmp_path, "p1.yaml", section([entry(conv(), "fft", {"size": "fast"}, 9.0,
                                                       pinned=True)]))
    p2 = plan_file(tmp_path, "p2.yaml", section([entry(conv(), "direct", {"order": "tap"},
                                                       5.0, pinned=True)]))
    res, text = cli("merge", p1, p2, "-o", tmp_path / "m.yaml")
    assert res.exit_code == 2 and "both plans pin" in text and "--prefer" in text
    res, _ = cli("merge", p1, p2, "-o", tmp_path / "m.yaml", "--prefer", "b")
    assert res.exit_code == 0
    assert read_plan(tmp_path / "m.yaml").sections[0].entries[0].choice.variant == "direct"


def test_coverage(tmp_path, a):
    wl = Workload("app")
    wl.add(conv(), count=3)  # exact
    wl.add(conv(n=16), count=1)  # nearest: the n=8 entry
    wl.add(conv(dtype="float16"), count=1)  # nothing of that dtype: default heuristic
    wl_path = tmp_path / "app.yaml"
    write_workload(wl, wl_path)
    res, text = cli("coverage", a, wl_path)
    assert res.exit_code == 0, res.output
    assert "1 hit, 1 fallback, 1 miss" in text and "60% exact" in text and "80% planned" in text
    res, _ = cli("coverage", a, wl_path, "--json")
    rows = {r["outcome"]: r for r in json.loads(res.stdout)["problems"]}
    assert rows["fallback"]["choice"] == "direct(order=tap)"
    assert rows["fallback"]["from_key"]["n"] == 8 and rows["miss"]["choice"] is None
    assert cli("coverage", a, wl_path, "--fail-under", "90")[0].exit_code == 1
    res, text = cli("coverage", a, "resnet50", "--batch", "2")  # bundled workload, by name
    assert res.exit_code == 0 and "miss" in text


def test_pin_unpin_and_choose(tmp_path, a):
    key = "n=2,c=16,h=12,w=12,k=16,r=3,s=3,pad=1,dtype=float32,layout=NCHW"
    res, text = cli("pin", a, "--op", "conv2d", "--key", key)
    assert res.exit_code == 0 and "pinned conv2d" in text
    assert read_plan(a).sections[0].find(conv()).pinned
    res, text = cli("pin", a, "--op", "conv2d", "--key", key, "--variant", "fft", "--param",
                    "size=exact")
    assert res.exit_code == 0, res.output
    e = read_plan(a).sections[0].find(conv())
    assert e.choice == Choice.of("fft", {"size": "exact"}) and e.pinned and e.stats is None
    res, _ = cli("pin", a, "--op", "conv2d", "--key", key.replace("n=2", "n=3"), "--variant",
                 "direct", "--param", "order=tap", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["changed"][0]["pinned"] is True
    assert len(read_plan(a).sections[0].entries) == 4  # a new pinned entry
    res, _ = cli("pin", a, "--all", "--unpin", "--json")
    assert len(json.loads(res.stdout)["changed"]) == 2
    assert not any(e.pinned for e in read_plan(a).sections[0].entries)


@pytest.mark.parametrize("args,words", [
    (["--op", "conv2d", "--key", "n=9,c=16,h=12,w=12,k=16,r=3,s=3,dtype=float32,layout=NCHW"],
     "no entry for"),
    (["--op", "conv2d", "--key", "n=2,c=16,h=12,w=12,k=16,r=3,s=3,pad=1,dtype=float32,"
      "layout=NCHW", "--variant", "winograd9"], "unknown variant 'winograd9'"),
    (["--op", "conv2d", "--key", "n=2,c=16,h=12,w=12,k=16,r=3,s=3,pad=1,dtype=float32,"
      "layout=NCHW", "--variant", "fft", "--param", "size=huge"], "is not one of"),
    ([], "either --op/--key for one entry or --all"),
    (["--all", "--section", "4"], "--section 4 does not exist"),
])
def test_pin_usage_errors(a, args, words):
    before = a.read_text()
    res, text = cli("pin", a, *args)
    assert res.exit_code == 2, res.output
    assert words in text
    assert a.read_text() == before
