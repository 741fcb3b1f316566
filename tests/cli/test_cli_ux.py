"""The CLI for people and scripts: 80 columns with commands kept whole, closed pipes, NO_COLOR
and non-TTY output, tune progress (ETA; JSON lines on stderr), names users type."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dnnctl.cli.app import app
from dnnctl.workloads import Workload, write_workload

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
COLOR = re.compile(r"\x1b\[[0-9;]*3[0-9]m|\x1b\[[0-9;]*38;")  # foreground colour codes


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    full.pop("COLUMNS", None)
    return subprocess.run([sys.executable, "-m", "dnnctl", *args], capture_output=True,
                          text=True, env=full, timeout=120)


@pytest.mark.parametrize("args", [
    ["compat", "check", "--gpu", "B200", "--driver", "550.54.15", "--torch", "2.2.0+cu121"],
    ["compat", "suggest", "--gpu", "RTX 5090", "--framework", "torch"],
    ["compat", "show", "gpus", "--filter", "H200"],
    ["kernels", "list"],
    ["kernels", "list", "--op", "gelu"],
])
def test_human_output_fits_80_columns_and_commands_stay_whole(args):
    res = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert res.exit_code in (0, 1), res.output
    lines = res.stdout.splitlines()
    too_wide = [line for line in lines if len(line.rstrip()) > 80]
    assert not too_wide, too_wide
    for line in lines:  # an install command is never cut by a table cell or a wrap
        if "pip install" in line:
            assert re.fullmatch(r"pip install '[^']+'( --index-url https://\S+)?", line), line


def test_suggest_lists_each_install_command_whole_in_its_own_block():
    res = runner.invoke(app, ["compat", "suggest", "--gpu", "RTX 5090", "--framework",
                              "torch"], env={"COLUMNS": "80"})
    out = res.stdout
    block = out.split("commands (one per line):", 1)[1].splitlines()
    first = re.fullmatch(r"# \[1\] torch (2\.\d+)\.\* (cu\d+)", block[1])
    assert first, block[1]  # the newest build for the GPU, from the matrix
    version, tag = first.groups()
    assert block[2] == (f"pip install 'torch=={version}.*' --index-url "
                        f"https://download.pytorch.org/whl/{tag}")


def test_writing_to_a_closed_pipe_ends_quietly_with_0():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "dnnctl", "kernels", "list"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # like `| head` that has already exited
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and err == b""


def test_non_tty_output_has_no_escape_codes_and_no_color_is_respected():
    check = ("compat", "check", "--gpu", "B200", "--driver", "550.54.15")
    plain = _run(*check)
    assert "\x1b[" not in plain.stdout and "driver-too-old" in plain.stdout
    forced = _run(*check, FORCE_COLOR="1")
    assert COLOR.search(forced.stdout), "FORCE_COLOR should colour (the check can fail)"
    no_color = _run(*check, FORCE_COLOR="1", NO_COLOR="1")
    assert not COLOR.search(no_color.stdout) and "driver-too-old" in no_color.stdout


def test_kernels_list_names_the_op_of_a_function_and_explains_empty_filters():
    res = runner.invoke(app, ["kernels", "list", "--op", "gelu"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    assert "'gelu' is not an op: it is activation fn=gelu" in res.stdout
    assert "exact_grid" in res.stdout
    res = runner.invoke(app, ["kernels", "list", "--backend", "cuda", "--json"])
    data = json.loads(res.stdout)
    assert {v["backend"] for v in data["variants"]} == {"cupy"}
    res = runner.invoke(app, ["kernels", "list", "--backend", "tpu"])
    assert res.exit_code == 2 and "unknown backend 'tpu'" in res.stderr


def test_empty_filter_says_why():
    from dnnctl import api

    data = api.kernels_listing("softmax", "numpy")
    assert data["variants"] and data["why_empty"] is None
    # a plugin op with numpy variants only, asked for cupy ones
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests/unit")]),
               DNNCTL_PLUGINS="_tune_plugin")
    res = subprocess.run([sys.executable, "-m", "dnnctl", "kernels", "list", "--op",
                          "toy_scale", "--backend", "cupy"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 1
    assert "no kernels match: toy_scale has no cupy variants (it has numpy ones)" in \
        " ".join(res.stdout.split())


def _two_problems(tmp_path: Path) -> Path:
    wl = Workload("two")
    wl.add("softmax", {"rows": 32, "cols": 64, "dtype": "float32"})
    wl.add("layer_norm", {"rows": 16, "cols": 48, "dtype": "float32"})
    path = tmp_path / "w.yaml"
    write_workload(wl, path)
    return path


TUNE = ["--device", "cpu", "--max-evals", "2", "--sample-ms", "2"]


def test_tune_json_progress_is_one_object_per_line_on_stderr(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["tune", str(_two_problems(tmp_path)), *TUNE, "--json"])
    assert res.exit_code == 0, res.output
    events = [json.loads(line) for line in res.stderr.splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "finish"
    assert kinds.count("problem") == 2 and kinds.count("problem_done") == 2
    cands = [e for e in events if e["event"] == "candidate"]
    assert cands and all("eta_s" in e and e["result"]["status"] for e in cands)
    first_done = next(e for e in events if e["event"] == "problem_done")
    assert first_done["op"] == "softmax" and first_done["eta_s"] > 0
    assert json.loads(res.stdout)["schema"] == "dnnctl-tune/1"  # stdout: the report only


def test_tune_progress_in_a_log_shows_each_problem_with_an_eta(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["tune", str(_two_problems(tmp_path)), *TUNE],
                        env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert max(len(ln) for ln in res.stderr.splitlines()) <= 80
    lines: list[str] = []
    for ln in res.stderr.splitlines():  # a problem's line, wrapped at 80 columns
        if ln.startswith("["):
            lines.append(ln)
        elif lines:
            lines[-1] += " " + ln.strip()
    assert lines[0].startswith("[1/2] softmax") and re.search(r"; ETA \d+:\d\d$", lines[0])
    assert lines[1].startswith("[2/2] layer_norm") and "ETA" not in lines[1]


@pytest.mark.parametrize("args", [["doctor", "--bogus", "--json"],
                                  ["tune", "--budget", "-1", "--json"],
                                  ["plan", "show", "--json"]])
def test_usage_errors_are_json_under_json(args):
    """click's own usage errors (unknown flag, bad value, missing argument) printed a box
    on stderr and nothing on stdout under --json; now the same {"error": ...} object."""
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    err = json.loads(result.stdout)["error"]
    assert err["code"] == "usage" and err["message"]


def test_kernels_list_error_is_json_under_json():
    result = CliRunner().invoke(app, ["kernels", "list", "--op", "foo", "--json"])
    assert result.exit_code == 2
    assert "unknown op" in json.loads(result.stdout)["error"]["message"]
