"""The driver against one CUDA runtime or build: full support, minor-version compatibility,
forward compatibility, too old; and the driver upgrade a fix names.

``runtime_findings`` is shared by every rule that judges a CUDA build (frameworks, add-ons,
libraries); a driver known by its branch alone is judged where every driver of the branch
agrees (``_branch_runtime``), else said to depend on the exact version.
"""

from __future__ import annotations

from dnnctl.compat.drivers import driver_need
from dnnctl.compat.schema import Row
from dnnctl.compat.versions import Version
from dnnctl.doctor import rules_forward_compat
from dnnctl.doctor.context import Context, GpuInfo, finding, unknown
from dnnctl.doctor.model import Finding

BRANCH_FIX = ("give the exact version (`nvidia-smi --query-gpu=driver_version "
              "--format=csv,noheader`)")


def recommended_branch(ctx: Context, need: Version) -> str:
    """'R570 or newer (R580 is the LTSB)' for a minimum driver."""
    text = f"R{need.major} or newer"
    ltsb = sorted(r["branch"] for r in ctx.matrix.rows("driver_branches")
                  if r["type"] == "LTSB" and r["branch"] >= need.major)
    if ltsb and ltsb[0] != need.major:
        text += f"; R{ltsb[0]} is the long-term support branch"
    return text


def driver_fix(ctx: Context, need: Version) -> str:
    return f"install NVIDIA driver >= {need} ({recommended_branch(ctx, need)})"


def runtime_findings(ctx: Context, component: str, cuda: Version, *, what: str, jit: bool,
                     row: Row | None = None, alt_fix: str | None = None,
                     ptx_only: bool = False) -> list[Finding]:
    """The driver against one CUDA runtime: full support, minor-version compatibility
    (a warning when the component JIT-compiles PTX, an error when PTX is its only way onto
    the GPU), forward compatibility, or too old."""
    have, unsure = ctx.driver_cuda
    if ctx.tegra:  # Jetson: CUDA support comes with the JetPack release, not a driver number
        return []
    if ctx.driver is None and ctx.driver_span is not None and \
            not (ctx.env.driver or {}).get("cuda"):
        return _branch_runtime(ctx, component, cuda, what=what, jit=jit, row=row,
                               alt_fix=alt_fix, ptx_only=ptx_only)
    if ctx.driver is None:
        if have is None or have >= cuda.trunc(2):
            return []
        need_row = driver_need(ctx.matrix, cuda, windows=ctx.windows)
        if have.major == cuda.major:  # a driver reporting X.y is above the X.x floor
            # PTX a JIT user compiles with this toolkit needs a driver of its release
            full = need_row.full if jit or ptx_only else None
            why = (": PTX it JIT-compiles with this toolkit fails to load ('the provided PTX "
                   "was compiled with an unsupported toolchain', "
                   "cudaErrorUnsupportedPtxVersion) until the driver supports CUDA "
                   f"{cuda.trunc(2)}" if jit or ptx_only else "")
            return [finding("driver-mvc", "warning" if jit or ptx_only else "info", component,
                            f"{what} uses CUDA {cuda}; the driver supports CUDA {have}: "
                            f"minor-version compatibility only{why}",
                            fix=driver_fix(ctx, full) if full else None,
                            row=(need_row.release_row if full else None), cuda=cuda,
                            driver_cuda=have, required=full)]
        need = need_row.full or need_row.minimum
        return [finding("driver-too-old", "error", component, f"{what} needs CUDA {cuda}; the "
                        f"driver supports CUDA {have}", fix=driver_fix(ctx, need) if need else
                        None, row=need_row.release_row or need_row.major_row or row, cuda=cuda,
                        driver_cuda=have, required=need)]
    need_row = driver_need(ctx.matrix, cuda, windows=ctx.windows)
    rel, major = need_row.release_row, need_row.major_row
    if major is None:
        return [unknown(component, f"{what}: CUDA {cuda.major}.x has no row in the matrix",
                        cuda=cuda, driver=ctx.driver)]
    if need_row.minimum is None:
        os_name = "Windows" if ctx.windows else "Linux"
        return [unknown(component, f"{what}: the matrix has no {os_name} driver minimum for CUDA "
                        f"{cuda if not need_row.mvc else str(cuda.major) + '.x'}",
                        row=rel or major, cuda=cuda, driver=ctx.driver)]
    floor = need_row.minimum
    ev = {"cuda": cuda, "driver": ctx.driver, "driver_cuda": have}
    if need_row.full is not None:
        full_need = need_row.full
        if need_row.fully_supported(ctx.driver, have):
            return []
    else:
        full_need = None
        if ctx.driver >= floor and not (have is not None and have >= cuda.trunc(2)):
            return [unknown(component, f"{what}: the full-support driver for CUDA {cuda} is not "
                            f"known; driver {ctx.driver} is above the CUDA {cuda.major}.x "
                            f"minor-version floor {floor}", row=rel or major, **ev)]
        if have is not None and have >= cuda.trunc(2) and not unsure:
            return []
    if not need_row.mvc and ctx.driver >= floor:
        return []  # pre-MVC: the release's own driver is the one and only minimum
    cite = rel or major
    if need_row.mvc and ctx.driver >= floor and have is not None and have.major >= cuda.major:
        sev, why = _mvc_effect(ptx_only, jit)
        fix = driver_fix(ctx, full_need) if full_need else None
        stuck = _stuck(ctx, full_need)
        if fix and stuck:  # the driver that would fully support it does not exist here
            last = stuck[0].arch["last_driver_branch"]
            fix = (f"use CUDA <= {ctx.newest_cuda_of_branch(last)} for full support (a driver >= "
                   f"{full_need} does not support {stuck[0].arch['name']}: R{last} is its last "
                   "branch)")
        return [finding("driver-mvc", sev, component,
                        f"{what} uses CUDA {cuda}, but driver {ctx.driver} fully supports CUDA "
                        f"{have} only, so it runs through minor-version compatibility.{why}",
                        fix=fix, row=cite, **ev)]
    need = full_need or floor
    fix = _too_old_fix(ctx, cuda, need, have, alt_fix)
    return [rules_forward_compat.gpus_unknown(ctx, cuda, finding(
                    "driver-too-old", "error", component,
                    f"{what} needs CUDA {cuda}: driver {ctx.driver} supports CUDA "
                    f"{have or 'below ' + str(cuda.major)} and is below the CUDA "
                    f"{str(cuda.major) + '.x' if need_row.mvc else cuda} minimum {floor}"
                    if ctx.driver < floor else
                    f"{what} needs CUDA {cuda}: driver {ctx.driver} supports up to CUDA {have}",
                    fix=fix, row=cite, required=need, **ev))]


def _too_old_fix(ctx: Context, cuda: Version, need: Version, have: Version | None,
                 alt_fix: str | None) -> str:
    """A driver >= ``need``; the build's own alternative first where no such driver exists
    for a GPU here; cuda-compat across majors on data-center GPUs."""
    fix = driver_fix(ctx, need)
    stuck = _stuck(ctx, need)
    if stuck and alt_fix:  # the newer driver does not exist for this GPU: lead with the build
        g = stuck[0]
        fix = (f"{alt_fix} (a driver >= {need} does not support {g.arch['name']}: "
               f"R{g.arch['last_driver_branch']} is its last branch)")
        alt_fix = None
    if have is None or cuda.major > have.major:
        fc = ctx.matrix.forward_compat()
        if ctx.fc_usable(cuda) and fc is not None:
            pkg = fc["package"].format(major=cuda.major, minor=cuda.minor)
            fix += f"; or, on these data-center GPUs, install {pkg} (forward compatibility)"
        elif fc is not None and ctx.gpus:
            fix += " (the cuda-compat forward-compatibility package is not an option: it " \
                   "works on data-center GPUs only and fails with error 804 elsewhere)"
    if alt_fix:
        fix += f"; or {alt_fix}"
    return fix


def _branch_runtime(ctx: Context, component: str, cuda: Version, *, what: str, jit: bool,
                    row: Row | None, alt_fix: str | None, ptx_only: bool) -> list[Finding]:
    """runtime_findings for a driver known by its branch alone: judged where every driver of
    the branch agrees (all at or past a minimum, or all below it), else said to depend on the
    exact version, never guessed."""
    need = driver_need(ctx.matrix, cuda, windows=ctx.windows)
    branch, label = ctx.driver_branch, ctx.driver_label
    if need.major_row is None or need.minimum is None:
        return [unknown(component, f"{what}: the matrix has no driver minimum for CUDA "
                        f"{cuda.major}.x" if need.major_row is None else
                        f"{what}: the matrix has no driver minimum for CUDA {cuda}",
                        row=need.release_row or need.major_row, cuda=cuda,
                        driver_branch=branch)]
    full = ctx.driver_at_least(need.full) if need.full is not None else None
    if full is True:
        return []
    floor = ctx.driver_at_least(need.minimum)
    lo, hi = ctx.branch_cuda()
    ev = {"cuda": cuda, "driver_branch": branch, "driver_cuda": lo}
    cite = need.release_row or need.major_row
    if floor is False:  # every driver of the branch is below the minimum
        fix = _too_old_fix(ctx, cuda, need.full or need.minimum, hi, alt_fix)
        return [rules_forward_compat.gpus_unknown(ctx, cuda, finding(
            "driver-too-old", "error", component,
            f"{what} needs CUDA {cuda}: a driver {label} supports CUDA "
            f"{hi or 'below ' + str(cuda.major)} at most and is below the CUDA "
            f"{str(cuda.major) + '.x' if need.mvc else cuda} minimum {need.minimum}",
            fix=fix, row=cite, required=need.full or need.minimum, **ev))]
    if floor is None or not need.mvc:  # the branch spans the minimum: its exact version says
        return [unknown(
            component, f"{what} needs driver >= {need.minimum}"
            + (f" (CUDA {cuda.major}.x minor-version compatibility)" if need.mvc else "")
            + f"; drivers of the R{branch} branch before it are too old, and the exact "
            "version of this one is not in the snapshot", row=cite,
            fix=f"{BRANCH_FIX}; if it is older, {driver_fix(ctx, need.minimum)}",
            required=need.minimum, **ev)]
    # every driver of the branch runs it through minor-version compatibility at least
    sev, why = _mvc_effect(ptx_only, jit)
    if full is False:
        return [finding("driver-mvc", sev, component,
                        f"{what} uses CUDA {cuda}, but a driver {label} fully supports CUDA "
                        f"{hi} at most, so it runs through minor-version compatibility.{why}",
                        fix=driver_fix(ctx, need.full) if need.full else None, row=cite, **ev)]
    if sev == "info":  # full support or minor-version compatibility: prebuilt code runs either way
        return []
    return [unknown(component, f"{what} uses CUDA {cuda}: drivers of the R{branch} branch from "
                    f"{need.full} fully support it, earlier ones only through minor-version "
                    f"compatibility.{why} The exact version of this one is not in the snapshot",
                    row=cite, fix=f"{BRANCH_FIX}; if it is older, {driver_fix(ctx, need.full)}",
                    required=need.full, **ev)]


def _stuck(ctx: Context, need: Version | None) -> list[GpuInfo]:
    """GPUs whose architecture no driver >= ``need`` supports (past its last branch)."""
    return [g for g in ctx.gpus if need is not None and g.arch
            and g.arch.get("last_driver_branch") is not None
            and need.major > g.arch["last_driver_branch"]]


def _mvc_effect(ptx_only: bool, jit: bool) -> tuple[str, str]:
    """(severity, the sentence saying why) of a program running through minor-version
    compatibility: an error where its only code for the GPU is PTX, a warning where it
    JIT-compiles PTX, else information."""
    if ptx_only:
        return "error", (" Its only code for this GPU is PTX, and a driver older than the "
                         "toolkit cannot JIT that PTX (cudaErrorUnsupportedPtxVersion).")
    if jit:
        return "warning", (" PTX it JIT-compiles can fail with 'the provided PTX was compiled "
                           "with an unsupported toolchain' (cudaErrorUnsupportedPtxVersion).")
    return "info", " Prebuilt kernels work; features needing the newer driver do not."
