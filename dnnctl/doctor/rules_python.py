"""The Python version against the wheels of a framework release.

Every torch and TensorFlow row carries the Python range its wheels were published for (the
release's own compatibility table); pip finds no wheel outside it ("Could not find a version
that satisfies the requirement ... (from versions: none)"), so that release cannot be
installed on this Python at all.
"""

from __future__ import annotations

from dnnctl.compat.schema import Row
from dnnctl.compat.suggest import torch_install
from dnnctl.compat.versions import Version, VersionRange
from dnnctl.doctor import rules_platform
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding


def python_of(ctx: Context) -> Version | None:
    """The snapshot's Python as major.minor (None when not given)."""
    v = Version.maybe(ctx.env.python)
    return v.trunc(2) if v is not None and len(v.key) >= 2 else None


def check(ctx: Context, framework: str, what: str, row: Row) -> list[Finding]:
    """``row``'s Python range against the snapshot's Python."""
    py = python_of(ctx)
    if py is None or not row.get("python"):
        return []
    rng = VersionRange.parse(row["python"])
    if rng.contains(py):
        return []
    line = row[framework]
    alt = _newest_for(ctx, framework, py)
    fix = f"use a Python that {framework} {line} has wheels for ({rng})"
    if alt is not None:
        fix += f", or {alt}"
    return [finding(
        "python-version", "error", framework,
        f"{what}: the {framework} {line} wheels are for Python {rng} only, and this is Python {py}: "
        f"pip finds no {framework} {line} for it ('Could not find a version that satisfies the "
        f"requirement {framework}' / 'from versions: none')", fix=fix, row=row,
        python=str(py), supported=str(rng))]


def _newest_for(ctx: Context, framework: str, py: Version) -> str | None:
    """The newest release line of ``framework`` with wheels for ``py`` (on native Windows,
    TensorFlow with GPU support ends at 2.10)."""
    rows = [r for r in ctx.matrix.rows(framework) if not r.uncertain and r.get("python")
            and VersionRange.parse(r["python"]).contains(py)]
    if not rows:
        return None
    newest = max(rows, key=lambda r: (Version.parse(r[framework]),
                                      bool(r.get("pypi_default"))))
    if framework == "torch":
        return f"install torch {newest['torch']}, which has wheels for Python {py}: " \
               f"`{torch_install(newest)}`"
    text = (f"install TensorFlow {newest['tensorflow']}, which has wheels for Python {py}: "
            f"`pip install \"tensorflow=={newest['tensorflow']}.*\"`")
    if ctx.os_kind == "windows" and \
            Version.parse(newest["tensorflow"]) > rules_platform.TF_WINDOWS_LAST_GPU:
        text += (f" (CPU only on native Windows: TensorFlow {rules_platform.TF_WINDOWS_LAST_GPU}"
                 " was the last with GPU support there; use WSL2 for the GPU)")
    return text
