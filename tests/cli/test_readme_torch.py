"""The README's PyTorch section works as shown: record -> ``dnnctl tune`` -> patch, its
Python blocks and its shell command run in order in one fresh directory, and the report it
prints is the one the README shows."""

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


def _section() -> str:
    return README.split("### PyTorch", 1)[1].split("\n## ", 1)[0]


def _steps() -> list[tuple[str, str]]:
    """("py", code) and ("sh", command) in README order; ```console blocks are shown output."""
    steps = []
    for lang, body in re.findall(r"```(python|bash)\n(.*?)```", _section(), flags=re.S):
        steps.append(("py" if lang == "python" else "sh", body))
    return steps


def test_section_is_record_tune_patch():
    assert [k for k, _ in _steps()] == ["py", "sh", "py"]
    assert "dnnctl tune model.workload.yaml" in _steps()[1][1]


@pytest.mark.slow
def test_readme_pytorch_section_runs(tmp_path: Path):
    """The Python blocks run as one script (the later ones use the earlier ones' names)."""
    pytest.importorskip("torch")
    exe = shutil.which("dnnctl", path=str(Path(sys.executable).parent))
    env = dict(os.environ, COLUMNS="120", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    shown = re.search(r"```console\n(dnnctl\.torch\.patch.*?)```", _section(), flags=re.S)
    script = ""
    res = None
    for kind, text in _steps():
        if kind == "sh":
            cmd = text.split("#")[0].strip()
            if exe is None:  # no console script installed: the module does the same
                cmd = cmd.replace("dnnctl ", f"{sys.executable} -m dnnctl ", 1)
            res = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=600)
            assert res.returncode == 0, f"{cmd!r}:\n{res.stdout}{res.stderr}"
            assert "5/5 problems planned" in res.stdout, res.stdout
            continue
        script += text
        res = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, f"{text}\n{res.stdout}{res.stderr}"
    assert res is not None and shown is not None
    assert shown.group(1).strip() in res.stdout, res.stdout  # the report as shown
    assert "misses=0," in res.stdout and "hits=5," in res.stdout, res.stdout
