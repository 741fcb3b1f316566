"""Commands that write a file (plan merge / report, workload from-onnx, doctor --save) never
replace a directory, one of their own inputs, or a file of another kind."""

from __future__ import annotations

import pytest

from dnnctl.errors import InputFileError
from dnnctl.files.yamlio import check_replaceable, write_atomic

PLAN = '# dnnctl plan\nschema: "dnnctl-plan/1"\nsections: []\n'
WORKLOAD = "schema: dnnctl-workload/1\nname: w\nproblems: []\n"


def test_a_file_of_the_same_kind_an_empty_file_or_none_may_be_replaced(tmp_path):
    (tmp_path / "p.yaml").write_text(PLAN)
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "r.html").write_text("<!DOCTYPE html><html></html>")
    check_replaceable(tmp_path / "p.yaml", "dnnctl-plan")
    check_replaceable(tmp_path / "empty.yaml", "dnnctl-plan")
    check_replaceable(tmp_path / "new.yaml", "dnnctl-plan")
    check_replaceable(tmp_path / "r.html", "html")


@pytest.mark.parametrize("case", ["directory", "input", "other_kind", "binary", "html"])
def test_what_must_not_be_replaced(tmp_path, case):
    target = tmp_path / "out"
    inputs = ()
    if case == "directory":
        target.mkdir()
    elif case == "input":
        target.write_text(PLAN)
        inputs = (tmp_path / "out",)
    elif case == "other_kind":
        target.write_text(WORKLOAD)
    elif case == "binary":
        target.write_bytes(b"\x08ONNX\x00\x01\x02")
    else:
        target.write_text(PLAN)
    kind = "html" if case == "html" else "dnnctl-plan"
    before = None if case == "directory" else target.read_bytes()
    with pytest.raises(InputFileError):
        check_replaceable(target, kind, inputs)
    if before is not None:
        assert target.read_bytes() == before


def test_write_atomic_onto_a_directory_is_a_clear_error(tmp_path):
    with pytest.raises(InputFileError, match="is a directory"):
        write_atomic(tmp_path, "x")


def test_cli_plan_report_onto_its_own_plan_keeps_the_plan(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from dnnctl.cli.app import app

    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    result = CliRunner().invoke(app, ["plan", "report", str(plan), "-o", str(plan)])
    assert result.exit_code == 2, result.output
    assert plan.read_text() == PLAN


def test_a_budget_cut_retune_keeps_the_complete_entries(tmp_path):
    """A re-tune whose --budget ran out before a problem's search finished (partial entry)
    leaves the complete entry of an earlier run in place, and a run that planned nothing
    leaves the section's date and settings alone."""
    import dataclasses

    from dnnctl import api
    from dnnctl.plan import read_plan
    from dnnctl.tune.report import ProblemOutcome
    from dnnctl.tune.timer import TimingPolicy
    from dnnctl.tune.tuner import TuneOptions, _write_plan

    wl = tmp_path / "w.yaml"
    wl.write_text("schema: dnnctl-workload/1\nname: w\nproblems:\n"
                  "- {op: softmax, key: {cols: 10, dtype: float32, log: false, rows: 8}}\n")
    out = tmp_path / "plan.yaml"
    api.tune(str(wl), options=TuneOptions(device="cpu", output=str(out)))
    plan = read_plan(out)
    sec = plan.sections[0]
    full = sec.entries[0]
    assert not full.partial
    partial = dataclasses.replace(full, partial=True, compared=1, tried=1)
    outcome = ProblemOutcome(full.problem, 1, "planned", partial, partial=True)
    opts = TuneOptions(budget_s=0.5)
    notes = _write_plan(out, [outcome], sec.device, sec.kernels_digest,
                        TimingPolicy.for_backend("numpy"), opts)
    after = read_plan(out).sections[0]
    assert after.entries[0].tried == full.tried and not after.entries[0].partial
    assert any("kept 1 complete entry" in n for n in notes)
    assert after.created == sec.created and after.tuning == sec.tuning


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="no FIFOs here")
def test_reading_a_fifo_is_refused_not_blocked_on(tmp_path):
    import os

    from dnnctl.files.yamlio import load_yaml

    fifo = tmp_path / "p.yaml"
    os.mkfifo(fifo)
    with pytest.raises(InputFileError, match="not a regular file"):
        load_yaml(fifo)
    with pytest.raises(InputFileError, match="is a directory"):
        load_yaml(tmp_path)


def test_pin_parameters_without_a_variant_are_refused(tmp_path):
    from dnnctl import api
    from dnnctl.errors import UsageError

    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    with pytest.raises(UsageError, match="--variant"):
        api.plan_pin(plan, "softmax", "cols=10,rows=8,dtype=float32,log=false",
                     params="chunk_rows=16")
    assert plan.read_text() == PLAN
