"""onnxruntime-gpu: the CUDA and cuDNN its CUDA execution provider loads, against what is here.

An onnxruntime-gpu build loads the CUDA libraries of one major (before CUDA 11: one
major.minor, libcudart.so.10.2) and the cuDNN of one major: 8.x and 9.x are not
interchangeable (ONNX Runtime's CUDA EP requirements). From 1.19 PyPI carries the CUDA 12 /
cuDNN 9 build; ONNX Runtime's own feed has the others (matrix table ``onnxruntime``). A torch
in the same environment brings its CUDA and cuDNN, which ONNX Runtime reuses. When the libraries
do not match, the provider fails to load and sessions fall back to the CPU.

Its TensorRT execution provider is built with one TensorRT major.minor per release (ONNX
Runtime's TensorRT EP requirements, matrix table ``onnxruntime_tensorrt``): with an older
TensorRT of that major it fails to load on a missing symbol, with another major on a missing
libnvinfer; a newer minor is not what the release was built and tested with.
"""

from __future__ import annotations

from typing import Any

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import Version, VersionRange, parse_cudnn
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.rules_libraries import loadable_majors
from dnnctl.doctor.stack import cudnn_found, torch_stack

PACKAGE = "onnxruntime-gpu"
INSTALL_DOCS = "https://onnxruntime.ai/docs/install/"
REQUIRE_MESSAGE = Version.parse("1.19")  # the release whose provider names what it requires


def check(ctx: Context) -> list[Finding]:
    """The installed onnxruntime-gpu's CUDA and TensorRT execution providers."""
    return _cuda_ep(ctx) + tensorrt_ep(ctx)


def _cuda_ep(ctx: Context) -> list[Finding]:
    """The installed onnxruntime-gpu against the CUDA runtimes and cuDNN majors found here."""
    packages = ctx.packages
    fw = (ctx.env.frameworks or {}).get("onnxruntime")
    info = fw or {}
    text = str(info.get("version") or packages.get(PACKAGE) or "")
    if (fw is None and PACKAGE not in packages) or ctx.os_kind == "macos":
        return []
    ver = Version.maybe(text)
    built = Version.maybe(info.get("cuda"))  # the build's own record beats the table
    if ver is None:
        return _version_unknown(ctx, packages, built)
    what = f"{PACKAGE} {text}"
    rows = [r for r in ctx.matrix.rows("onnxruntime") if not r.uncertain
            and VersionRange.parse(r["onnxruntime"]).contains(ver)]
    if built is not None:
        rows = [r for r in rows if _cuda_fits(built, Version.parse(r["cuda"]))] or \
            [_row_of(built, info)]
    if not rows:
        known = sorted(ctx.matrix.rows("onnxruntime"), key=_low)
        span = f" (it knows {_low(known[0])} to below {_high(known[-1])})" if known else ""
        return [finding("not-judged", "info", "onnxruntime", f"{what}: not in the matrix{span}; "
                        "which CUDA and cuDNN it loads was not judged", version=text)]
    cudas, cudnns = _cudas(ctx), cudnn_found(ctx, packages)
    fits = [r for r in rows if _fits(r, cudas, cudnns)]
    # which build is installed: its own record, else the one pip gets from PyPI
    installed = rows if built is not None else [r for r in rows if r["pypi"]] or rows
    if any(r in installed for r in fits):
        r = next(r for r in fits if r in installed)
        return [finding("ok", "info", "onnxruntime", f"{what}: {_build(r)}; "
                        + _found(cudas, cudnns), row=r or None)]
    row = installed[0]
    need_cuda, need_cudnn = Version.parse(row["cuda"]), _major(row["cudnn"])
    cuda_bad = cudas is not None and not any(_cuda_fits(v, need_cuda) for v in cudas)
    code = "cuda-mismatch" if cuda_bad else "cudnn-mismatch"
    said = ("'Failed to create CUDAExecutionProvider. Require "
            + (f"cuDNN {need_cudnn}.* and " if need_cudnn else "")
            + f"CUDA {need_cuda.major}.*', " if ver is not None and ver >= REQUIRE_MESSAGE else "")
    symptom = (f"the CUDA execution provider fails to load ({said}"
               + _missing(ctx, need_cuda if cuda_bad else None, need_cudnn)
               + ") and sessions run on the CPU")
    other = [r for r in fits if r not in installed]
    note = (f" ({text} also exists as {_build(other[0])}, on ONNX Runtime's own feed, which "
            "would fit)" if other else "")
    return [finding(
        code, "error", "onnxruntime",
        f"{what} is {_build(row)}, but {_found(cudas, cudnns)}: {symptom}{note}",
        fix=_fix(ctx, cudas, cudnns, row), row=row or None, needs_cuda=str(need_cuda),
        needs_cudnn=need_cudnn, cuda_found=[str(v) for v in cudas or []],
        cudnn_found=sorted(cudnns) if cudnns is not None else None)]


CHECK = ("python -c \"import onnxruntime as ort; print(ort.__version__, "
         "ort.get_available_providers())\"")


def _version_unknown(ctx: Context, packages: dict[str, str],
                     built: Version | None) -> list[Finding]:
    """An onnxruntime-gpu whose version is unknown, judged against every build the table
    knows (those of its own CUDA where the build records it): when none of them fits the CUDA
    and cuDNN here, no version can; when some do, which one is installed decides."""
    rows = [r for r in ctx.matrix.rows("onnxruntime") if not r.uncertain
            and (built is None or _cuda_fits(built, Version.parse(r["cuda"])))]
    what = f"{PACKAGE} (version unknown" + (f", a CUDA {_cuda_text(built)} build)" if built
                                            else ")")
    cudas, cudnns = _cudas(ctx), cudnn_found(ctx, packages)
    if not rows or (cudas is None and cudnns is None):
        return [finding("not-judged", "info", "onnxruntime", f"{what}: which CUDA and cuDNN "
                        "it loads depends on its version; not judged", fix=f"name its "
                        f"version, or run {CHECK}", source=INSTALL_DOCS)]
    builds = sorted({_kind(r) for r in rows}, reverse=True)
    fits = sorted({_kind(r) for r in rows if _fits(r, cudas, cudnns)}, reverse=True)
    if fits:
        others = [b for b in builds if b not in fits]
        return [finding(
            "not-judged", "info", "onnxruntime",
            f"{what}: its builds for {', '.join(fits)} fit what is here ({_found(cudas, cudnns)})"
            + (f", those for {', '.join(others)} do not" if others else "")
            + "; which one is installed was not judged", fix=f"name its version, or run {CHECK} "
            "(CUDAExecutionProvider must be listed)", source=INSTALL_DOCS,
            fits=fits, does_not_fit=others)]
    cuda_bad = cudas is not None and not any(
        _cuda_fits(v, Version.parse(r["cuda"])) for r in rows for v in cudas)
    newest = max(rows, key=lambda r: (r["pypi"], _low(r)))
    span = f"{_low(min(rows, key=_low))} to below {_high(max(rows, key=_high))}"
    # none at all: every build needs a CUDA runtime and cuDNN; else a release newer than the
    # table might fit, so the verdict is only as sure as the table
    nothing = cudas == [] or cudnns == set()
    return [finding(
        "cuda-mismatch" if cuda_bad else "cudnn-mismatch", "error" if nothing else "warning",
        "onnxruntime", f"{what}: no build the matrix knows ({span}) fits what is here "
        f"({_found(cudas, cudnns)}); they are built for {'; '.join(builds)}, so "
        + ("whatever its version" if nothing else "unless it is a newer release")
        + " the CUDA execution provider fails to load and sessions run on the CPU",
        fix=_fix(ctx, cudas, cudnns, newest, target="the current PyPI build"), row=newest,
        builds=builds, cuda_found=[str(v) for v in cudas or []],
        cudnn_found=sorted(cudnns) if cudnns is not None else None)]


def _kind(row: Row) -> str:
    """A build as "CUDA 12.x / cuDNN 9" (its CUDA, as libraries of it load, and cuDNN major)."""
    cudnn = _major(row["cudnn"])
    return f"CUDA {_cuda_text(Version.parse(row['cuda']))}" + (f" / cuDNN {cudnn}" if cudnn
                                                               else "")


def _row_of(cuda: Version, info: dict[str, Any]) -> Row:
    """A build the table has no row for, described by its own record (cuDNN unknown)."""
    row = Row({"onnxruntime": f"=={info.get('version')}", "cuda": str(cuda),
               "cudnn": str(info.get("cudnn") or ""), "pypi": False, "certainty": "V",
               "source": "the wheel's own record (onnxruntime/capi/build_and_package_info.py "
                         "cuda_version)"})
    row.file = "snapshot"
    return row


def _build(row: Row) -> str:
    where = "the PyPI build" if row["pypi"] else "a build"
    cudnn = f", cuDNN {_major(row['cudnn'])}" if _major(row["cudnn"]) else ""
    return f"{where} for CUDA {_cuda_text(Version.parse(row['cuda']))}{cudnn}"


def _cuda_text(v: Version) -> str:
    return f"{v.major}.x" if v.major >= 11 else str(v.trunc(2))


def _missing(ctx: Context, cuda: Version | None, cudnn: int | None) -> str:
    """The library load that fails: the CUDA runtime when ``cuda``, else cuDNN."""
    if ctx.os_kind == "windows":  # cudart64_12.dll / cudart64_102.dll, cudnn64_9.dll
        name = (f"cudart64_{cuda.major}{'' if cuda.major >= 11 else cuda.minor}.dll" if cuda
                else f"cudnn64_{cudnn}.dll")
        return f"'LoadLibrary failed with error 126' for {name}"
    name = (f"libcudart.so.{cuda.major if cuda.major >= 11 else cuda.trunc(2)}" if cuda
            else f"libcudnn.so.{cudnn}")
    return f"'{name}: cannot open shared object file'"


def _major(text: Any) -> int | None:
    v = parse_cudnn(text) if text else None
    return v.major if v is not None else None


def _cuda_fits(have: Version, need: Version) -> bool:
    """CUDA 11 and later: the same major (minor-version compatibility); before: major.minor."""
    if need.major >= 11:
        return have.major == need.major
    return have.trunc(2) == need.trunc(2)


def _fits(row: Row, cudas: list[Version] | None, cudnns: set[int] | None) -> bool:
    """Whether the libraries found here fit the row (unknown counts as fitting)."""
    need = Version.parse(row["cuda"])
    cuda_ok = cudas is None or any(_cuda_fits(v, need) for v in cudas)
    major = _major(row["cudnn"])
    return cuda_ok and (cudnns is None or major is None or major in cudnns)


def _found(cudas: list[Version] | None, cudnns: set[int] | None) -> str:
    parts = []
    if cudas is not None:
        parts.append("the CUDA here is " + (", ".join(_cuda_text(v) if v.major >= 11 else
                                                      str(v.trunc(2)) for v in cudas) or "none"))
    if cudnns is not None:
        parts.append("the cuDNN here is " + (", ".join(f"{m}.x" for m in sorted(cudnns))
                                             or "none"))
    return " and ".join(parts) or "which CUDA and cuDNN are installed here is not known"


def _cudas(ctx: Context) -> list[Version] | None:
    """CUDA runtimes that would load (None: none listed and no torch to bring one)."""
    found = [v for rt in ctx.env.cuda_runtimes
             if not f"{rt.source or ''} {rt.path or ''}".lower().startswith("pip:cupy")
             and "compat" not in f"{rt.source or ''} {rt.path or ''}".lower()
             and (v := Version.maybe(rt.version)) is not None]
    torch_cuda, _ = torch_stack(ctx)
    if torch_cuda is not None:
        found.append(torch_cuda)
    if not found and loadable_majors(ctx) is None:
        return None
    return sorted(set(found))


def _low(row: Row) -> Version:
    return VersionRange.parse(row["onnxruntime"]).lowest()


def _high(row: Row) -> Version:
    return VersionRange.parse(row["onnxruntime"]).upper() or _low(row)


def _spec(row: Row) -> str:
    return str(VersionRange.parse(row["onnxruntime"])).replace(" ", "")


def _fix(ctx: Context, cudas: list[Version] | None, cudnns: set[int] | None,
         current: Row, target: str = "the installed one") -> str:
    """The onnxruntime-gpu builds that fit the CUDA and cuDNN here (the newest, and the newest
    on PyPI), else the libraries the installed one needs."""
    # no CUDA runtime listed but a cuDNN found: the release line built for that cuDNN major
    # (its CUDA is said in the option), not only the libraries of the installed one
    by_cudnn = not cudas and bool(cudnns)
    rows = sorted((r for r in ctx.matrix.rows("onnxruntime") if not r.uncertain
                   and (by_cudnn or cudas is not None)
                   and _fits(r, None if by_cudnn else cudas, cudnns)),
                  key=lambda r: (_low(r), r["pypi"]), reverse=True)
    need_cuda, need_cudnn = Version.parse(current["cuda"]), _major(current["cudnn"])
    _, torch_cudnn = torch_stack(ctx)
    keep = (f" (torch here uses cuDNN {torch_cudnn.major}: keep that major)"
            if torch_cudnn is not None and need_cudnn and torch_cudnn.major != need_cudnn else "")
    libs = (f"install CUDA {_cuda_text(need_cuda)}" + (f" and cuDNN {need_cudnn}" if need_cudnn
                                                       else "") + f" for {target}")
    if not keep and need_cudnn and need_cuda.major >= 11:
        libs += f" (`pip install 'nvidia-cudnn-cu{need_cuda.major}=={need_cudnn}.*'`)"
    picks = rows[:1] + [r for r in rows[1:] if r["pypi"] and not rows[0]["pypi"]][:1]
    options = []
    for r in picks:
        if r["pypi"]:
            options.append(f"`pip install '{PACKAGE}{_spec(r)}'` ({_build(r)})")
        else:
            options.append(f"{_build(r)} of {PACKAGE} {_spec(r)} from ONNX Runtime's own "
                           f"package feed (see {INSTALL_DOCS})")
    return "; or ".join(options + [libs]) + keep


# where a snapshot records TensorRT: frameworks.tensorrt, else one of these pip packages
TENSORRT_PACKAGES = ("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt-cu11",
                     "tensorrt-libs", "tensorrt-cu12-libs", "tensorrt-cu11-libs",
                     "nvidia-tensorrt")
TENSORRT_DOWNLOAD = "https://developer.nvidia.com/tensorrt"


def tensorrt_ep(ctx: Context) -> list[Finding]:
    """ONNX Runtime's TensorRT execution provider against the TensorRT found here (nothing
    when no TensorRT is listed: the provider is then unused)."""
    packages = ctx.packages
    info = (ctx.env.frameworks or {}).get("onnxruntime")
    trt_info = (ctx.env.frameworks or {}).get("tensorrt")
    listed = [n for n in TENSORRT_PACKAGES if n in packages]
    if (info is None and PACKAGE not in packages) or (trt_info is None and not listed) \
            or ctx.os_kind == "macos":
        return []
    text = str((info or {}).get("version") or packages.get(PACKAGE) or "")
    ver = Version.maybe(text)
    row = next((r for r in ctx.matrix.rows("onnxruntime_tensorrt") if ver is not None
                and not r.uncertain and VersionRange.parse(r["onnxruntime"]).contains(ver)),
               None)
    if row is None:  # version unknown or beyond the table: the CUDA rule says which
        return []
    need = Version.parse(row["tensorrt"]).trunc(2)
    have = next((v for t in [(trt_info or {}).get("version")] + [packages[n] for n in listed]
                 if (v := Version.maybe(t)) is not None), None)
    what = f"{PACKAGE} {text}'s TensorRT execution provider (built with TensorRT {need})"
    install = _tensorrt_install(ctx, need)
    if have is None:
        return [finding(
            "not-judged", "warning", "onnxruntime",
            f"{what}: the TensorRT here is of unknown version; unless it is TensorRT {need}, "
            "the provider fails to load ('Failed to load library "
            f"{_trt_library(ctx)}') and sessions run on the CUDA provider or the CPU",
            fix=f"{_trt_check(bool(listed))}; if it is not {need}: {install}", row=row,
            tensorrt_needed=str(need))]
    if have.trunc(2) == need:
        return [finding("ok", "info", "onnxruntime", f"{what}: TensorRT {have} here", row=row)]
    older = have.major == need.major and have < need
    why = (f"its library needs symbols TensorRT {have.trunc(2)} lacks ('undefined symbol')"
           if older else f"it loads libnvinfer of TensorRT {need.major}, not {have.major}"
           if have.major != need.major else "it is not the TensorRT this release is built "
           "and tested with")
    fails = have.major != need.major or older
    other = _ort_for(ctx, have, packages, info or {})
    return [finding(
        "build-mismatch", "error" if fails else "warning", "onnxruntime",
        f"{what}, but the TensorRT here is {have}: {why}"
        + (f", so the provider fails to load ('Failed to load library {_trt_library(ctx)}')"
           if fails else ""),
        fix=install + (f"; or {other}" if other else ""), row=row,
        tensorrt_needed=str(need), tensorrt_found=str(have))]


def _tensorrt_install(ctx: Context, need: Version) -> str:
    path = "PATH" if ctx.os_kind == "windows" else "LD_LIBRARY_PATH"
    return (f"install TensorRT {need} ({TENSORRT_DOWNLOAD}) and put its lib folder first on "
            f"{path}")


def _trt_library(ctx: Context) -> str:
    return ("onnxruntime_providers_tensorrt.dll" if ctx.os_kind == "windows"
            else "libonnxruntime_providers_tensorrt.so")


def _trt_check(pip: bool) -> str:
    """How to learn the TensorRT version: its Python module, else its library's file name."""
    if pip:
        return "check its version: `python -c \"import tensorrt; print(tensorrt.__version__)\"`"
    return ("check its version (the libnvinfer.so.X.Y.Z / nvinfer DLL's version in its lib "
            "folder)")


def _ort_for(ctx: Context, trt: Version, packages: dict[str, str],
             info: dict[str, Any]) -> str | None:
    """The newest ONNX Runtime release line built with the TensorRT major.minor ``trt``."""
    rows = [r for r in ctx.matrix.rows("onnxruntime_tensorrt") if not r.uncertain
            and Version.parse(r["tensorrt"]).trunc(2) == trt.trunc(2)]
    if not rows:
        return None
    spec = _spec(max(rows, key=_low))
    if PACKAGE in packages or str(info.get("package") or PACKAGE) == PACKAGE:
        return f"`pip install '{PACKAGE}{spec}'` (built with TensorRT {trt.trunc(2)})"
    return (f"ONNX Runtime {spec}'s GPU release package (built with TensorRT {trt.trunc(2)}; "
            "https://github.com/microsoft/onnxruntime/releases)")
