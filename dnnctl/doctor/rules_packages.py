"""Package rules: distributions that must not be installed together."""

from __future__ import annotations

import re

from dnnctl.compat.inputs import bounded
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding


def check(ctx: Context) -> list[Finding]:
    """Two or more installed distributions matching one conflict group."""
    names = {_norm(n) for n in (ctx.env.packages or {})}
    for fw in ("cupy", "tensorflow"):
        info = (ctx.env.frameworks or {}).get(fw) or {}
        names |= {_norm(n) for n in info.get("packages") or []}
    out: list[Finding] = []
    for row in ctx.matrix.rows("package_conflicts"):
        hits = sorted(n for n in names if re.fullmatch(row["pattern"], bounded(n)))
        if len(hits) > 1:
            versions = {n: (ctx.env.packages or {}).get(n) for n in hits}
            out.append(finding("duplicate-package", row["severity"], "packages",
                               f"{' and '.join(hits)} are installed together: {row['why']}",
                               fix=_fill(row["fix"], versions), row=row, packages=versions))
    return out


def _fill(fix: str, versions: dict[str, str | None]) -> str:
    """``{installed[NAME]}`` in a fix -> the installed version of NAME (to reinstall it)."""
    return re.sub(r"\{installed\[([\w.-]+)\]\}",
                  lambda m: versions.get(_norm(m.group(1))) or "VERSION", fix)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
