"""Fixes that pass the doctor's own checks: a build proposed as the fix must run here.

A fix that names another build (an older CUDA variant of torch, another TensorFlow release, a
CUDA toolkit) is held to what the doctor would say of that build on this machine: the driver
must run its CUDA, and it must have code for every GPU. ``build_problems`` says why a build
would fail those checks; the rules pick a build with none, and where none exists they offer
none, or say what the fix needs (the driver a toolkit needs).
"""

from __future__ import annotations

from dnnctl.compat.drivers import driver_need, driver_status, with_gpu
from dnnctl.compat.schema import Row
from dnnctl.compat.suggest import cubin_status
from dnnctl.compat.versions import Version
from dnnctl.doctor.context import Context


def driver_problem(ctx: Context, cuda: Version) -> str | None:
    """Why this driver cannot run CUDA ``cuda`` (full support or minor-version compatibility),
    None when it can or when the driver is not known (Jetson: not on this numbering)."""
    span = ctx.driver_span  # a bare branch: its oldest and newest driver must agree
    if span is None or ctx.tegra:
        return None
    status = {driver_status(ctx.matrix, d, cuda, windows=ctx.windows) for d in span}
    if status <= {"full", "mvc"}:
        return None
    need = driver_need(ctx.matrix, cuda, windows=ctx.windows)
    for gpu in ctx.known_ccs:
        need = with_gpu(need, gpu.arch, matrix=ctx.matrix, windows=ctx.windows)
    if "unknown" in status or need.minimum is None:
        return f"the driver CUDA {cuda.trunc(2)} needs is not known"
    return f"CUDA {cuda.trunc(2)} needs driver >= {need.minimum}; this one is {ctx.driver_label}"


def build_problems(ctx: Context, cuda: Version, row: Row | None = None) -> list[str]:
    """Why a build of CUDA ``cuda`` would fail the doctor's checks here: the driver against its
    CUDA, and (``row``: a framework row with an arch list; else a CUDA toolkit's targets) its
    code for every GPU. Empty: the build passes."""
    out = [p for p in [driver_problem(ctx, cuda)] if p]
    rel = ctx.matrix.cuda_release(cuda) if row is None else None
    for gpu in ctx.known_ccs:
        sm = f"sm_{gpu.cc.major}{gpu.cc.minor}"
        if row is not None:
            if cubin_status(gpu.cc, row, ctx.platform) is not True:
                out.append(f"it has no code for {sm}")
        elif rel is None or str(gpu.cc) not in rel["targets"]:
            out.append(f"CUDA {cuda.trunc(2)} cannot compile for {sm}")
    return out
