"""`dnnctl compat show` at 80 columns never cuts a value short (a squeezed table printed
torch 1.13 as '1.1' and dropped whole columns): tables that cannot fit print each row as a
block of `column: value` lines."""

from __future__ import annotations

import os
import subprocess
import sys


def test_every_value_is_printed_whole_at_80_columns():
    env = dict(os.environ, COLUMNS="80")
    out = subprocess.run([sys.executable, "-m", "dnnctl", "compat", "show", "torch", "--json"],
                         capture_output=True, text=True, env=env, check=True).stdout
    import json

    rows = json.loads(out)["rows"]
    text = subprocess.run([sys.executable, "-m", "dnnctl", "compat", "show", "torch"],
                          capture_output=True, text=True, env=env, check=True).stdout
    words = set(text.split())
    for row in rows:
        for col in ("torch", "cuda", "min_driver"):
            if row.get(col) is not None:
                assert str(row[col]) in words, (col, row[col])
    assert max(len(line) for line in text.splitlines()) <= 80
