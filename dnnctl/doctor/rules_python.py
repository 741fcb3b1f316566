"""The Python version against the wheels of a framework release.

Every torch and TensorFlow row carries the Python range its wheels were published for (the
release's own compatibility table); pip finds no wheel outside it ("Could not find a version
that satisfies the requirement ... (from versions: none)"), so that release cannot be
installed on this Python at all. The range belongs to the release, not to one wheel variant:
a torch is checked against its release line's range whatever its build (a CUDA variant, the
CPU wheel, an untagged wheel on Windows), and a torch this module proposes instead has wheels
for this Python.
"""

from __future__ import annotations

from dnnctl.compat.schema import Row
from dnnctl.compat.suggest import best_torch_fix, python_fits, torch_install
from dnnctl.compat.versions import Version, VersionRange
from dnnctl.doctor import rules_platform, rules_reach
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding


def python_of(ctx: Context) -> Version | None:
    """The snapshot's Python as major.minor (None when not given)."""
    return ctx.python


def release_row(ctx: Context, framework: str, line: str) -> Row | None:
    """A row of release ``line`` carrying the Python range all its variants share; None when
    no row gives one or the variants disagree (then nothing is judged)."""
    want = Version.parse(line).trunc(2)
    rows = [r for r in ctx.matrix.rows(framework) if not r.uncertain and r.get("python")
            and Version.parse(r[framework]).trunc(2) == want]
    return rows[0] if rows and len({r["python"] for r in rows}) == 1 else None


def check_release(ctx: Context, framework: str, what: str, line: str) -> list[Finding]:
    """Release ``line``'s Python range against the snapshot's Python, whatever the build."""
    row = release_row(ctx, framework, line)
    return check(ctx, framework, what, row) if row is not None else []


def check(ctx: Context, framework: str, what: str, row: Row) -> list[Finding]:
    """``row``'s Python range against the snapshot's Python."""
    py = python_of(ctx)
    if py is None or not row.get("python"):
        return []
    rng = VersionRange.parse(row["python"])
    if rng.contains(py):
        return []
    line = Version.parse(row[framework]).trunc(2)
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
    TensorFlow with GPU support ends at 2.10; a torch for the GPUs and driver here where they
    are known)."""
    if framework == "torch":
        return torch_for_python(ctx, py)
    rows = [r for r in ctx.matrix.rows(framework) if not r.uncertain and r.get("python")
            and VersionRange.parse(r["python"]).contains(py)]
    if not rows:
        return None
    newest = max(rows, key=lambda r: (Version.parse(r[framework]),
                                      bool(r.get("pypi_default"))))
    text = (f"install TensorFlow {newest['tensorflow']}, which has wheels for Python {py}: "
            f"`pip install \"tensorflow=={newest['tensorflow']}.*\"`")
    if ctx.os_kind == "windows" and \
            Version.parse(newest["tensorflow"]) > rules_platform.TF_WINDOWS_LAST_GPU:
        text += (f" (CPU only on native Windows: TensorFlow {rules_platform.TF_WINDOWS_LAST_GPU}"
                 " was the last with GPU support there; use WSL2 for the GPU)")
    return text


def torch_for_python(ctx: Context, py: Version | None, line: str | None = None) -> str | None:
    """'install torch X, which has wheels for Python P: `...`': a CUDA build of release
    ``line`` (else of the newest line) with wheels for ``py``, that also passes the GPU and
    driver checks where they are known; on macOS, PyPI's wheel (no CUDA build exists)."""
    if ctx.known_ccs:
        if rules_reach.unreached(ctx, "torch"):
            return None  # only a source build has code for a GPU here
        cmd = best_torch_fix(ctx.matrix, ctx.known_ccs[0].cc, driver=ctx.driver,
                             platform=ctx.platform, same_line=line, windows=ctx.windows,
                             python=py)
        rows = ctx.matrix.current("torch")
    else:
        rows = [r for r in ctx.matrix.rows("torch") if not r.uncertain and r.get("python")
                and python_fits(r, py) and (line is None or r["torch"] == line)]
        if not rows and line is not None:
            return torch_for_python(ctx, py)
        newest = max(rows, key=lambda r: (Version.parse(r["torch"]),
                                          bool(r.get("pypi_default"))), default=None)
        cmd = torch_install(newest) if newest is not None else None
    if cmd is None:
        return None
    release = next((r["torch"] for r in rows if f"'torch=={r['torch']}.*'" in cmd), None)
    if ctx.os_kind == "macos" and release is not None:
        cmd = f"pip install 'torch=={release}.*'"
    head = f"install torch {release}" if release else "install"
    return f"{head}, which has wheels for Python {py}: `{cmd.split(' (')[0]}`" + (
        f" ({cmd.split(' (', 1)[1]}" if " (" in cmd else "")
