"""The README's commands work as shown: every `$ ` line of its examples runs, in order, in a
fresh directory, through the installed console script; CI runs the README's test command."""

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


def _commands() -> list[str]:
    cmds = []
    for block in re.findall(r"```text\n(.*?)```", README, flags=re.S):
        cmds += [line[2:] for line in block.splitlines() if line.startswith("$ ")]
    return cmds


def _quick_start() -> list[str]:
    section = README.split("## Quick start", 1)[1].split("## Tour", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)


def test_readme_has_two_quick_start_commands_and_ci_runs_the_test_one():
    main_cmd, test_cmd = _quick_start()
    assert "dnnctl tune" in main_cmd and "pytest" in test_cmd
    assert test_cmd in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


@pytest.mark.slow
def test_readme_tour_commands_run(tmp_path: Path):
    exe = shutil.which("dnnctl", path=str(Path(sys.executable).parent)) or shutil.which("dnnctl")
    if exe is None:
        pytest.skip("the dnnctl console script is not installed (pip install -e .)")
    env = dict(os.environ, PATH=f"{Path(exe).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               COLUMNS="120")
    cmds = _commands()
    assert len(cmds) >= 8
    for cmd in cmds:
        # the tour runs on whatever is present; tune on the CPU keeps it fast and repeatable
        res = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=300)
        out = res.stdout + res.stderr
        assert res.returncode in (0, 1), f"{cmd!r} exited {res.returncode}:\n{out}"
        assert "Traceback" not in out and "internal error" not in out, f"{cmd!r}:\n{out}"
        if cmd.startswith("dnnctl doctor --from"):
            assert '"driver-too-old"' in res.stdout and '"arch-unsupported"' in res.stdout
        if cmd.startswith("dnnctl compat check"):
            assert res.returncode == 1 and "arch-unsupported" in out
        if cmd.startswith("dnnctl plan validate"):
            assert res.returncode == 0
