"""doctor --error TEXT / --error-file LOG and the snapshot's ``errors``: the typer command, the
fast path, --save, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dnnctl.cli.app import app
from dnnctl.doctor.envfile import load_env, parse_env
from dnnctl.errors import InputFileError

REPO = Path(__file__).resolve().parents[2]
SNAP = ("schema: dnnctl-env/1\nos: Windows 11\ngpus: [{name: NVIDIA GeForce RTX 4080}]\n"
        "frameworks: {torch: {version: 2.3.0+cu121}}\n")
NCCL = "RuntimeError: Distributed package doesn't have NCCL built in"


def _snap(tmp_path: Path, text: str = SNAP) -> Path:
    p = tmp_path / "env.yaml"
    p.write_text(text)
    return p


def _json(args: list[str]) -> dict:
    res = CliRunner().invoke(app, ["doctor", *args, "--json"])
    assert res.exit_code in (0, 1), res.output
    return json.loads(res.stdout)


def _errors(data: dict) -> list[dict]:
    return [f for f in data["findings"] if f["component"] == "errors"]


def test_error_option_judges_the_message_against_the_snapshot(tmp_path):
    data = _json(["--from", str(_snap(tmp_path)), "--error", NCCL])
    [f] = _errors(data)
    assert f["code"] == "error-message" and f["evidence"]["error_row"] == "nccl-not-built"
    # torch's Windows finding says "if this program uses NCCL": the message shows it does
    assert f["severity"] == "error" and 'backend="gloo"' in f["fix"]
    assert f["evidence"]["confirms"] == ["platform-unsupported (torch)"]
    assert "the message confirms the condition of [platform-unsupported] under torch" \
        in f["message"]
    assert data["env"]["errors"] == [NCCL] and data["verdict"] == "fail"


def test_error_option_adds_to_the_snapshots_own_errors_once(tmp_path):
    snap = _snap(tmp_path, SNAP + f'errors: ["{NCCL}", "CUDA error: out of memory"]\n')
    data = _json(["--from", str(snap), "--error", NCCL, "--error", "Segmentation fault"])
    assert data["env"]["errors"] == [NCCL, "CUDA error: out of memory", "Segmentation fault"]
    rows = [f["evidence"].get("error_row", f["code"]) for f in _errors(data)]
    assert rows == ["nccl-not-built", "cuda-out-of-memory", "not-judged"]


def test_error_file_keeps_the_lines_the_catalogue_recognizes(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(b"epoch 1 loss 0.3\nWARNING: bad\xff byte\n"
                    b"Traceback (most recent call last):\n  File \"x.py\", line 3\n"
                    + NCCL.encode() + b"\n" + NCCL.encode() + b"\n")
    data = _json(["--from", str(_snap(tmp_path)), "--error-file", str(log)])
    assert data["env"]["errors"] == [NCCL]
    [f] = _errors(data)
    assert f["evidence"]["error_row"] == "nccl-not-built"


def test_error_file_without_a_known_line_reports_its_last_error_line(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("starting\nERROR: the widget failed to frobnicate\nexiting\n")
    data = _json(["--from", str(_snap(tmp_path)), "--error-file", str(log)])
    [f] = _errors(data)
    assert f["code"] == "not-judged" and "the widget failed to frobnicate" in f["message"]
    quiet = tmp_path / "quiet.log"
    quiet.write_text("all good\n")
    data = _json(["--from", str(_snap(tmp_path)), "--error-file", str(quiet)])
    assert _errors(data) == [] and data["env"]["notes"] == [
        "--error-file quiet.log: no line reads like an error"]


def test_error_file_that_cannot_be_read_exits_2(tmp_path):
    res = CliRunner().invoke(app, ["doctor", "--from", str(_snap(tmp_path)),
                                   "--error-file", str(tmp_path / "missing.log")])
    assert res.exit_code == 2 and "missing.log: cannot read" in res.output
    res = CliRunner().invoke(app, ["doctor", "--from", str(_snap(tmp_path)),
                                   "--error-file", str(tmp_path)])
    assert res.exit_code == 2 and "not a regular file" in res.output


def test_save_keeps_the_errors_and_from_judges_them_again(tmp_path):
    saved = tmp_path / "saved.yaml"
    first = _json(["--from", str(_snap(tmp_path)), "--error", NCCL, "--save", str(saved)])
    assert load_env(saved).errors == [NCCL]
    again = _json(["--from", str(saved)])
    assert _errors(again) == _errors(first)


def test_the_fast_path_gives_what_typer_gives(tmp_path):
    snap = _snap(tmp_path)
    args = ["doctor", "--from", str(snap), "--error", NCCL, "--error=CUDA error: out of memory",
            "--json"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "dnnctl", *args], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 1, p.stderr
    fast = json.loads(p.stdout)
    slow = json.loads(CliRunner().invoke(app, args).stdout)
    assert fast["findings"] == slow["findings"] and len(_errors(fast)) == 2


def test_the_human_report_shows_the_messages_in_80_columns(tmp_path):
    res = CliRunner().invoke(app, ["doctor", "--from", str(_snap(tmp_path)), "--error", NCCL],
                             env={"COLUMNS": "80"})
    assert res.exit_code == 1
    lines = res.output.splitlines()
    assert max(len(x.rstrip()) for x in lines) <= 80
    [head] = [x for x in lines if x.startswith("✗ errors")]
    assert "'RuntimeError: Distributed package" in head


@pytest.mark.parametrize(("text", "problem"), [
    ("errors: {a: x}", "expected a list"),
    ("errors: [{message: x}]", "expected a single value"),
    ("errors: [" + "x" * 9000 + "]", "longer than 8192"),
])
def test_bad_errors_fields_are_named(text, problem):
    with pytest.raises(InputFileError, match=problem) as exc:
        parse_env(text)
    assert "errors" in str(exc.value.where)


def test_errors_load_as_text_exactly():
    env = parse_env('errors: ["a: b", 12, "  spaced  "]\n')
    assert env.errors == ["a: b", "12", "  spaced  "]
    assert parse_env('errors: "one message"\n').errors == ["one message"]  # a list of one
