"""Fix commands wider than 80 columns: the human report wraps them as shell lines that paste
as the same command; --json keeps each command whole."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from _doctor_helpers import doctor, shown_commands

from dnnctl.cli.render import wrap_command

JAX_INDEX = "https://storage.googleapis.com/jax-releases/jax_cuda_releases.html"
LONG = [f'pip install "jax[cuda12_pip]==0.4.14" -f {JAX_INDEX}',
        "ln -s libcudart.so.11.0 /home/u/.conda/envs/kohya/lib/python3.10/site-packages/"
        "nvidia/cuda_runtime/lib/libcudart.so",
        "export LD_LIBRARY_PATH=/home/u/.conda/envs/kohya/lib/python3.10/site-packages/"
        "nvidia/cuda_runtime/lib:$LD_LIBRARY_PATH"]


def test_jax_index_command_is_wrapped_in_the_report_and_whole_in_json(tmp_path) -> None:
    # a GPU in view: the CPU-only jax is a warning whose fix is the index command (an ok
    # finding carries no fix)
    d = doctor(tmp_path, "gpus: [{name: NVIDIA H100 80GB HBM3}]\n"
               "frameworks:\n  jax: {version: '0.4.6', jaxlib: '0.4.14'}\n"
               "packages: {jax: '0.4.6', jaxlib: '0.4.14'}\n")
    assert any(len(c) > 80 for c in shown_commands(d.text))  # one is longer than a line
    assert f'-f {JAX_INDEX}' in d.fixes  # --json: whole
    assert f"-f \\\n    {JAX_INDEX}" in d.text  # the report: a continuation line


@pytest.mark.parametrize("cmd", LONG)
def test_wrapped_lines_fit_and_rejoin(cmd) -> None:
    lines = wrap_command(cmd, 80)
    assert len(lines) > 1 and max(map(len, lines)) <= 80
    assert shown_commands("commands (one per line):\n# [1] x\n" + "\n".join(lines)) == [cmd]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("cmd", LONG)
def test_bash_reads_the_wrapped_lines_as_the_same_words(cmd) -> None:
    script = "\n".join(wrap_command(cmd, 80))
    words = ["bash", "-c", 'f() { printf "%s\\n" "$@"; }; ' + "f " + script.split(" ", 1)[1]]
    whole = ["bash", "-c", 'f() { printf "%s\\n" "$@"; }; ' + "f " + cmd.split(" ", 1)[1]]
    assert subprocess.run(words, capture_output=True, text=True).stdout == \
        subprocess.run(whole, capture_output=True, text=True).stdout


def test_short_and_powershell_commands_stay_whole() -> None:
    assert wrap_command("pip install -U jax", 80) == ["pip install -U jax"]
    ps = "$env:PATH = 'C:\\Program Files\\NVIDIA GPU Computing Toolkit\\CUDA\\v12.4\\bin;' + $env:PATH"
    assert wrap_command(ps, 60) == [ps]
