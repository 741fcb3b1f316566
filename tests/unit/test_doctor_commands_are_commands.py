"""Every line the doctor prints under "commands" must be runnable: the fixes the matrix data
carries split into commands with no prose in them."""

from __future__ import annotations

import re

from dnnctl.cli.render import split_commands
from dnnctl.compat.matrix import iter_rows, load_matrix

PROSE = re.compile(r", | the | then | and keep ")


def _unquoted(cmd: str) -> str:
    return re.sub(r"'[^']*'|\"[^\"]*\"", "''", cmd)


def test_matrix_fixes_give_only_runnable_command_lines() -> None:
    checked = 0
    for table, row in iter_rows(load_matrix()):
        fix = row.get("fix")
        if not isinstance(fix, str):
            continue
        for cmd in split_commands(fix)[1]:
            checked += 1
            assert not PROSE.search(_unquoted(cmd)), f"{table}: {cmd!r} (from {fix!r})"
    assert checked >= 3
