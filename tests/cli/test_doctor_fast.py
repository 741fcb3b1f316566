"""The typer-free `dnnctl doctor` path gives exactly what the typer command gives (output and
exit status), and hands everything that is not a plain form back to typer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dnnctl.cli.fast import parse

REPO = Path(__file__).resolve().parents[2]
CASE = REPO / "tests" / "cases" / "nccl-shadow-torch22.yaml"


def _run(argv: list[str], typer_path: bool, cwd: Path) -> tuple[int, str, str]:
    code = ("from dnnctl.cli.app import main; main()" if typer_path
            else "from dnnctl.cli.entry import main; main()")
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "100"}
    p = subprocess.run([sys.executable, "-c", code, "doctor", *argv], capture_output=True,
                       text=True, env=env, cwd=cwd, timeout=120)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    import yaml

    env = yaml.safe_load(CASE.read_text())["env"]
    path = tmp_path / "env.yaml"
    path.write_text(yaml.safe_dump(env))
    return path


@pytest.mark.parametrize("args", [
    ["--from", "{snap}"], ["--from={snap}", "--json"], ["--json", "--strict", "--from", "{snap}"],
    ["--from", "{snap}", "--matrix", "{overlay}"], ["--from", "{tmp}/missing.yaml", "--json"],
    ["--from", "{tmp}"],
])
def test_same_output_and_status_as_typer(args: list[str], snapshot: Path,
                                         tmp_path: Path) -> None:
    overlay = tmp_path / "extra.yaml"
    overlay.write_text("schema: dnnctl-matrix/1\ngpus:\n  - {model: Test GPU, match: ['Test'], "
                       "cc: '9.0', class: datacenter, examples: [Test], source: s, "
                       "certainty: V}\n")
    argv = [a.format(snap=snapshot, overlay=overlay, tmp=tmp_path) for a in args]
    fast, slow = _run(argv, False, tmp_path), _run(argv, True, tmp_path)
    assert fast == slow
    assert fast[0] in (1, 2)


def test_plain_machine_run_matches_typer(tmp_path: Path) -> None:
    fast, slow = _run(["--json"], False, tmp_path), _run(["--json"], True, tmp_path)
    assert fast[0] == slow[0] and fast[1].splitlines()[:3] == slow[1].splitlines()[:3]


@pytest.mark.parametrize("argv", [["-h"], ["--help"], ["--bogus"], ["--from"],
                                  ["--from", "--json"], ["--from="], ["extra"], ["--json=1"]])
def test_anything_else_goes_to_typer(argv: list[str]) -> None:
    assert parse(argv) is None


def test_parse_plain_forms() -> None:
    opts = parse(["--json", "--matrix", "a.yaml", "--matrix=b.yaml", "--save", "s.yaml"])
    assert opts == {"json_out": True, "strict": False, "deep": False, "save": Path("s.yaml"),
                    "from_file": None, "matrix": [Path("a.yaml"), Path("b.yaml")],
                    "timings": False, "deep_timeout": None, "errors": [], "error_files": []}
    opts = parse(["--deep", "--deep-timeout", "120", "--timings"])
    assert (opts["deep"], opts["deep_timeout"], opts["timings"]) == (True, "120", True)
    opts = parse(["--error", "CUDA error: out of memory", "--error=x y", "--error-file", "a.log"])
    assert opts["errors"] == ["CUDA error: out of memory", "x y"]  # text, never a Path
    assert opts["error_files"] == [Path("a.log")]


@pytest.mark.parametrize("value", ["0", "-3", "abc", "nan", "1e9"])
def test_bad_deep_timeout_is_a_usage_error_both_ways(value: str, tmp_path: Path) -> None:
    fast = _run(["--deep", "--deep-timeout", value], False, tmp_path)
    slow = _run(["--deep", "--deep-timeout", value], True, tmp_path)
    assert fast[0] == slow[0] == 2, (fast, slow)
    assert "--deep-timeout" in fast[2]


def test_timings_breakdown_on_stderr_and_in_json(tmp_path: Path) -> None:
    import json

    code, out, err = _run(["--json", "--timings"], False, tmp_path)
    spans = json.loads(out)["timings"]
    for step in ("detect (all probes)", "probe: Python packages (dist-info)",
                 "probe: driver and GPUs", "judge (rules)"):
        assert isinstance(spans[step], float) and spans[step] >= 0, (step, spans)
    assert "timings (wall ms" in err and "total: exec to end of output" in err
    assert max(len(line) for line in err.splitlines()) <= 80
    env = {**os.environ, "PYTHONPATH": str(REPO), "DNNCTL_PROFILE": "1"}
    p = subprocess.run([sys.executable, "-m", "dnnctl", "doctor"], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=120)
    assert "probe: driver and GPUs" in p.stderr and "timings" not in p.stdout
    code2, out2, err2 = _run(["--json"], False, tmp_path)
    assert "timings" not in json.loads(out2) and "timings" not in err2


def test_usage_error_still_exits_2(tmp_path: Path) -> None:
    code, _, err = _run(["--bogus"], False, tmp_path)
    assert code == 2 and "--bogus" in err
