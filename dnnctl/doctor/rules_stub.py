"""The CUDA toolkit's link-time stub libcuda, loaded at run time: CUDA cannot start.

Every toolkit ships a ``stubs`` directory (``lib64/stubs/libcuda.so``, ``targets/<arch>/lib/
stubs``; conda's ``lib/stubs``) so that programs link where no driver is installed; the stub
has no implementation. With that directory on LD_LIBRARY_PATH (or in ld.so.conf) the loader
finds it before the driver's own libcuda, and every CUDA call fails with
CUDA_ERROR_STUB_LIBRARY (34), which some libraries (numba's cuInit) report as an unknown
error. ``driver.libcuda`` is the path of the libcuda the loader finds first.
"""

from __future__ import annotations

import re

from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding

SOURCE = (
    "https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__TYPES.html "
    "(CUDA_ERROR_STUB_LIBRARY = 34: 'This indicates that the CUDA driver that the application "
    "has loaded is a stub library. Applications that run with the stub rather than a real "
    "driver loaded will result in CUDA API returning this error.'); gmarkall in "
    "numba/numba#8985 ('The stub library it's loading is intended to allow you to link "
    "against libcuda.so on a system that doesn't have the driver installed, and it doesn't "
    "have any actual implementations'; the reporter: '$CUDA_PATH/lib64/stubs' on "
    "LD_LIBRARY_PATH, 'After I reset it, numba.cuda works'); c0d1f1ed in NVIDIA/warp#219 "
    "('your system has the directory of the stub (typically /usr/local/cuda/lib64/stubs) "
    "configured to be searched before the user-mode driver')")
# drop every ".../stubs" entry from LD_LIBRARY_PATH, whatever toolkit it belongs to
UNSET = ("export LD_LIBRARY_PATH=\"$(printf '%s' \"$LD_LIBRARY_PATH\" | tr ':' '\\n' | "
         "grep -v '/stubs/*$' | paste -sd: -)\"")


def stub_dir(path: str) -> str | None:
    """The ``stubs`` directory ``path`` (a libcuda) lies in, or None for any other libcuda."""
    parts = re.split(r"[/\\]+", path.strip())
    if len(parts) < 2 or not parts[-1].lower().startswith("libcuda"):
        return None
    return "/".join(parts[:-1]) if parts[-2].lower() == "stubs" else None


def check(ctx: Context) -> list[Finding]:
    """``driver.libcuda`` under a ``stubs`` directory: an error, with the search path fix."""
    path = str((ctx.env.driver or {}).get("libcuda") or "")
    where = stub_dir(path) if path and ctx.driver_present is not False else None
    if where is None:
        return []
    return [finding(
        "libcuda-stub", "error", "driver",
        f"the libcuda the loader finds first, {path}, is the CUDA toolkit's link-time stub: it "
        "has no implementation, so CUDA cannot start (every call fails with "
        "CUDA_ERROR_STUB_LIBRARY, 34; numba reports cuInit's UNKNOWN_CUDA_ERROR)",
        fix=f"take {where} off the library search path: `{UNSET}` (and in the shell profile "
        "or module file that adds it), and remove it from /etc/ld.so.conf.d (then `sudo "
        "ldconfig`); the driver's libcuda.so.1 is then found (`ldconfig -p | grep libcuda`)",
        source=SOURCE, libcuda=path, stubs=where)]
