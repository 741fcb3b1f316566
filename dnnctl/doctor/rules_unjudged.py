"""What no other rule judged is said to be not judged, never shown as a pass.

Runs last, over the findings of every other rule:

- a driver that is present but of unknown version (``driver: {present: true}``): nothing was
  compared with it (one that reports only the CUDA it supports: that CUDA was, the driver
  itself was not);
- CUDA runtimes with no driver version (nor the CUDA the driver reports) to run them on, and
  cuDNN / cuBLAS / NCCL / ... copies with neither a driver nor a GPU behind them;
- a package that ships CUDA code that no rule judged: a ``gpu_packages`` row of the matrix
  (compat/libraries.yaml: what its build is tied to, and how to check it), a name that says
  it is for CUDA (-gpu, -cuNN, -cudaNN, *cuda*), or an entry of ``extensions``; CUDA's own
  library wheels (nvidia-*-cuNN), grouped per major, where nothing that loads them was judged;
- an ``ok`` finding carries no fix (a numbered command under a pass reads as something to
  run), and every ``not-judged`` finding says what would let it be judged.
"""

from __future__ import annotations

import re

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import Version
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.parse import canonical_name
from dnnctl.doctor.rules_graph import PYG

DRIVER_FIX = ("give the driver's version (driver: {version: ...}; on the machine: "
              "`nvidia-smi --query-gpu=driver_version --format=csv,noheader`)")
# a distribution whose name says it is a CUDA build: -gpu, -cuXYZ, -cudaXY(x), or *cuda*
_CUDA_NAME = re.compile(r".+-(gpu|cu\d{2,3}|cuda\d{2,3}x?)|.*cuda.*")
_CU_WHEEL = re.compile(r"-cu\d+$")
# CUDA's own library wheels (nvidia-cublas-cu12): judged through what loads them
_NVIDIA_WHEEL = re.compile(r"nvidia-.+-cu(\d+)")
# what loads CUDA's library wheels: a finding of one of these judged them
_LOADERS = {"torch", "tensorflow", "jax", "cupy", "onnxruntime", "paddlepaddle-gpu", "cuda",
            "cudnn", "cublas", "nccl", "nvjitlink", "nvrtc", "tensorrt", "ctranslate2"}
# frameworks whose rules judge the cuDNN / cuBLAS / NCCL / ... copies they load
_JUDGED_FOR = {"torch", "tensorflow", "tensorflow-gpu", "jax", "jaxlib", "cupy", "onnxruntime",
               "onnxruntime-gpu", "paddlepaddle-gpu", "ctranslate2"}
NO_SOURCE = "source not given"
_LIBRARIES = ("cudnn", "cublas", "nccl", "nvjitlink", "nvrtc", "ptxas")


def check(ctx: Context, findings: list[Finding]) -> list[Finding]:
    """Not-judged findings for what the others left silent (``findings`` is also tidied)."""
    for f in findings:
        if f.code == "ok":
            f.fix = None
    judged = {f.component for f in findings}
    said = " ".join(f.message.lower() for f in findings)
    out = _driver(ctx, judged) + _runtimes(ctx, judged) + _gpus(ctx, judged)
    out += _unloaded(ctx, judged | {f.component for f in out}) + _packages(ctx, judged, said)
    for f in findings + out:
        if f.code == "not-judged" and not f.fix:
            f.fix = _next_step(f)
    return out


def _driver(ctx: Context, judged: set[str]) -> list[Finding]:
    drv = ctx.env.driver or {}
    if ctx.driver is not None or ctx.driver_present is False or "driver" in judged:
        return []
    if drv.get("cuda") and ctx.driver_branch is not None:
        return [finding("not-judged", "info", "driver", f"the driver reports CUDA "
                        f"{drv['cuda']} and is of the R{ctx.driver_branch} branch; its exact "
                        "version is not in the snapshot: CUDA was judged against what it "
                        "reports, the driver against each GPU by its branch only",
                        fix=DRIVER_FIX, driver_branch=ctx.driver_branch)]
    if drv.get("cuda"):  # what the driver reports is judged against; the driver itself is not
        return [finding("not-judged", "info", "driver", f"the driver reports CUDA "
                        f"{drv['cuda']}, but its version is not in the snapshot: CUDA was "
                        "judged against that, the driver itself (its branch against each "
                        "GPU) was not", fix=DRIVER_FIX)]
    if ctx.driver_present is not True:
        if ctx.driver_present is None and drv:  # e.g. only the libcuda path is known
            return [finding("not-judged", "info", "driver", "the driver's version is not in "
                            "the snapshot (nor whether one is loaded): nothing here was judged "
                            "against it", fix=DRIVER_FIX)]
        return []
    return [finding("not-judged", "info", "driver", "an NVIDIA driver is present, but its "
                    "version is not in the snapshot: nothing here was judged against it",
                    fix=DRIVER_FIX)]


def _runtimes(ctx: Context, judged: set[str]) -> list[Finding]:
    """CUDA with no driver version to judge it on; libraries with neither a driver nor a
    GPU. Not where the driver is known to be absent: the no-driver error says why nothing
    can run, and there is no version to ask for."""
    if ctx.driver_present is False:
        return []
    no_driver = ctx.driver_span is None and not (ctx.env.driver or {}).get("cuda")
    out: list[Finding] = []
    if no_driver and "cuda" not in judged:
        for rt in ctx.env.cuda_runtimes:
            if Version.maybe(rt.version) is None:
                continue
            out.append(finding(
                "not-judged", "info", "cuda", f"CUDA {rt.version} ({rt.source or NO_SOURCE}): "
                "the snapshot has no driver version, so whether the driver runs this "
                "CUDA was not judged", fix=DRIVER_FIX, cuda=rt.version))
    if not no_driver or ctx.gpus:
        return out
    for name in _LIBRARIES:
        copies = ctx.env.cudnn if name == "cudnn" else ctx.env.libraries.get(name, [])
        if copies and name not in judged:
            versions = ", ".join(c.version or "version unknown" for c in copies)
            out.append(finding(
                "not-judged", "info", name, f"{name} {versions}: the snapshot names no driver "
                "and no GPU, so nothing was judged against them",
                fix="add the GPU and driver (gpus: [{name: ...}], driver: {version: ...}), or "
                "run `dnnctl doctor` on the machine itself"))
    return out


def _gpus(ctx: Context, judged: set[str]) -> list[Finding]:
    """GPUs listed where no driver is loaded: no rule judged them (the no-driver error says
    why nothing runs), so they are never shown as a pass."""
    if not ctx.env.gpus or "gpu" in judged or ctx.driver_present is not False:
        return []
    names = ", ".join(dict.fromkeys(g.label for g in ctx.gpus))
    return [finding("not-judged", "info", "gpu", f"{names}: no NVIDIA driver is loaded, so "
                    "nothing here was judged against the GPUs",
                    fix="load the NVIDIA driver (the driver's finding says how), then judge "
                    "again")]


def _unloaded(ctx: Context, judged: set[str]) -> list[Finding]:
    """cuDNN / cuBLAS / NCCL / nvJitLink / NVRTC copies no rule said anything about, with
    nothing in the snapshot that loads them: what they are judged for (the build a framework
    needs, which copy it loads first) is not there, so they are not judged (never a pass)."""
    names = {canonical_name(n) for n in (ctx.env.packages or {})}
    if ctx.driver_present is False or (set(ctx.env.frameworks or {}) | names) & _JUDGED_FOR:
        return []
    out = []
    for name in _LIBRARIES[:-1]:  # ptxas is judged against the GPUs themselves
        copies = ctx.env.cudnn if name == "cudnn" else ctx.env.libraries.get(name, [])
        if copies and name not in judged:
            versions = ", ".join(c.version or "version unknown" for c in copies)
            out.append(finding(
                "not-judged", "info", name, f"{name} {versions}: nothing in the snapshot loads "
                "it (no framework), so it was not judged: the version a framework needs and the "
                "copy it loads first are judged for that framework",
                fix="give the framework that uses it (frameworks: {torch: {version: ...}}), or "
                "run `dnnctl doctor` where it runs"))
    return out


def _packages(ctx: Context, judged: set[str], said: str) -> list[Finding]:
    """Each GPU package (or compiled extension) no rule said anything about (no finding of
    its component, none naming it): a ``gpu_packages`` row's package with what its build is
    tied to, any other whose name says it is a CUDA build, CUDA's own library wheels grouped."""
    packages = ctx.packages
    for name, info in (ctx.env.extensions or {}).items():
        packages.setdefault(canonical_name(name), str((info or {}).get("version") or ""))
    rows = _rows(ctx)
    out: list[Finding] = []
    wheels: dict[int, list[str]] = {}
    for name, version in sorted(packages.items()):
        row = rows.get(name) or rows.get(_CU_WHEEL.sub("", name))
        extension = any(canonical_name(n) == name for n in ctx.env.extensions or {})
        if row is None and not extension and not _CUDA_NAME.fullmatch(name):
            continue
        if name in PYG and "torch" in judged:
            continue  # judged against torch by the pyg_wheels table (silent where they fit)
        if _covered(name, judged) or re.search(rf"\b{re.escape(name)}\b", said):
            continue
        wheel = _NVIDIA_WHEEL.fullmatch(name)
        if row is None and not extension and wheel:
            if not (judged & _LOADERS) and not _loaded(ctx, name):
                wheels.setdefault(int(wheel.group(1)), []).append(name)
            continue  # judged with what loads it
        what = f"{name} {version}" if version else f"{name} (version unknown)"
        if row is not None:
            message = (f"{what} ships CUDA code built for {row['built_for']}; it was not "
                       "judged here (" + ("its version, or the row for it, is missing"
                                          if row.get("tabled") else
                                          "the matrix has no table of its builds") + ")")
            out.append(finding("not-judged", "info", name, message, fix=row["check"],
                               row=row, package=name, version=version or None))
            continue
        kind = ("a compiled extension" if extension else
                "a CUDA build (its name says so)" if _CUDA_NAME.fullmatch(name).group(1)
                else "named for CUDA")
        out.append(finding(
            "not-judged", "info", name, f"{what} is {kind}; the matrix has no row for it, so "
            "it was not judged", fix="check by hand that it was built for the CUDA (and torch) "
            "installed here, or add a row for it with --matrix extra.yaml (see "
            "compat/README.md)", package=name, version=version or None))
    for major, names in sorted(wheels.items()):
        out.append(finding(
            "not-judged", "info", "packages", f"{', '.join(names)}: CUDA {major} library "
            "wheels; they are judged with what loads them (a framework) and the driver, and "
            "this snapshot has neither, so they were not judged", fix="give the framework "
            "that uses them (frameworks: {torch: {version: ...}}) and the driver's version",
            packages=names))
    return out


def _rows(ctx: Context) -> dict[str, Row]:
    """gpu_packages rows by each name they cover."""
    out: dict[str, Row] = {}
    for row in ctx.matrix.rows("gpu_packages"):
        if not row.uncertain:
            for n in [row["package"], *(row.get("packages") or [])]:
                out.setdefault(canonical_name(n), row)
    return out


def _loaded(ctx: Context, name: str) -> bool:
    """Whether a listed runtime or library copy comes from this wheel (pip:<name>)."""
    copies = [*ctx.env.cuda_runtimes, *ctx.env.cudnn,
              *(c for cs in (ctx.env.libraries or {}).values() for c in cs)]
    return any(canonical_name((c.source or "").removeprefix("pip:")) == name for c in copies)


def _covered(name: str, judged: set[str]) -> bool:
    """Whether a finding speaks for the package (its own name, or its framework's)."""
    name = name.rsplit("/", 1)[-1]  # @tensorflow/tfjs-node-gpu: its component is tfjs-node-gpu
    base = re.sub(r"-(gpu|cu\d+|cuda\d+x?)$", "", re.sub(r"-(libs|bindings)$", "", name))
    stems = {name, base, base.replace("paddlepaddle", "paddle")}
    if re.fullmatch(r"jax-cuda\d+-(plugin|pjrt)", name):
        stems.add("jax")
    if name.startswith(("cupy-", "tensorflow-", "tf-nightly")):
        stems |= {"cupy", "tensorflow"}
    if name.startswith("tensorrt-"):  # tensorrt-cu12, -libs, -lean-cu12: rules_tensorrt's
        stems.add("tensorrt")
    if name in ("triton", "pytorch-triton"):  # its ptxas judged against the GPUs
        stems.add("ptxas")
    return bool(stems & judged)


def _next_step(f: Finding) -> str:
    if f.component in ("torch", "tensorflow", "jax", "cupy"):
        return (f"give its version (frameworks.{f.component}.version), or run `dnnctl doctor` "
                "where it is installed")
    return ("give the missing version in the snapshot, or run `dnnctl doctor` on the machine "
            "itself")
