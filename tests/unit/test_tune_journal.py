"""The tuning journal: durable appends, torn last lines, resume checks."""

from __future__ import annotations

import json

import pytest
from _plan_helpers import conv

from dnnctl.errors import UsageError
from dnnctl.plan.schema import Timing
from dnnctl.tune.candidates import Candidate
from dnnctl.tune.journal import Journal, problem_id, read_journal
from dnnctl.tune.results import Result
from dnnctl.tune.select import Retimed

HEADER = {"device": {"backend": "numpy", "name": "cpu"}, "kernels_digest": "sha256:x",
          "policy": {"budget_ms": 20.0}, "deterministic": False}
A = Candidate.of("im2col_gemm", {"chunk": 0})
B = Candidate.of("direct", {"order": "tap"})


def _fill(path) -> None:
    j = Journal(path)
    j.start(HEADER, resume=False)
    j.result(conv(), Result(A, "ok", Timing(10.0, 9.0, 11.0, 30), 1e-7, 64, "", 0.5), 0)
    j.result(conv(), Result(B, "crashed", detail="killed by SIGSEGV"), 0)
    j.retime(conv(), {A: Retimed(A, Timing(10.5, 10.0, 11.0, 90), (10.4, 10.5, 10.9))})
    j.done(conv(n=4), {"status": "unplanned", "detail": "x"})
    j.close()


def test_records_read_back(tmp_path):
    path = tmp_path / "plan.yaml.journal"
    _fill(path)
    state = read_journal(path)
    assert state.header["schema"] == "dnnctl-journal/1" and state.torn_lines == 0
    log = state.problems[problem_id(conv())]
    assert log.results[A].timing == Timing(10.0, 9.0, 11.0, 30)
    assert log.results[A].workspace_bytes == 64 and log.results[B].status == "crashed"
    assert log.retimed[A].round_medians == (10.4, 10.5, 10.9)
    assert state.problems[problem_id(conv(n=4))].done["status"] == "unplanned"
    for line in path.read_text().splitlines():
        json.loads(line)  # one JSON object per line


def test_torn_last_line_is_ignored_and_resume_appends_cleanly(tmp_path):
    path = tmp_path / "j"
    _fill(path)
    with open(path, "a") as fh:
        fh.write('{"type": "result", "problem": "conv2d{\\"n\\"')  # kill -9 mid-write
    state = read_journal(path)
    assert state.torn_lines == 1 and len(state.problems[problem_id(conv())].results) == 2
    j = Journal(path)
    resumed = j.start(HEADER, resume=True)
    assert len(resumed.problems[problem_id(conv())].results) == 2
    j.result(conv(n=8), Result(A, "oom", detail="too big"), 0)
    j.close()
    again = read_journal(path)
    assert again.torn_lines == 1  # the torn line stays torn, the new record parses
    assert again.problems[problem_id(conv(n=8))].results[A].status == "oom"


def test_resume_refuses_a_journal_from_another_device_or_setting(tmp_path):
    path = tmp_path / "j"
    _fill(path)
    for change, words in (({"device": {"backend": "numpy", "name": "other"}}, "another device"),
                          ({"kernels_digest": "sha256:y"}, "other kernels"),
                          ({"policy": {"budget_ms": 5.0}}, "timing settings")):
        with pytest.raises(UsageError, match=words):
            Journal(path).start({**HEADER, **change}, resume=True)
    fresh = Journal(path).start({**HEADER, "kernels_digest": "sha256:y"}, resume=False)
    assert fresh.problems == {}
    assert read_journal(path).header["kernels_digest"] == "sha256:y"
