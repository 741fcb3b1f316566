"""The CLI's shared formats and error edge, the workload options object and the ETA model."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from dnnctl import api
from dnnctl.cli.render import (
    emit,
    error_status,
    fmt_eta,
    fmt_us,
    fmt_x,
    key_text,
    short_problem,
)
from dnnctl.errors import ExitCode, UsageError
from dnnctl.ops import registry
from dnnctl.tune.eta import Eta, track
from dnnctl.workloads import WorkloadOptions, short_key


def test_times_speedups_and_eta_read_as_people_read_them():
    assert fmt_us(12.345) == "12.3 us"
    assert fmt_us(4560.0) == "4.56 ms"
    assert fmt_us(None) == "—"
    assert fmt_x(1.234) == "1.23x"
    assert fmt_x(None) == "—" and fmt_x(0.0) == "—"
    assert fmt_eta(None) == "ETA --"
    assert fmt_eta(75.4) == "ETA 1:15"
    assert fmt_eta(3 * 3600 + 62) == "ETA 3:01:02"


def test_short_key_leaves_out_defaults_and_names_dtype_and_layout_bare():
    p = registry.get_op("conv2d").problem({"n": 1, "c": 8, "h": 8, "w": 8, "k": 4, "r": 3,
                                           "s": 3, "dtype": "float32", "layout": "NCHW",
                                           "stride": (2, 2)})
    text = short_key(p)
    assert text.split() == ["c=8", "float32", "h=8", "k=4", "NCHW", "n=1", "r=3", "s=3",
                            "stride=2x2", "w=8"]  # padding / dilation / groups at defaults
    assert short_problem(p) == f"conv2d {text}"
    mm = {"m": 64, "n": 32, "k": 16, "dtype": "float16"}
    assert key_text("matmul", mm) == "float16 k=16 m=64 n=32"
    assert key_text("matmul", {**mm, "trans_a": True}) == "float16 k=16 m=64 n=32 trans_a=True"


def test_emit_prints_json_of_objects_with_to_dict_or_renders(capsys):
    report = SimpleNamespace(to_dict=lambda: {"verdict": "pass", "n": (1, 2)})
    emit(report, True, lambda *_: pytest.fail("rendered in --json mode"))
    assert json.loads(capsys.readouterr().out) == {"verdict": "pass", "n": [1, 2]}
    seen = []
    emit({"a": 1}, False, lambda data, extra: seen.append((data, extra)), "x")
    assert seen == [({"a": 1}, "x")] and capsys.readouterr().out == ""


def test_error_status_renders_once_with_the_exit_code(capsys, monkeypatch):
    monkeypatch.delenv("DNNCTL_DEBUG", raising=False)
    assert error_status(UsageError("bad --x", hint="use --y")) == int(ExitCode.USAGE)
    err = capsys.readouterr().err
    assert "bad --x" in err and "hint: use --y" in err
    assert error_status(UsageError("bad --x"), as_json=True) == int(ExitCode.USAGE)
    assert json.loads(capsys.readouterr().out)["error"]["message"] == "bad --x"
    assert error_status(KeyboardInterrupt()) == int(ExitCode.INTERRUPTED)
    assert error_status(ZeroDivisionError("boom"), as_json=True) == int(ExitCode.FAIL)
    bug = json.loads(capsys.readouterr().out)["error"]
    assert bug["code"] == "internal" and "ZeroDivisionError: boom" in bug["message"]
    monkeypatch.setenv("DNNCTL_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        error_status(ZeroDivisionError("boom"))


def test_workload_options_reach_the_bundled_workload(tmp_path):
    assert WorkloadOptions(batch=8, layout="NHWC").given() == {"batch": 8, "layout": "NHWC"}
    typed = api._given(WorkloadOptions(seq=16))
    assert typed == api._given({"seq": 16, "batch": None}) == {"seq": 16}
    with pytest.raises(UsageError, match="no option 'seq'"):
        api.tune("resnet50", workload_options=WorkloadOptions(seq=16),
                 options=_opts(tmp_path))


def _opts(tmp_path):
    from dnnctl.tune.tuner import TuneOptions

    return TuneOptions(device="cpu", output=tmp_path / "plan.yaml")


def test_eta_counts_candidates_left_over_the_measured_rate():
    eta = Eta()

    def event(kind, **data):
        track(eta, SimpleNamespace(kind=kind, data=data))

    event("start", problems=3)
    assert eta.seconds_left() is None  # nothing measured yet
    event("problem", device=0, candidates=4)
    eta.t0 = time.monotonic() - 2.0  # two candidates took two seconds
    event("candidate", device=0, done=1, total=4)
    event("candidate", device=0, done=2, total=4)
    left = eta.seconds_left()
    # 2 left of this problem + 2 problems x 4 (the mean so far) = 10 candidates at ~1 s each
    assert left is not None and 9.5 < left < 10.5
    assert 4.7 < eta.seconds_left(slots=2) < 5.3
    event("problem_done", device=0)
    assert eta.finished == 1 and eta.finished_candidates == 2 and not eta.current
