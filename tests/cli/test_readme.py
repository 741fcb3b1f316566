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


PYTORCH = "### PyTorch"


def _pytorch_section() -> str:
    return README.split(PYTORCH, 1)[1].split("\n## ", 1)[0]


def _commands() -> list[str]:
    """The tour's `$ ` commands (the PyTorch section's run with its Python, below)."""
    cmds = []
    tour = README.replace(_pytorch_section(), "")
    for block in re.findall(r"```text\n(.*?)```", tour, flags=re.S):
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


def _pytorch_steps() -> list[tuple[str, str]]:
    """The PyTorch section in order: ("py", code) blocks and ("sh", command) lines."""
    steps = []
    for lang, body in re.findall(r"```(python|text)\n(.*?)```", _pytorch_section(), flags=re.S):
        if lang == "python":
            steps.append(("py", body))
        else:
            steps += [("sh", line[2:]) for line in body.splitlines() if line.startswith("$ ")]
    return steps


@pytest.mark.slow
def test_readme_pytorch_section_runs(tmp_path: Path):
    """record -> dnnctl tune -> patch, as the README shows it, in one fresh directory; the
    Python blocks run as one script (the later ones use the earlier ones' names)."""
    pytest.importorskip("torch")
    exe = shutil.which("dnnctl", path=str(Path(sys.executable).parent))
    env = dict(os.environ, COLUMNS="120", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    steps = _pytorch_steps()
    assert [k for k, _ in steps] == ["py", "sh", "py"]
    shown = re.search(r"```text\n(dnnctl\.torch\.patch.*?)```", _pytorch_section(),
                      flags=re.S).group(1)
    script = ""
    for kind, text in steps:
        if kind == "sh":
            cmd = text if exe else text.replace("dnnctl ", f"{sys.executable} -m dnnctl ", 1)
            res = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=600)
            assert res.returncode == 0, f"{cmd!r}:\n{res.stdout}{res.stderr}"
            assert "5/5 problems planned" in res.stdout
            continue
        script += text  # each block runs with the ones before it (one session)
        res = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, f"{text}\n{res.stdout}{res.stderr}"
    # the last block printed the report the README shows, and every call hit the plan
    assert shown.strip() in res.stdout, res.stdout
    assert "misses=0," in res.stdout, res.stdout
