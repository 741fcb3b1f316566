"""The README's commands work as shown: every `$ ` line of its examples runs, in order, in a
fresh directory that looks like the repository root (its docs/ linked in), through the
console script (or, when it is not installed, a stand-in running ``python -m dnnctl``), in
an 80-column terminal; the output shown under a command must match its real stdout, where
`…` stands for left-out lines (alone on a line) or differing text (inside a line).
Commands carrying a `#` comment show another machine's output and are only run. The
run-time Python example runs last, against the plan the tour made. CI runs the README's
test command."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _examples() -> list[tuple[str, list[str]]]:
    """(command, expected output lines) for every `$ ` line of the ```text blocks."""
    out: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```text\n(.*?)```", README, flags=re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                out.append((line[2:], []))
            elif out:
                out[-1][1].append(line)
    return out


def _commands() -> list[str]:
    return [cmd for cmd, _ in _examples()]


def _quick_start() -> list[str]:
    section = README.split("## Quick start", 1)[1].split("## Tour", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)


def output_pattern(expected: list[str]) -> str:
    """A regex for a whole output: `…` alone skips lines, `…` inside a line skips text."""
    while expected and not expected[-1].strip():
        expected = expected[:-1]
    parts = []
    for line in expected:
        line = line.rstrip()
        if line.strip() == "…":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append("[^\n]*".join(re.escape(p) for p in line.split("…")) + r"\n")
    return "".join(parts)


def matches(expected: list[str], actual: str) -> bool:
    text = "".join(line.rstrip() + "\n" for line in actual.splitlines())
    return re.fullmatch(output_pattern(expected), text) is not None


def test_readme_has_two_quick_start_commands_and_ci_runs_the_test_one():
    main_cmd, test_cmd = _quick_start()
    assert "dnnctl tune" in main_cmd and "pytest" in test_cmd
    assert test_cmd in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_the_output_matcher_can_fail():
    assert matches(["a", "…", "c …"], "a\nb\nb\nc 12 s\n")
    assert not matches(["a", "c"], "a\nb\nc\n")
    assert not matches(["x …"], "y 1\n")


def _dnnctl_on_path(tmp_path: Path) -> str:
    exe = shutil.which("dnnctl", path=str(Path(sys.executable).parent))
    if exe is not None:
        return str(Path(exe).parent)
    shim = tmp_path / "bin" / "dnnctl"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m dnnctl "$@"\n')
    shim.chmod(0o755)
    return str(shim.parent)


@pytest.mark.slow
def test_readme_tour_commands_run_and_show_their_real_output(tmp_path: Path):
    work = tmp_path / "repo"
    work.mkdir()
    (work / "docs").symlink_to(ROOT / "docs")
    bindir = _dnnctl_on_path(tmp_path)
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
               COLUMNS="80", PYTHONPATH=os.pathsep.join(
                   [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env.pop("NO_COLOR", None)
    examples = _examples()
    assert len(examples) >= 12
    for cmd, expected in examples:
        res = subprocess.run(["bash", "-c", cmd], cwd=work, env=env, capture_output=True,
                             text=True, timeout=300)
        out = res.stdout + res.stderr
        assert res.returncode in (0, 1), f"{cmd!r} exited {res.returncode}:\n{out}"
        assert "Traceback" not in out and "internal error" not in out, f"{cmd!r}:\n{out}"
        if cmd.startswith("dnnctl compat check"):
            assert res.returncode == 1 and "arch-unsupported" in out
        if cmd.startswith("dnnctl plan validate"):
            assert res.returncode == 0
        if "#" not in cmd and any(line.strip() for line in expected):
            assert matches(expected, res.stdout), (
                f"README output of {cmd!r} differs from the real one:\n{res.stdout}")
    snippet = re.search(r"```python\n(.*?)```", README, flags=re.S).group(1)
    res = subprocess.run([sys.executable, "-c", snippet], cwd=work, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    shown = re.search(r"It prints `(PlanStats\(.*?\))`", README).group(1)
    assert res.stdout.strip() == shown  # the bias makes the conv a hit, not a miss
