"""A libcuda found first that is not the driver's, e.g. the toolkit's link-time stub.

Every toolkit ships a ``stubs`` directory (``lib64/stubs/libcuda.so``, ``targets/<arch>/lib/
stubs``; conda's ``lib/stubs``) so that programs link where no driver is installed; the stub
has no implementation. With that directory on LD_LIBRARY_PATH (or in ld.so.conf) the loader
finds it before the driver's own libcuda and CUDA cannot start. ``driver.libcuda`` is the path
of the libcuda the loader finds first; the matrix table ``libcuda_paths`` says which paths are
not a driver's.
"""

from __future__ import annotations

import re

from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding

# drop every ".../stubs" entry from LD_LIBRARY_PATH, whatever toolkit it belongs to
UNSET = ("export LD_LIBRARY_PATH=\"$(printf '%s' \"$LD_LIBRARY_PATH\" | tr ':' '\\n' | "
         "grep -v '/stubs/*$' | paste -sd: -)\"")


def stub_dir(path: str) -> str | None:
    """The directory of ``path`` (a libcuda), the one to take off the search path."""
    parts = re.split(r"[/\\]+", path.strip())
    return "/".join(parts[:-1]) or None if len(parts) > 1 else None


def check(ctx: Context) -> list[Finding]:
    """``driver.libcuda`` matching a ``libcuda_paths`` row: an error with the search path fix."""
    path = str((ctx.env.driver or {}).get("libcuda") or "")
    if not path or ctx.driver_present is False:
        return []
    row = next((r for r in ctx.matrix.rows("libcuda_paths") if not r.uncertain
                and re.search(r["match"], path, re.IGNORECASE)), None)
    where = stub_dir(path) if row is not None else None
    if row is None or where is None:
        return []
    return [finding(
        "libcuda-stub", "error", "driver",
        f"the libcuda the loader finds first, {path}, is {row['what']}: {row['symptom']}",
        fix=f"take {where} off the library search path: `{UNSET}` (and in the shell profile "
        "or module file that adds it), and remove it from /etc/ld.so.conf.d (then `sudo "
        "ldconfig`); the driver's libcuda.so.1 is then found (`ldconfig -p | grep libcuda`)",
        row=row, libcuda=path, directory=where)]
