"""cuDNN rules: does a framework's cuDNN support the GPU, and which copy loads first."""

from __future__ import annotations

import re

from dnnctl.compat.versions import CC, Version, parse_cudnn
from dnnctl.doctor.context import Context, finding, unknown
from dnnctl.doctor.model import Component, Finding

SHADOW_SOURCES = ("env:", "system:")  # copies found through LD_LIBRARY_PATH / the system
BUNDLED_SOURCES = ("pip:", "torch:")  # the framework's own copy (a wheel's nvidia-cudnn)
# cuDNN's documented promise (x.y runs apps built against x.z, z <= y) is the same for 8 and 9;
# what differs is how the library finds its sub-libraries.
CUDNN8_MIX_SOURCE = (
    "pytorch/pytorch#119989 (torch 2.2.0 with its 8.9.2.26 + system 8.9.4 on LD_LIBRARY_PATH; "
    "ptrblck: 'a dlopen call inside libcudnn preferring the system-wide libs over the ones "
    "coming from the PyPI package ... The change landed in cuDNN9'); pytorch/pytorch#104808 "
    "(built with 8.8.1, crashes with 8.9.2 on the system)")


# TensorFlow's own check at start changed in 1.8: up to 1.7 the loaded cuDNN's "compatibility
# version" (its major.minor) had to equal the build's; from 1.8 (cudnn_version.cc) the same
# major with a minor at least the build's loads.
TF_CUDNN_SAME_MINOR_BEFORE = Version.parse("1.8")
TF_CUDNN_RULE_SOURCE = (
    "tensorflow/stream_executor/cuda/cuda_dnn.cc CudnnSupport::Init: up to TF 1.7 the loaded "
    "cuDNN's 'compatibility version' (major.minor) must equal the build's (tensorflow/models#5943, "
    "TF 1.7: 'Loaded runtime CuDNN library: 7103 (compatibility version 7100) but source was "
    "compiled with 7005 (compatibility version 7000)'; tensorflow/tensorflow#17566, 1.6.0 with "
    "cuDNN 7.1); from TF 1.8 IsSourceCompatibleWithCudnnLibrary (cudnn_version.cc): same major, "
    "minor >= the build's ('CuDNN library major and minor version needs to match or have higher "
    "minor version in case of CuDNN 7.0 or later version'), read in the 1.8.0-rc1 sources "
    "(tensorflow/core/public/version.h) of the imdone/tensorflow fork")


def tf_same_minor(version: object) -> bool | None:
    """Whether a TensorFlow release needs the loaded cuDNN's major.minor to equal its build's
    (before 1.8); None when the release is unknown (both rules are then named)."""
    ver = Version.maybe(version)
    return None if ver is None else ver < TF_CUDNN_SAME_MINOR_BEFORE


def gpu_support(ctx: Context, component: str, what: str, cudnn: Version, cuda: Version,
                fix: str | None = None, cuda_known: bool = True) -> list[Finding]:
    """The cuDNN line ``cudnn`` (run with CUDA ``cuda``) against every GPU's CC;
    ``cuda_known`` False: ``cuda`` is only the build's floor, the runtime's own version is not
    in the snapshot, so a GPU that needs a newer runtime is not judged (never assumed)."""
    rows = ctx.matrix.cudnn_rows(cudnn, cuda.major)
    if not rows:
        return [unknown(component, f"{what}: cuDNN {cudnn} for CUDA {cuda.major}.x has no row in "
                        "the matrix", cudnn=cudnn, cuda=cuda)]
    row = rows[0]
    if row.uncertain:
        return [unknown(component, f"{what}: the matrix row for cuDNN {cudnn} is uncertain",
                        row=row)]
    out: list[Finding] = []
    for gpu in ctx.known_ccs:
        listed = _covers(row.get("cc") or [], gpu.cc)
        if listed is not None:
            need = Version.maybe((row.get("cc_needs_cuda") or {}).get(str(listed)))
            if need is None or cuda >= need:
                continue
            if not cuda_known:
                out.append(finding(
                    "not-judged", "info", component,
                    f"{what}: cuDNN {cudnn} supports {gpu.label} (sm_{gpu.cc.major}"
                    f"{gpu.cc.minor}) only with a CUDA >= {need} runtime; the runtime's version "
                    "is not in the snapshot, so this was not judged", row=row,
                    fix="list the CUDA runtime (cuda_runtimes), or run `dnnctl doctor` where "
                    f"{component} is installed", cudnn=cudnn, required=need))
                continue
            out.append(finding(
                "cudnn-mismatch", "error", "cudnn",
                f"{what}: cuDNN {cudnn} supports {gpu.label} (sm_{gpu.cc.major}{gpu.cc.minor}) "
                f"only with a CUDA >= {need} runtime, and this one is CUDA {cuda}",
                fix=fix, row=row, cudnn=cudnn, cuda=cuda, compute_capability=gpu.cc))
            continue
        if _covers(row.get("cc_uncertain") or [], gpu.cc) is not None:
            out.append(unknown(component, f"{what}: whether cuDNN {cudnn} supports {gpu.label} "
                               f"(sm_{gpu.cc.major}{gpu.cc.minor}) is not confirmed", row=row))
            continue
        out.append(finding(
            "cudnn-mismatch", "error", "cudnn",
            f"{what}: cuDNN {cudnn} has no kernels for {gpu.label} (sm_{gpu.cc.major}"
            f"{gpu.cc.minor}); it supports compute capability {', '.join(row['cc'])}",
            fix=fix, row=row, cudnn=cudnn, compute_capability=gpu.cc))
    return out


def _covers(ccs: list[str], gpu: CC) -> CC | None:
    """The listed CC whose cubins run on ``gpu`` (same major, minor <=), newest first."""
    best = None
    for text in ccs:
        cc = CC.parse(text)
        if cc.major == gpu.major and cc.minor <= gpu.minor and (best is None or cc > best):
            best = cc
    return best


def loaded_copy(ctx: Context, major: int) -> Component | None:
    """The cuDNN copy of this major that the dynamic loader picks first, if known."""
    for c in ctx.env.cudnn:
        v = parse_cudnn(c.version)
        if v is not None and v.major == major and c.loaded_first:
            return c
    return None


def _only_copy(ctx: Context, major: int) -> Component | None:
    """The one cuDNN copy of this major a snapshot lists when it marks none as loading
    first: for a build that brings no cuDNN of its own, the copy that loads if any does."""
    if any(c.loaded_first for c in ctx.env.cudnn):
        return None
    same = [c for c in ctx.env.cudnn
            if (v := parse_cudnn(c.version)) is not None and v.major == major]
    return same[0] if len(same) == 1 else None


def _bundled_copy(ctx: Context, major: int) -> Component | None:
    """The framework's own cuDNN of this major (a pip wheel's, torch's bundled one)."""
    for c in ctx.env.cudnn:
        v = parse_cudnn(c.version)
        src = c.source or ""
        # a hand-written snapshot may name the copy in torch/lib (wheels before 1.13 and all
        # CUDA 10 wheels carry libcudnn there) by its directory
        if v is not None and v.major == major and (src.startswith(BUNDLED_SOURCES)
                                                   or "torch/lib" in src):
            return c
    return None


def _same_release(a: Version | None, b: Version | None) -> bool:
    """8.9.2.26 and 8.9.2 are one release (the fourth part is a build number)."""
    return a is not None and b is not None and a.trunc(3) == b.trunc(3)


def need_check(ctx: Context, component: str, what: str, compiled: Version, *,
               loaded: Version | None = None, fix: str | None = None,
               bundled: bool = False, same_minor: bool | None = False) -> list[Finding]:
    """The framework was built against ``compiled``: the cuDNN that loads must have the same
    major and an equal or higher minor (the check torch, TF/XLA and JAX all do at start).
    ``bundled``: the build carries its own copy, so only a copy of the same major found first
    can stand in for it; no copy of that major elsewhere is no problem. ``same_minor``: the
    release needs the same major.minor too (TensorFlow before 1.8); None: a TensorFlow whose
    release is unknown, so a newer minor is a warning naming both rules."""
    copy = loaded_copy(ctx, compiled.major)
    if copy is None and not bundled:
        copy = _only_copy(ctx, compiled.major)
    source = None
    if copy is not None and (loaded is None or _same_release(parse_cudnn(copy.version), loaded)):
        # the framework's own report (cudnn_runtime) names the version; the copy, where from
        loaded, source = loaded or parse_cudnn(copy.version), copy.source
    if loaded is None:
        majors = sorted({v.major for c in ctx.env.cudnn if (v := parse_cudnn(c.version))})
        if majors and compiled.major not in majors and not bundled:
            return [finding("cudnn-mismatch", "error", "cudnn",
                            f"{what} needs cuDNN {compiled.major}.x (built against {compiled}); "
                            f"only cuDNN {', '.join(f'{m}.x' for m in majors)} was found",
                            fix=fix, cudnn_needed=compiled, cudnn_found=majors)]
        return []
    src = source or ((copy.path or "the copy listed first") if copy is not None
                     else "reported by the framework")
    shadow = source is not None and source.startswith(SHADOW_SOURCES)
    code = "cudnn-shadowed" if shadow else "cudnn-mismatch"
    if loaded.major_only and loaded.major == compiled.major:
        return []  # "9": its minor is not known, so neither is whether it is high enough
    if loaded.major != compiled.major or loaded.trunc(2) < compiled.trunc(2):
        hint = _unshadow(ctx, copy, compiled.major, fix) if shadow and copy else fix
        return [finding(
            code, "error", "cudnn",
            f"{what} was built against cuDNN {compiled}, but the copy that loads first is "
            f"{loaded} ({src}): the major must match and the minor be at least as high "
            "('cuDNN version incompatibility' / 'CuDNN library needs to have matching major "
            "version and equal or higher minor version')",
            fix=hint, cudnn_compiled=compiled, cudnn_loaded=loaded, loaded_from=src)]
    if same_minor is not False and loaded.trunc(2) != compiled.trunc(2):
        return [_minor_rule(what, compiled, loaded, src, same_minor, code)]
    mixed = _cudnn8_mix(ctx, what, compiled, loaded, copy) if shadow and copy else []
    if mixed:
        return mixed
    if shadow:
        return [finding(
            "cudnn-shadowed", "info", "cudnn",
            f"{what}: a system cuDNN {loaded} ({src}) loads before the bundled one; it is "
            f"compatible (same major, minor >= {compiled.trunc(2)}) but not the tested copy",
            cudnn_compiled=compiled, cudnn_loaded=loaded, loaded_from=src)]
    return []


def _cudnn8_mix(ctx: Context, what: str, compiled: Version, loaded: Version,
                copy: Component) -> list[Finding]:
    """A cuDNN 8 from LD_LIBRARY_PATH / the system loads before a different bundled copy:
    compatible on paper, but cuDNN 8 dlopens its sub-libraries by name and the copies mix."""
    bundled = _bundled_copy(ctx, compiled.major)
    if compiled.major != 8 or bundled is None or \
            _same_release(parse_cudnn(bundled.version), loaded):
        return []
    return [finding(
        "cudnn-shadowed", "error", "cudnn",
        f"{what}: cuDNN {loaded} ({copy.source}) loads before the bundled {bundled.version} "
        f"({bundled.source}); cuDNN 8 loads its sub-libraries (libcudnn_cnn_train.so.8, ...) "
        "by name, so the two copies mix: 'Could not load library libcudnn_cnn_train.so.8 ... "
        "undefined symbol' or 'GET was unable to find an engine', although the versions are "
        "compatible on paper",
        fix=_unshadow(ctx, copy, compiled.major, None), source=CUDNN8_MIX_SOURCE,
        cudnn_compiled=compiled, cudnn_loaded=loaded, loaded_from=copy.source,
        bundled=bundled.version)]


def _unshadow(ctx: Context, copy: Component, major: int, fix: str | None) -> str:
    """Take the copy found first off the search path: LD_LIBRARY_PATH on Linux, PATH on native
    Windows (where DLLs are found through PATH); the bundled copy then loads if there is one,
    else the framework's own fix is still needed."""
    var = "PATH" if ctx.os_kind == "windows" else "LD_LIBRARY_PATH"
    where = copy.path or copy.source
    folder = _folder(copy.path) if var == "LD_LIBRARY_PATH" else None
    text = (f"remove {folder} from {var}" if folder else
            f"remove the directory of {where} from {var}") + " (or uninstall that cuDNN)"
    if _bundled_copy(ctx, major) is not None or not fix:
        return text + " so the bundled copy loads"
    if fix.split()[0] in ("pip", "pip3", "conda"):
        fix = f"`{fix}`"
    return f"{text}; if the framework has no copy of its own, then {fix}"


def _folder(path: str | None) -> str | None:
    """The directory an LD_LIBRARY_PATH entry names for a library file (or the directory)."""
    if not path or "'" in path:
        return None
    path = path.rstrip("/")
    return path.rsplit("/", 1)[0] if re.search(r"\.so(\.\d+)*$", path) else path


def _minor_rule(what: str, compiled: Version, loaded: Version, src: str,
                same_minor: bool | None, code: str) -> Finding:
    """A newer cuDNN minor than the build's, for a TensorFlow that rejects it (before 1.8), or
    one whose release is unknown (a warning naming both rules)."""
    want = compiled.trunc(2)
    fix = (f"install cuDNN {want} (the build's major.minor) and make it the copy that loads "
           "first, or use TensorFlow 1.8 or newer, which accepts a newer minor")
    ev = {"cudnn_compiled": compiled, "cudnn_loaded": loaded, "loaded_from": src}
    if compiled.major_only:  # the build's minor is not known: the older rule cannot be judged
        return unknown("tensorflow", f"{what} needs the cuDNN {compiled.major}.x that loads "
                       f"({loaded}, {src}) to have its build's minor (TensorFlow before 1.8), "
                       "and that minor is not known", fix=fix, **ev)
    old_rule = ("TensorFlow before 1.8 requires the same major.minor ('Loaded runtime CuDNN "
                f"library: ... (compatibility version {loaded.major}{loaded.minor}00) but "
                "source was compiled with ... (compatibility version "
                f"{compiled.major}{compiled.minor}00)')")
    if same_minor:
        return finding(code, "error", "cudnn",
                       f"{what} was built against cuDNN {compiled}, but the copy that loads "
                       f"first is {loaded} ({src}): {old_rule}, so the GPU ops fail to start",
                       fix=fix, source=TF_CUDNN_RULE_SOURCE, **ev)
    return finding(code, "warning", "cudnn",
                   f"{what} was built against cuDNN {compiled} and the copy that loads first "
                   f"is {loaded} ({src}): TensorFlow 1.8 and later accept it (same major, a "
                   f"minor at least the build's), but {old_rule}",
                   fix=f"name the TensorFlow version to judge it; if it is older than 1.8, "
                   f"{fix.replace(', or use', ', or upgrade to')}",
                   source=TF_CUDNN_RULE_SOURCE, **ev)
