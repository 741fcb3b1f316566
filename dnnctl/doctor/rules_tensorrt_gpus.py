"""The GPUs a TensorRT release has kernels for.

TensorRT picks its kernels ("tactics") per SM, and a release supports a bounded set of GPU
architectures (compat/limits.yaml ``tensorrt_gpus``, from each release's support matrix and
release notes): building an engine for a GPU outside them aborts with "Assertion failed:
Unsupported SM" (trtSmToCask, TensorRT 7/8), "Unsupported SM: 0x601" (10.x) or "Target GPU
SM 120 is not supported by this TensorRT release". A GPU older than the release's oldest
capability, or newer than its newest where a later release is known to add it, is an error
naming the releases that support it; a capability the sources leave open is not judged.
Jetson boards get TensorRT with JetPack, whose own builds are not in the table.
"""

from __future__ import annotations

import re
from typing import Any

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import CC, Version, VersionRange
from dnnctl.doctor.context import Context, GpuInfo, cite, finding, unknown
from dnnctl.doctor.model import Finding

_WHEEL = re.compile(r"tensorrt(?:-cu\d+)?(?:-(?:libs|bindings))?")
SYMPTOM = ("building an engine on it aborts with 'Unsupported SM' (TensorRT 7-10: "
           "trtSmToCask) or 'Target GPU SM ... is not supported by this TensorRT release'")


def release(ctx: Context) -> tuple[str, Version | None]:
    """The TensorRT release here as written, and as a version (frameworks.tensorrt.version,
    else the tensorrt / tensorrt-cuNN / nvidia-tensorrt package's)."""
    info: dict[str, Any] = (ctx.env.frameworks or {}).get("tensorrt") or {}
    text = str(info.get("version") or "")
    if not text:
        packages = ctx.packages
        text = next((v for n, v in sorted(packages.items())
                     if v and (_WHEEL.fullmatch(n) or n == "nvidia-tensorrt")), "")
    return text, Version.maybe(text.split("+")[0])


def check(ctx: Context) -> list[Finding]:
    """Each GPU (one per compute capability) against the TensorRT release's supported range."""
    text, ver = release(ctx)
    if ver is None or not ctx.known_ccs:
        return []
    row = next((r for r in ctx.matrix.rows("tensorrt_gpus")
                if VersionRange.parse(r["tensorrt"]).contains(ver)), None)
    if row is None:
        return []
    out: list[Finding] = []
    for gpu in ctx.known_ccs:
        if gpu.gpu_class == "jetson":
            continue
        if row.uncertain or str(gpu.cc) in (row.get("cc_uncertain") or []):
            out.append(unknown("tensorrt", f"TensorRT {text}: whether it has kernels for "
                               f"{gpu.label} (compute capability {gpu.cc}) is not known",
                               row=row, compute_capability=gpu.cc))
            continue
        side = _outside(row, gpu.cc)
        if side is not None:
            out.append(_unsupported(ctx, text, ver, gpu, row, side))
    return out


def _outside(row: Row, cc: CC) -> str | None:
    """'old' / 'new' when ``cc`` is outside the row's range (a range open upwards rules out
    no newer GPU), else None."""
    if row.get("min_cc") and cc < CC.parse(row["min_cc"]):
        return "old"
    if row.get("max_cc") and CC.parse(row["max_cc"]) < cc and \
            VersionRange.parse(row["tensorrt"]).upper() is not None:
        return "new"
    return None


def _unsupported(ctx: Context, text: str, ver: Version, gpu: GpuInfo, row: Row,
                 side: str) -> Finding:
    arch = f", {gpu.arch['name']}" if gpu.arch else ""
    if side == "old":
        why = f"its oldest supported compute capability is {row['min_cc']}"
    else:
        why = f"its newest supported compute capability is {row['max_cc']}"
    fits = [r for r in ctx.matrix.rows("tensorrt_gpus") if not r.uncertain
            and str(gpu.cc) not in (r.get("cc_uncertain") or [])
            and (not r.get("min_cc") or CC.parse(r["min_cc"]) <= gpu.cc)
            and (not r.get("max_cc") or gpu.cc <= CC.parse(r["max_cc"]))]
    return finding(
        "arch-unsupported", "error", "tensorrt",
        f"TensorRT {text} has no kernels for {gpu.label} (compute capability {gpu.cc}{arch}): "
        f"{why}, so {SYMPTOM}", fix=_fix(ctx, gpu, side, fits),
        source=cite(row, *[r for r in fits[:1] if r is not row]),
        compute_capability=gpu.cc, tensorrt=str(ver), min_cc=row.get("min_cc"),
        max_cc=row.get("max_cc"))


def _fix(ctx: Context, gpu: GpuInfo, side: str, fits: list[Row]) -> str:
    """The first release that supports the GPU (a newer GPU), or the last one (an older GPU),
    with the CUDA it needs named where the driver is known."""
    if not fits:
        return (f"no TensorRT release in the matrix supports compute capability {gpu.cc}: "
                "run the engine on a supported GPU")
    if side == "new":
        first = VersionRange.parse(fits[0]["tensorrt"]).lowest()
        cuda = ""
        if gpu.arch and gpu.arch.get("min_cuda"):
            cuda = (f" in a build for CUDA {gpu.arch['min_cuda']} or later (a build for an "
                    f"older CUDA cannot hold {gpu.cc.sm} code)")
        driver, _ = ctx.driver_cuda
        runs = f"; the driver here runs CUDA {driver}" if driver is not None else ""
        return (f"install TensorRT {first} or later{cuda}, the first releases with kernels "
                f"for compute capability {gpu.cc}{runs}; rebuild the engines with it")
    last = VersionRange.parse(fits[-1]["tensorrt"]).upper()
    until = f"a release before {last}" if last is not None else "an older release"
    return (f"install {until}, the last with kernels for compute capability {gpu.cc}, and "
            "rebuild the engines with it; or run TensorRT on a newer GPU")
