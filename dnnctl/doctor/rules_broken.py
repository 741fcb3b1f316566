"""Releases whose build for one operating system is broken (compat/releases.yaml,
``broken_releases``): the wheel installs, then fails the same way for everyone on that OS
(torch 2.4.0 on Windows cannot load fbgemm.dll). An error naming the fixed release; for torch
the install comes from the index of the installed build's CUDA variant (``+cu121`` ->
whl/cu121), so the fix keeps the build the snapshot has.
"""

from __future__ import annotations

from dnnctl.compat.schema import Row
from dnnctl.compat.suggest import TORCH_INDEX
from dnnctl.compat.versions import Version
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.parse import canonical_name


def check(ctx: Context) -> list[Finding]:
    """An error for each installed release the matrix lists as broken on this OS."""
    kind = ctx.os_kind
    if kind is None:
        return []
    out: list[Finding] = []
    for row in ctx.matrix.rows("broken_releases"):
        if row.uncertain or row["os"] != kind:
            continue
        installed = _installed(ctx, row["package"])
        if installed is None:
            continue
        public, local = (installed.split("+", 1) + [""])[:2]
        if Version.maybe(public) != Version.parse(row["release"]):
            continue
        out.append(finding(
            "broken-release", "error", row["package"],
            f"{row['package']} {installed} is a broken release on {_OS[kind]}: "
            f"{row['symptom']}; fixed in {row['fixed_in']}",
            fix=_fix(row, local), row=row, release=row["release"], os=kind,
            fixed_in=row["fixed_in"]))
    return out


_OS = {"windows": "Windows", "linux": "Linux", "macos": "macOS"}


def _installed(ctx: Context, package: str) -> str | None:
    """The installed version: the framework entry's, else the ``packages`` list's."""
    info = (ctx.env.frameworks or {}).get(package)
    if isinstance(info, dict) and info.get("version"):
        return str(info["version"])
    for name, ver in (ctx.env.packages or {}).items():
        if canonical_name(name) == package and ver:
            return str(ver)
    return None


def _fix(row: Row, local: str) -> str:
    """The fixed release's install command for the installed build's variant."""
    pin = f'pip install "{row["package"]}=={row["fixed_in"]}"'  # double quotes: cmd.exe too
    if row["package"] == "torch" and local:
        return f"`{pin} --index-url {TORCH_INDEX.format(variant=local)}` (or any later release)"
    return f"`{pin}` (or any later release)"
