"""ptxas copies that JIT compilers run (``libraries.ptxas``), against the GPUs here.

Triton and XLA (JAX, TensorFlow) turn their PTX into cubins with a ``ptxas`` binary — Triton
its bundled copy (or ``TRITON_PTXAS_PATH``), XLA the one it finds beside its CUDA libraries or
on PATH. ptxas assembles only for the targets of its own CUDA release (matrix table
``cuda_releases``, ``targets``): an older one refuses a newer GPU with ``ptxas fatal : Value
'sm_89' is not defined for option 'gpu-name'`` (triton-lang/triton#1121, Triton 2.0 on an RTX
4090), whatever the framework's own cubins can do.
"""

from __future__ import annotations

from dnnctl.compat.drivers import driver_need
from dnnctl.compat.versions import CC, Version
from dnnctl.doctor import rules_triton
from dnnctl.doctor.context import Context, GpuInfo, finding, unknown
from dnnctl.doctor.model import Component, Finding
from dnnctl.doctor.rules_runtime import driver_fix

SYMPTOM = ("JIT-compiled kernels (torch.compile / Triton, XLA) fail with 'ptxas fatal : Value "
           "'sm_{sm}' is not defined for option 'gpu-name''")
SOURCE = ("triton-lang/triton#1121 (Triton 2.0's ptxas: 'Value 'sm_89' is not defined for "
          "option 'gpu-name''); triton-lang/triton#1574 (the bundled ptxas bumped to CUDA "
          "12.1.105); conda-forge/triton-feedstock recipe/build.sh (TRITON_PTXAS_PATH)")


def check(ctx: Context) -> list[Finding]:
    """Each ptxas listed, and Triton's bundled one where the snapshot does not give its
    version: inferred from the Triton release, or the torch that pins it (rules_triton)."""
    out: list[Finding] = []
    copies = (ctx.env.libraries or {}).get("ptxas") or []
    unversioned = None
    for copy in copies:
        if rules_triton.is_triton(copy) and Version.maybe(copy.version) is None:
            unversioned = unversioned or copy
            continue
        out += _one(ctx, copy)
    # a Triton copy with its version already says which ptxas Triton runs
    if not any(rules_triton.is_triton(c) and Version.maybe(c.version) for c in copies):
        out += rules_triton.check(ctx, unversioned)
    return out


def _one(ctx: Context, copy: Component) -> list[Finding]:
    where = copy.path or copy.source or "ptxas"
    version = Version.maybe(copy.version)
    if version is None:
        return [finding("not-judged", "info", "ptxas", f"ptxas at {where}: version unknown, so "
                        "which GPUs it can assemble for was not judged")]
    release = ctx.matrix.cuda_release(version)
    if release is None or release.uncertain:
        return [unknown("ptxas", f"ptxas {version} ({where}): CUDA {version.trunc(2)} has no "
                        "(certain) row in the matrix", row=release, ptxas=version)]
    targets = set(release["targets"])
    out: list[Finding] = []
    for gpu in ctx.known_ccs:
        if str(gpu.cc) in targets:
            continue
        sm = f"{gpu.cc.major}{gpu.cc.minor}"
        newer = gpu.cc > max(CC.parse(t) for t in targets)
        out.append(finding(
            "arch-unsupported", "error", "ptxas",
            f"ptxas {version} ({where}) is from CUDA {version.trunc(2)}, which "
            f"{'does not know' if newer else 'no longer targets'} {gpu.label} (sm_{sm}): "
            + SYMPTOM.format(sm=sm), fix=_fix(copy, gpu), row=release, source=SOURCE,
            ptxas=version, compute_capability=gpu.cc, targets=list(release["targets"])))
    out += _driver(ctx, copy, version, where)
    if not [f for f in out if f.severity != "info"] and ctx.known_ccs:
        out.append(finding("ok", "info", "ptxas", f"ptxas {version} ({where}) can assemble for "
                           + ", ".join(f"sm_{g.cc.major}{g.cc.minor}" for g in ctx.known_ccs),
                           row=release))
    return out


DRIVER_SOURCE = (
    "XLA's nvptx_compiler.cc ('The NVIDIA driver's CUDA version is 12.2 which is older than "
    "the ptxas CUDA version (12.3.107). Because the driver is older than the ptxas version, "
    "XLA is disabling parallel compilation, which may slow down compilation. You should update "
    "your NVIDIA driver or use the NVIDIA-provided CUDA forward compatibility packages.', as "
    "quoted in jax-ml/jax#19821); CUDA Compatibility guide, minor version compatibility (within "
    "one CUDA major only), https://docs.nvidia.com/deploy/cuda-compatibility/")


def _driver(ctx: Context, copy: Component, version: Version, where: str) -> list[Finding]:
    """A ptxas newer than the CUDA the driver supports: XLA compiles serially then (a newer
    minor), and cubins of a newer CUDA major do not load at all."""
    have, unsure = ctx.driver_cuda
    mine = version.trunc(2)
    if have is None or unsure or mine <= have:
        return []
    need = driver_need(ctx.matrix, mine, windows=ctx.windows)
    floor = need.full or need.minimum
    pin = (f"pip install 'nvidia-cuda-nvcc-cu{have.major}=={have}.*'"
           if "pip:" in (copy.source or "") else f"the ptxas of a CUDA {have} toolkit first")
    drv = driver_fix(ctx, floor) if floor else "a newer driver"
    if mine.major > have.major:
        what = (f"its cubins are CUDA {mine.major} code, which minor-version compatibility does "
                f"not carry to a driver for CUDA {have}: kernels it assembles (XLA, Triton) can "
                "fail to load ('device kernel image is invalid')")
    else:
        what = ("XLA (JAX, TensorFlow) then turns off parallel compilation ('the driver is "
                "older than the ptxas version, XLA is disabling parallel compilation'), so "
                "every compile is slower")
    return [finding("ptxas-newer-driver", "warning", "ptxas",
                    f"ptxas {version} ({where}) is from CUDA {mine}, newer than the CUDA {have} "
                    f"the driver supports: {what}",
                    fix=f"{drv} (CUDA {mine}), or a ptxas no newer than CUDA {have} ({pin})",
                    source=DRIVER_SOURCE, ptxas=version, driver_cuda=have)]


def _fix(copy: Component, gpu: GpuInfo) -> str:
    arch = gpu.arch or {}
    need = f"CUDA >= {arch['min_cuda']}" if arch.get("min_cuda") else "a CUDA release that " \
        "lists this GPU"
    if arch.get("last_cuda"):
        need += f" and <= {arch['last_cuda']}"
    where = f"{copy.source or ''} {copy.path or ''}".lower()
    if "triton" in where:
        return (f"a Triton whose bundled ptxas is {need} (pip install -U triton, with a torch "
                f"that allows it), or point TRITON_PTXAS_PATH at the ptxas of a {need} toolkit")
    if "jax" in where or "xla" in where or "nvcc" in where:
        wheel = f"nvidia-cuda-nvcc-cu{Version.parse(arch['min_cuda']).major}" \
            if arch.get("min_cuda") else "nvidia-cuda-nvcc-cu12"
        return (f"put the ptxas of {need} first (pip install -U '{wheel}', or a newer CUDA "
                "toolkit's bin directory first on PATH)")
    return f"use the ptxas of {need} (a newer CUDA toolkit's bin directory first on PATH)"
