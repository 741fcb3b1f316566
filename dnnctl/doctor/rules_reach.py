"""Which release builds of a framework have code for the GPUs here.

- A framework whose version is unknown is still judged where every release the matrix knows
  agrees: a GPU that no certain row reaches (no cubin of its major with a minor <= its own,
  no PTX that can JIT to it) runs none of them, e.g. a compute capability 3.5 Kepler with
  any torch from 1.13 on ("The minimum cuda capability supported by this library is 3.7").
- Where no release build has code for a GPU, the only fix is a source build with the GPU in
  the build's arch list and a CUDA toolkit that still targets it; otherwise the fix names the
  newest release build with cubins for every GPU here.
"""

from __future__ import annotations

from dnnctl.compat.schema import Row
from dnnctl.compat.suggest import best_torch_fix, cubin_status, reach_row
from dnnctl.compat.versions import Version, VersionRange
from dnnctl.doctor import fixcheck, rules_gpu_hide, rules_jax, rules_platform
from dnnctl.doctor.context import Context, GpuInfo, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.rules_libraries import ARCH_VARIABLE, NO_KERNEL

TABLES = {"torch": "torch", "tensorflow": "tensorflow", "jax": "jax"}


def _release(table: str, row: Row) -> Version:
    """The release a row stands for (the low end of a JAX row's range)."""
    if table == "jax":
        return VersionRange.parse(row["jax"]).lowest()
    return Version.parse(row[table])


def _certain(ctx: Context, table: str) -> list[Row]:
    return [r for r in ctx.matrix.current(table) if not r.uncertain]


def span(ctx: Context, framework: str) -> str:
    """'1.13-2.15': the releases of ``framework`` the matrix has rows for."""
    table = TABLES[framework]
    known = sorted({_release(table, r) for r in ctx.matrix.current(table) if "arch_list" in r})
    return f"{known[0]}-{known[-1]}" if known else "none"


def unreached(ctx: Context, framework: str) -> list[GpuInfo]:
    """GPUs (one per compute capability) that no certain release row of ``framework`` reaches,
    neither by cubin nor by PTX; empty when some row's answer is uncertain for that GPU."""
    rows = _certain(ctx, TABLES[framework])
    out = []
    for gpu in ctx.known_ccs:
        answers = [reach_row(gpu.cc, r, ctx.platform) for r in rows]
        answers = [a for a in answers if a[2] is not None]  # rows with this platform's list
        if answers and all(got is None and not unsure for got, unsure, _ in answers):
            out.append(gpu)
    return out


def source_build_fix(ctx: Context, framework: str, gpu: GpuInfo) -> str:
    """A source build for a GPU no release build has code for (another GPU where the
    framework's own build does not accept it)."""
    floor = rules_gpu_hide.floor(ctx, framework, gpu.cc)
    if floor is not None:
        return rules_gpu_hide.floor_fix(framework, gpu, floor)
    arch = gpu.arch or {}
    sm = f"sm_{gpu.cc.major}{gpu.cc.minor}"
    var = ARCH_VARIABLE.get(framework)
    target = f"{var}=\"{gpu.cc}\"" if var else f"compute capability {gpu.cc} in its targets"
    cuda = (f"a CUDA toolkit that still targets {sm} (CUDA {arch['min_cuda']} to "
            f"{arch['last_cuda']})" if arch.get("last_cuda") else
            f"CUDA >= {arch['min_cuda']}" if arch.get("min_cuda") else "a CUDA toolkit for it")
    return (f"build {framework} from source with {target} and {cuda}: no {framework} release "
            f"build in the matrix ({span(ctx, framework)}) has code for {sm}")


def release_fix(ctx: Context, framework: str) -> str | None:
    """The newest release build with cubins for every GPU here (the source build when none
    has code for one of them); None when no GPU is known."""
    if not ctx.known_ccs:
        return None
    gone = unreached(ctx, framework) if framework in TABLES else []
    if gone:
        return source_build_fix(ctx, framework, gone[0])
    if framework == "torch":
        return best_torch_fix(ctx.matrix, ctx.known_ccs[0].cc, driver=ctx.driver,
                              platform=ctx.platform, windows=ctx.windows, python=ctx.python)
    if framework == "jax":
        return rules_jax.newest_fix(ctx)
    if framework == "tensorflow":
        return _tensorflow_fix(ctx)
    return None


def _tensorflow_fix(ctx: Context) -> str | None:
    """The newest TensorFlow with cubins for every GPU (on native Windows: <= 2.10) whose CUDA
    this driver runs; else the newest with cubins, with the driver it needs."""
    rows = sorted(_certain(ctx, "tensorflow"), key=lambda r: Version.parse(r["tensorflow"]),
                  reverse=True)
    fit = [r for r in rows if not (ctx.os_kind == "windows" and Version.parse(
        r["tensorflow"]) > rules_platform.TF_WINDOWS_LAST_GPU)
        and all(cubin_status(g.cc, r, ctx.platform) for g in ctx.known_ccs)]
    runs = [r for r in fit if not fixcheck.driver_problem(ctx, Version.parse(r["cuda"]))]
    if not fit:
        return None
    r = (runs or fit)[0]
    extra = f"[{r['pip_extra']}]" if r.get("pip_extra") else ""
    need = fixcheck.driver_problem(ctx, Version.parse(r["cuda"])) if not runs else None
    return (f"install TensorFlow {r['tensorflow']} (CUDA {r['cuda']}, cuDNN {r['cudnn']}), "
            f"whose release build has code for this GPU: `pip install "
            f"\"tensorflow{extra}=={r['tensorflow']}.*\"`" + (f" ({need})" if need else ""))


def no_build(ctx: Context, framework: str, what: str) -> list[Finding]:
    """A framework of unknown version on a GPU that no release build in the matrix reaches."""
    if framework not in TABLES:
        return []
    out = []
    for gpu in unreached(ctx, framework):
        sm = f"sm_{gpu.cc.major}{gpu.cc.minor}"
        out.append(finding(
            "arch-unsupported", "error", framework,
            f"{what}: no {framework} release build known to the matrix ({span(ctx, framework)}) "
            f"has code for {gpu.label} ({sm}, {gpu.arch['name'] if gpu.arch else 'unknown'}): "
            f"whichever of them this is, {NO_KERNEL}", fix=source_build_fix(ctx, framework, gpu),
            source=f"the arch lists of every {framework} row in the matrix (compat/"
            f"{'torch' if framework == 'torch' else 'frameworks'}.yaml): none has a cubin or PTX "
            f"that runs on {sm}", compute_capability=gpu.cc, releases=span(ctx, framework)))
    return out
