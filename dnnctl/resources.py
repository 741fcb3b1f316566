"""Locate the data shipped with dnnctl (``kernels/`` and ``compat/``).

In an installed wheel they live in ``dnnctl/_data/``; in a source checkout (or an editable
install) they are the top-level ``kernels/`` and ``compat/`` folders next to the package.
"""

from __future__ import annotations

import functools
from pathlib import Path

from dnnctl.errors import DnnctlError

_PKG = Path(__file__).resolve().parent


@functools.cache
def data_dir(name: str) -> Path:
    """Return the directory holding shipped data ``name`` ("kernels" or "compat")."""
    for candidate in (_PKG / "_data" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise DnnctlError(
        f"dnnctl's bundled '{name}/' data was not found next to {_PKG}",
        hint="reinstall dnnctl (pip install --force-reinstall dnnctl) or run from a full checkout",
        code="missing-data",
    )


def kernels_dir() -> Path:
    return data_dir("kernels")


def compat_dir() -> Path:
    return data_dir("compat")
