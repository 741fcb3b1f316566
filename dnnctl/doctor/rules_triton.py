"""The ptxas Triton bundles, known from the Triton release (or the torch that pins it).

Triton turns its PTX into cubins with the ptxas in its wheel, one CUDA release per Triton
release; from 3.3 a second copy for compute capability 10.0 and newer (matrix table
``triton``). torch's Linux wheels pin one Triton release (``triton_pins``). So a Triton the
snapshot names (a ``triton`` / ``pytorch-triton`` package, a ``libraries.ptxas`` copy from
Triton) is judged without its ptxas version: from its release, else from the torch that pins
it. A torch alone is not: Triton may be absent and torch.compile never run. ``TRITON_PTXAS_PATH`` (``TRITON_PTXAS_BLACKWELL_PATH``
for the second copy) replaces the bundled one: then that ptxas decides, and without its version
it is not judged.
"""

from __future__ import annotations

from dataclasses import dataclass

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import CC, Version, VersionRange
from dnnctl.doctor import stack
from dnnctl.doctor.context import Context, GpuInfo, finding, unknown
from dnnctl.doctor.model import Component, Finding

PACKAGES = ("triton", "pytorch-triton")
BLACKWELL = CC(10, 0)  # get_ptxas: `ptxas_blackwell if arch >= 100`
SYMPTOM = ("torch.compile / Triton kernels fail with 'ptxas fatal : Value 'sm_{sm}' is not "
           "defined for option 'gpu-name''")


@dataclass
class Bundled:
    """The Triton release whose bundled ptxas runs here, and how that is known."""

    version: Version
    how: str  # "triton 3.2.0", "triton 3.2.0 (the one torch 2.6.0 pins)"
    row: Row


def is_triton(copy: Component) -> bool:
    """A ``libraries.ptxas`` copy that is Triton's bundled one (its source or path says so)."""
    return "triton" in f"{copy.source or ''} {copy.path or ''}".lower()


def _listed(ctx: Context) -> tuple[str, str] | None:
    """(name, version text) of the triton / pytorch-triton package listed, if any."""
    packages = ctx.packages
    return next(((n, packages[n]) for n in PACKAGES if n in packages), None)


def _pinned(ctx: Context) -> Bundled | None:
    """The Triton the torch here pins, for a Triton the snapshot names without its version
    (a torch alone says nothing: torch.compile may never run, Triton may be absent)."""
    pin = _torch_pin(ctx)
    if pin is None:
        return None
    torch, row = pin
    ver = Version.parse(row["triton"])
    release = ctx.matrix.triton_row(ver)
    if release is None:
        return None
    return Bundled(ver, f"triton {ver} (the one torch {torch} pins)", release)


def _torch_pin(ctx: Context) -> tuple[str, Row] | None:
    found = stack.torch_version(ctx)
    if found is None:
        return None
    ver = found[0]
    if ver.local and not ver.local.startswith("cu"):
        return None  # a CPU / ROCm / custom build: its Triton is not the pinned CUDA one
    row = ctx.matrix.triton_pin(ver.release)
    return (ver.text, row) if row is not None and not row.uncertain else None


def check(ctx: Context, copy: Component | None) -> list[Finding]:
    """Triton's bundled ptxas against the GPUs; ``copy``: the snapshot's entry for it, if it
    lists one without a version."""
    if not ctx.known_ccs:
        return []
    listed = _listed(ctx)
    ver = Version.maybe(listed[1].split("+")[0]) if listed else None
    if listed and ver is not None:
        row = ctx.matrix.triton_row(ver)
        if row is None:
            known = sorted(ctx.matrix.rows("triton"), key=_low)
            span = (f" (it knows {_low(known[0])} to below {_high(known[-1])})" if known
                    else "")
            return [finding("not-judged", "info", "ptxas", f"{listed[0]} {listed[1]}: not in "
                            f"the matrix{span}; its bundled ptxas was not judged")]
        found = Bundled(ver, f"{listed[0]} {listed[1]}", row)
    elif listed or copy is not None:
        pinned = _pinned(ctx)
        if pinned is None:
            return [_not_judged(copy)]
        found = pinned
    else:
        return []
    if found.row.uncertain:
        return [unknown("ptxas", f"{found.how}: which ptxas it bundles is uncertain (public "
                        "sources disagree)", row=found.row, conflicts=found.row.get("conflicts"))]
    out: list[Finding] = []
    fine: list[str] = []
    for gpu in ctx.known_ccs:
        key, var = (("ptxas_blackwell", "TRITON_PTXAS_BLACKWELL_PATH")
                    if gpu.cc >= BLACKWELL and found.row.get("ptxas_blackwell")
                    else ("ptxas", "TRITON_PTXAS_PATH"))
        override = (ctx.env.environment or {}).get(var)
        if override:
            out.append(finding("not-judged", "info", "ptxas", f"{found.how} runs {var}="
                               f"{override} for {gpu.label}, not its own ptxas; that one's "
                               "version is not given (libraries.ptxas), so it was not judged"))
            continue
        ptxas = Version.parse(found.row[key])
        release = ctx.matrix.cuda_release(ptxas)
        if release is None or release.uncertain:
            out.append(unknown("ptxas", f"{found.how}: its ptxas {ptxas} is from CUDA "
                               f"{ptxas.trunc(2)}, which has no certain row", row=release))
            continue
        if str(gpu.cc) in release["targets"]:
            fine.append(f"sm_{gpu.cc.major}{gpu.cc.minor} (ptxas {ptxas})")
            continue
        out.append(_unsupported(ctx, found, gpu, ptxas, release, key))
    if fine and not out:
        out.append(finding("ok", "info", "ptxas", f"{found.how}: its bundled ptxas can "
                           f"assemble for {', '.join(fine)}", row=found.row))
    return out


def _unsupported(ctx: Context, found: Bundled, gpu: GpuInfo, ptxas: Version, release: Row,
                 key: str) -> Finding:
    sm = f"{gpu.cc.major}{gpu.cc.minor}"
    first = Version.maybe((gpu.arch or {}).get("min_cuda"))
    newer = ptxas.trunc(2) < first if first is not None else \
        gpu.cc > max(CC.parse(t) for t in release["targets"])
    which = "the Blackwell ptxas" if key == "ptxas_blackwell" else "the ptxas"
    return finding(
        "arch-unsupported", "error", "ptxas",
        f"{found.how} bundles {which} of CUDA {ptxas.trunc(2)} ({ptxas}), which "
        f"{'does not know' if newer else 'no longer targets'} {gpu.label} (sm_{sm}): "
        + SYMPTOM.format(sm=sm), fix=_fix(ctx, found, gpu), row=found.row, ptxas=ptxas,
        compute_capability=gpu.cc, targets=list(release["targets"]))


def _fix(ctx: Context, found: Bundled, gpu: GpuInfo) -> str:
    """The first newer Triton whose ptxas for this GPU targets it (with the torch pinning
    it, where known), and the override any release takes."""
    arch = gpu.arch or {}
    need = f"CUDA >= {arch['min_cuda']}" if arch.get("min_cuda") else "a CUDA release that " \
        "lists this GPU"
    var = ("TRITON_PTXAS_BLACKWELL_PATH" if gpu.cc >= BLACKWELL
           and found.row.get("ptxas_blackwell") else "TRITON_PTXAS_PATH")
    override = f"point {var} at the ptxas of a {need} toolkit"
    for row in sorted(ctx.matrix.rows("triton"), key=_low):
        if row.uncertain or _low(row) <= found.version:
            continue
        key = "ptxas_blackwell" if gpu.cc >= BLACKWELL and row.get("ptxas_blackwell") \
            else "ptxas"
        release = ctx.matrix.cuda_release(Version.parse(row[key]))
        if release is None or str(gpu.cc) not in release["targets"]:
            continue
        torch = [p for p in ctx.matrix.rows("triton_pins") if not p.uncertain
                 and VersionRange.parse(row["triton"]).contains(Version.parse(p["triton"]))]
        with_torch = (f" (torch {_spec(torch[0]['torch'])} pins it)" if torch else "")
        return (f"Triton >= {_low(row)}{with_torch}: `pip install -U 'triton>={_low(row)}'` "
                f"with a torch that allows it; or {override}")
    return override


def _low(row: Row) -> Version:
    return VersionRange.parse(row["triton"]).lowest() or Version.parse("0")


def _high(row: Row) -> Version:
    return VersionRange.parse(row["triton"]).upper() or _low(row)


def _spec(text: str) -> str:
    return str(VersionRange.parse(text)).replace(" ", "")


def _not_judged(copy: Component | None) -> Finding:
    where = f"ptxas at {copy.path or copy.source}" if copy is not None else \
        "Triton's bundled ptxas"
    return finding("not-judged", "info", "ptxas", f"{where}: version unknown, and "
                   "neither the Triton release nor a torch that pins one is known, so which "
                   "GPUs it can assemble for was not judged",
                   fix="name the triton (or pytorch-triton) package's version")
