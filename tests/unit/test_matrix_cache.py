"""The compiled matrix cache: same tables as parsing the YAML, rebuilt when a file changes,
a corrupt cache ignored, and no PyYAML import when it is warm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dnnctl.compat import cache
from dnnctl.compat.matrix import _bundled, load_matrix

REPO = Path(__file__).resolve().parents[2]


def test_cached_equals_parsed(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DNNCTL_CACHE_DIR", str(tmp_path))
    _bundled.cache_clear()
    parsed = load_matrix()  # parses, writes the cache
    files = list(tmp_path.glob("matrix-*.json"))
    assert len(files) == 1
    _bundled.cache_clear()
    cached = load_matrix()
    for table, rows in parsed.tables.items():
        assert [(dict(r), r.where) for r in rows] == \
            [(dict(r), r.where) for r in cached.tables[table]], table
    files[0].write_text("{not json")  # corrupt: ignored, parsed again
    _bundled.cache_clear()
    assert len(load_matrix().rows("torch")) == len(parsed.rows("torch"))
    _bundled.cache_clear()


def test_key_changes_with_a_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DNNCTL_CACHE_DIR", str(tmp_path))
    a = (("compat/x.yaml", 1, 10),)
    b = (("compat/x.yaml", 2, 10),)  # the file was touched: another key, a miss
    assert cache._key(a) != cache._key(b)
    assert cache.load(a) is None  # nothing cached yet: a miss, never an error
    cache.store(a, {"torch": []})
    assert cache.load(a) is not None and cache.load(b) is None


def test_warm_start_does_not_import_yaml(tmp_path: Path) -> None:
    env = {**os.environ, "DNNCTL_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    code = ("import sys; from dnnctl.compat.matrix import load_matrix; load_matrix(); "
            "import json; print(json.dumps('yaml' in sys.modules))")
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True)
    assert json.loads(first.stdout) is True and json.loads(second.stdout) is False
