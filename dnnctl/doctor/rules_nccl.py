"""The NCCL that loads first against the NCCL the torch wheel pins.

A torch wheel pins the nvidia-nccl-cuNN it was built against (the torch row's ``nccl``);
torch calls symbols that older NCCL releases lack (2.2 calls ncclCommRegister, new in 2.19).
A libnccl.so.2 that another package or LD_LIBRARY_PATH puts first wins the ``dlopen``: older
than the pin, torch fails at import with "undefined symbol: nccl...". A copy compared with a
listed pip copy is judged by rules_libraries; here it is compared with the pin, and a copy of
unknown version that loads first is said to be unknown, never passed.
"""

from __future__ import annotations

from dnnctl.compat.schema import Row
from dnnctl.compat.suggest import python_fits
from dnnctl.compat.versions import Version
from dnnctl.doctor.context import Context, cite, finding, unknown
from dnnctl.doctor.model import Component, Finding
from dnnctl.doctor.rules_libraries import LIBRARY_SOURCE
from dnnctl.doctor.stack import torch_row

OWN = ("pip:", "torch:")


def check(ctx: Context) -> list[Finding]:
    """The first NCCL copy found against the torch wheel's pin."""
    copies = (ctx.env.libraries or {}).get("nccl") or []
    first = next((c for c in copies if c.loaded_first), None)
    if first is None or (first.source or "").startswith(OWN):
        return []
    row = torch_row(ctx)
    pin = Version.maybe(row.get("nccl")) if row is not None else None
    loaded = Version.maybe(first.version)
    if loaded is not None and any((c.source or "").startswith(OWN) and
                                  (v := Version.maybe(c.version)) and v.major == loaded.major
                                  for c in copies):
        return []  # compared with the listed pip copy by rules_libraries.duplicates
    where = first.path or first.source or "an unnamed location"
    torch = f"torch {row['torch']} ({row['variant']})" if row is not None else "torch"
    if loaded is None:
        need = (f"; {torch} pins NCCL {pin}, and an older copy fails at import with 'undefined "
                "symbol: nccl...' (ncclCommRegister, ncclCommResume)") if pin else ""
        return [unknown("nccl", f"an NCCL of unknown version ({where}) loads before torch's "
                        f"own{need}", row=row if pin else None, fix=_fix(ctx, row, pin, first),
                        loaded_from=where, pinned=pin)]
    if pin is None or loaded >= pin:
        return []
    return [finding(
        "library-shadowed", "error", "nccl",
        f"NCCL {loaded} from {where} is found first and wins over the NCCL {pin} that {torch} "
        f"pins: the older copy lacks symbols torch calls, so it fails at import with "
        "'undefined symbol: nccl...' (e.g. ncclCommRegister, new in NCCL 2.19)",
        fix=_fix(ctx, row, pin, first), source=f"{cite(row)}; {LIBRARY_SOURCE['nccl']}", loaded=str(loaded), loaded_from=where,
        pinned=str(pin))]


def _fix(ctx: Context, row: Row | None, pin: Version | None, first: Component) -> str:
    """Take the other copy out of the way, or use a torch whose pin it satisfies."""
    where = first.path or first.source or ""
    text = (f"remove {where.rsplit('/', 1)[0]} from LD_LIBRARY_PATH" if "/" in where else
            "uninstall the package that brings this libnccl.so.2 (or take its directory off "
            "LD_LIBRARY_PATH)") + " so torch's nvidia-nccl wheel loads"
    loaded = Version.maybe(first.version)
    if row is None or pin is None:
        return text
    older = [r for r in ctx.matrix.rows("torch") if r.get("nccl") and not r.uncertain
             and python_fits(r, ctx.python) and Version.parse(r["nccl"]) < pin
             and (loaded is None or Version.parse(r["nccl"]) <= loaded)]
    if older:
        best = max(older, key=lambda r: Version.parse(r["torch"]))
        text += (f", or use torch {best['torch']}, whose wheel pins NCCL {best['nccl']}"
                 + ("" if loaded is not None else " (if that copy is at least as new)"))
    return text
