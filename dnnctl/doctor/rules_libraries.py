"""What a framework really loads: shared-library majors, duplicate copies, explicit builds.

- TensorFlow, CuPy wheels (``cupy-cudaNNx``) and JAX's CUDA plugins ``dlopen`` the CUDA
  libraries of one major (``libcudart.so.12``, ``libnvrtc.so.13``, ...): the runtimes that
  would be loaded must include that major, whatever the driver can do.
- A second copy of cuBLAS or NCCL earlier on the search path than the framework's own wins
  the ``dlopen``; an older one lacks symbols the framework was built against.
- An explicit arch list (``TORCH_CUDA_ARCH_LIST``, a build's ``arch_list``) is the truth about
  a build, so a framework version the matrix does not know is still judged by it; so is the
  cuDNN a build was compiled with, against the copy that loads.
- Jetson boards run only wheels built for JetPack: the aarch64 server (SBSA) wheels of
  CUDA 12 do not see their integrated GPU.
"""

from __future__ import annotations

import re
from typing import Any

from dnnctl.compat.schema import Row
from dnnctl.compat.suggest import reach_row
from dnnctl.compat.versions import Version, parse_cudnn
from dnnctl.doctor import rules_cudnn
from dnnctl.doctor.context import Context, finding, unknown
from dnnctl.doctor.model import Component, Finding
from dnnctl.doctor.parse import jaxlib_tag
from dnnctl.doctor.rules_runtime import runtime_findings

EXPLICIT_SOURCE = ("the build's own arch list (the snapshot's arch_list: torch.cuda.get_arch_list(), "
                   "a build's TORCH_CUDA_ARCH_LIST / TF_CUDA_COMPUTE_CAPABILITIES, cuobjdump of "
                   "its library)")
SHADOW_SOURCES = ("env:", "system:", "conda:")
LIBRARY_SOURCE = {
    "cublas": "pytorch/pytorch#174320 and #91067 (a cuBLAS found first on the path wins over "
              "the wheel's nvidia-cublas)",
    "nccl": "pytorch/pytorch#119072 and #186591 (an older libnccl.so.2 loaded first: "
            "'undefined symbol: ncclCommRegister' / 'ncclCommResume')",
}
LIBRARY_SYMPTOM = {
    "cublas": "'undefined symbol: cublasLt...' / 'libcublasLt.so: version libcublasLt.so.12 "
              "not defined' at import, or CUBLAS_STATUS_NOT_SUPPORTED at the first GEMM",
    "nccl": "'undefined symbol: nccl...' at import, or NCCL errors at the first collective "
            "('NCCL version mismatch' / 'invalid usage')",
}
NO_KERNEL = ("the first kernel launch fails with 'CUDA error: no kernel image is available "
             "for execution on the device'")
JETSON_WHEELS = ("https://docs.nvidia.com/deeplearning/frameworks/install-pytorch-jetson-platform"
                 "/index.html")


def arch_findings(ctx: Context, component: str, what: str, row: Row,
                  arch_list: list[str] | None, fix: str | None,
                  source: str | None = None) -> tuple[list[Finding], bool]:
    """Each GPU against the build's cubins and PTX; returns (findings, reached only by PTX)."""
    out: list[Finding] = []
    ptx_only = False
    for gpu in ctx.known_ccs:
        sm = f"sm_{gpu.cc.major}{gpu.cc.minor}"
        got, unsure, used = reach_row(gpu.cc, row, ctx.platform, arch_list)
        if used is None:
            out.append(unknown(component, f"{what}: the matrix has no {ctx.platform + ' ' if ctx.platform else ''}arch list "
                               "for this build", row=row, platform=ctx.platform,
                               compute_capability=gpu.cc))
            continue
        if unsure:
            disputed = ", ".join(row.get("arch_uncertain") or [])
            out.append(unknown(component, f"{what}: whether it has code for {gpu.label} ({sm}) "
                               f"depends on {disputed}, which public sources disagree on",
                               row=row, conflicts=row.get("conflicts"), arch_list=used))
        elif got is None:
            out.append(finding(
                "arch-unsupported", "error", component,
                f"{what} has no code for {gpu.label} ({sm}): its builds carry "
                f"{' '.join(used)} and no cubin of compute capability {_same_major(gpu.cc)} nor "
                f"PTX that can JIT to it, so {NO_KERNEL}", fix=fix, row=row or None, source=source,
                arch_list=used, compute_capability=gpu.cc))
        elif got == "ptx":
            ptx_only = True
            out.append(finding(
                "arch-ptx-jit", "warning", component,
                f"{what} reaches {gpu.label} ({sm}) only by JIT-compiling PTX: the first start "
                "compiles for minutes and performance may be lower", fix=fix, row=row or None,
                source=source, arch_list=used, compute_capability=gpu.cc))
    return out, ptx_only


def _same_major(cc: Any) -> str:
    """The cubins that would run on ``cc``: its major, minor up to its own ("3.0-3.5")."""
    return f"{cc.major}.0" if cc.minor == 0 else f"{cc.major}.0-{cc}"


def loadable_majors(ctx: Context) -> set[int] | None:
    """CUDA majors whose runtime libraries would be found, or None when that is not known:
    nothing listed (an explicit ``cuda_runtimes: []`` is known: none), or a runtime listed
    whose version is not given (it may be of any major: absent is unknown, not "none").

    CuPy's own static runtime (``pip:cupy-*``) and cuda-compat's driver do not count."""
    majors: set[int] = set()
    listed = ctx.env.none_found("cuda_runtimes")
    for rt in ctx.env.cuda_runtimes:
        src = f"{rt.source or ''} {rt.path or ''}".lower()
        if src.startswith("pip:cupy") or "compat" in src:
            continue
        listed = True
        v = Version.maybe(rt.version)
        if v is None:
            return None
        majors.add(v.major)
    return majors if listed else None


def loaded_runtime(ctx: Context, major: int) -> Version | None:
    """The newest CUDA ``major``.x runtime that would be loaded, if one is listed."""
    found = [v for rt in ctx.env.cuda_runtimes
             if not f"{rt.source or ''}".startswith("pip:cupy")
             and (v := Version.maybe(rt.version)) is not None and v.major == major]
    return max(found) if found else None


def library_major(ctx: Context, component: str, what: str, major: int, lib: str,
                  fix: str, row: Row | None = None,
                  built: Version | None = None) -> list[Finding]:
    """``what`` dlopens ``lib``.so.``major``: is a CUDA ``major`` runtime there to load?
    ``built``: the CUDA release of the build; before CUDA 11 the sonames carry the minor
    too (libcudart.so.10.0), so the message names it."""
    have = loadable_majors(ctx)
    if have is None:
        return []
    if major in have:
        return _soname_minor(ctx, component, what, major, lib, fix, row, built)
    found = ", ".join(f"{m}.x" for m in sorted(have)) or "none"
    tag = (f"{built.major}.{built.minor}" if built is not None and built.major == major
           and major < 11 else str(major))
    libs = f"{tag}.x" if tag == str(major) else tag
    return [finding(
        "cuda-mismatch", "error", component,
        f"{what} loads the CUDA {libs} libraries ({lib}.so.{tag}), but the CUDA runtimes "
        f"installed here are {found}: it fails with '{lib}.so.{tag}: cannot open shared "
        "object file'" + (" and TensorFlow silently runs on the CPU only"
                          if component == "tensorflow" else ""), fix=fix, row=row,
        needs_cuda_major=major, cuda_majors_found=sorted(have))]


def _soname_minor(ctx: Context, component: str, what: str, major: int, lib: str, fix: str,
                  row: Row | None, built: Version | None) -> list[Finding]:
    """Before CUDA 11 the runtime's soname carries the minor (libcudart.so.10.0,
    libcudart.so.10.1, libcudart.so.10.2; every 11.x ships libcudart.so.11.0, and 12.x
    libcudart.so.12), so a build for CUDA 10.1 does not load a 10.0 or 10.2 runtime: the
    reason TensorFlow's tested-build table names an exact CUDA for its releases before 2.4
    (https://www.tensorflow.org/install/source#gpu). Only runtimes whose minor is known are
    judged."""
    if lib != "libcudart" or built is None or built.major != major or major >= 11:
        return []
    minors = sorted({v.trunc(2) for rt in ctx.env.cuda_runtimes
                     if not f"{rt.source or ''}".startswith("pip:cupy")
                     and (v := Version.maybe(rt.version)) is not None
                     and v.major == major and not v.major_only})
    if not minors or any(m.minor == built.minor for m in minors):
        return []
    tag = f"{built.major}.{built.minor}"
    found = ", ".join(str(m) for m in minors)
    return [finding(
        "cuda-mismatch", "error", component,
        f"{what} loads {lib}.so.{tag}, but the CUDA {major}.x runtimes here are {found}: "
        f"before CUDA 11 the library names carry the minor, so it fails with "
        f"'{lib}.so.{tag}: cannot open shared object file'"
        + (" and TensorFlow silently runs on the CPU only" if component == "tensorflow"
           else ""), fix=fix, row=row, needs_cuda=tag, cuda_found=[str(m) for m in minors])]


# The variable each framework's source build reads its target list from (TensorFlow's: the
# release build scripts cited in compat/frameworks.yaml; CuPy's: its installation docs).
ARCH_VARIABLE = {"torch": "TORCH_CUDA_ARCH_LIST", "tensorflow": "TF_CUDA_COMPUTE_CAPABILITIES",
                 "cupy": "CUPY_NVCC_GENERATE_CODE"}


def rebuild_fix(ctx: Context, component: str, release_fix: str | None) -> str | None:
    """The fix for a build whose own arch list lacks the GPUs: rebuild with them (the
    framework's variable), or install ``release_fix`` / a release build that has them."""
    if not ctx.known_ccs:
        return None
    ccs = " ".join(str(g.cc) for g in ctx.known_ccs)
    var = ARCH_VARIABLE.get(component)
    if release_fix and "`" not in release_fix:  # a bare command: mark it for the renderer
        release_fix = re.sub(r"^((?:pip|conda|uv) [^(;]+?)(\s*[(;].*|$)", r"`\1`\2",
                             release_fix)
    return ("rebuild with these GPUs in the arch list ("
            + (f"e.g. {var}=\"{ccs}\"" if var else f"compute capability {ccs}") + "), or "
            + (release_fix or "install a release build with code for them (`dnnctl compat "
               f"suggest --gpu {ctx.known_ccs[0].cc}`)"))


def explicit_build(ctx: Context, component: str, what: str, info: dict[str, Any],
                   reason: str, *, release_fix: str | None = None,
                   note: str = "unknown-version") -> list[Finding]:
    """A build the matrix has no row for, judged by the arch list, CUDA and cuDNN it reports;
    ``release_fix``: the release build to install instead, when the caller knows one;
    ``note``: the code of the finding that says what was not checked ("not-judged" when
    only the version is unknown, an info: the build itself is judged)."""
    arch_list = info.get("arch_list")
    cuda = Version.maybe(info.get("cuda"))
    compiled = built_cudnn_version(info)
    judged_cudnn = compiled is not None and bool(ctx.env.cudnn or _reported_cudnn(info))
    if not arch_list and cuda is None and not judged_cudnn:
        return []
    parts = [("arch list" if arch_list else ""), (f"CUDA {cuda}" if cuda else ""),
             (f"cuDNN {compiled} against the copy that loads" if judged_cudnn else "")]
    said = (f"{what}: " + (f"{reason}; " if reason else "") + "judged only by what the build "
            "reports (" + ", ".join(p for p in parts if p) + "); its "
            + ("Python was" if judged_cudnn else "cuDNN and Python were") + " not checked")
    out: list[Finding] = [finding("not-judged", "info", component, said) if note == "not-judged"
                          else unknown(component, said, version=info.get("version"))]
    ptx_only = False
    if arch_list:
        found, ptx_only = arch_findings(ctx, component, what, Row(), list(arch_list),
                                        rebuild_fix(ctx, component, release_fix),
                                        source=EXPLICIT_SOURCE)
        out += found
    if cuda is not None:
        out += runtime_findings(ctx, component, cuda, what=what, jit=False, ptx_only=ptx_only)
    return out + built_cudnn(ctx, component, what, info)


# The check each framework does itself at start, which needs no release table.
BUILT_CUDNN_SOURCE = {
    "tensorflow": "TensorFlow / XLA cuda_dnn.cc: 'Loaded runtime CuDNN library: X but source "
                  "was compiled with: Y. CuDNN library needs to have matching major version "
                  "and equal or higher minor version'",
    "jax": "XLA cuda_dnn.cc (the same check as TensorFlow's); jax-ml/jax#15268 ('we found a "
           "CuDNN v8.5, but JAX was built against CuDNN v8.6. You need to update CuDNN')",
    "torch": "torch/backends/cudnn/__init__.py: 'cuDNN version incompatibility: PyTorch was "
             "compiled against ... but linked against ...'",
}


def built_cudnn_version(info: dict[str, Any]) -> Version | None:
    """The cuDNN a framework build was compiled with, as far as the snapshot says: torch's
    ``cudnn_compiled`` (--deep), a build's ``cudnn`` (TF build_info, torch's pinned or bundled
    copy, a jaxlib tag), or the ``+cudaNN.cudnnXY`` tag of a jaxlib."""
    for key in ("cudnn_compiled", "cudnn"):
        v = parse_cudnn(info.get(key))
        if v is not None:
            return v
    return parse_cudnn(jaxlib_tag(str(info.get("jaxlib") or ""))[1])


def _reported_cudnn(info: dict[str, Any]) -> Version | None:
    """The cuDNN the framework itself reports loading (torch's cudnn.version(), JAX's)."""
    return parse_cudnn(info.get("cudnn_runtime"))


def built_cudnn(ctx: Context, component: str, what: str,
                info: dict[str, Any]) -> list[Finding]:
    """The build's own cuDNN against the copy that loads first: the framework's own check
    (same major, minor at least the compiled one) needs no matrix row."""
    compiled = built_cudnn_version(info)
    if compiled is None:
        return []
    fix = f"install cuDNN {compiled.trunc(2)} or newer of major {compiled.major}"
    same = rules_cudnn.tf_same_minor(info.get("version")) if component == "tensorflow" \
        else False
    found = rules_cudnn.need_check(ctx, component, what, compiled,
                                   loaded=_reported_cudnn(info), fix=fix, same_minor=same)
    var = "PATH" if ctx.os_kind == "windows" else "LD_LIBRARY_PATH"
    for f in found:
        if f.fix == fix:  # where the older copy lives is not known
            f.fix += (f" and make it the copy that loads first (take the older one off {var} "
                      "or uninstall it)")
        if f.severity == "error" and not f.source:
            f.source = BUILT_CUDNN_SOURCE.get(component)
    return found


def duplicates(ctx: Context) -> list[Finding]:
    """A copy of cuBLAS / NCCL earlier on the search path than the framework's own
    (nvJitLink is judged against what cuSPARSE needs: rules_nvjitlink; ptxas against the GPUs:
    rules_ptxas)."""
    out: list[Finding] = []
    for lib, copies in sorted((ctx.env.libraries or {}).items()):
        if lib in ("nvjitlink", "ptxas"):  # rules_nvjitlink, rules_ptxas
            continue
        for major in sorted({v.major for c in copies if (v := Version.maybe(c.version))}):
            same = [c for c in copies if (v := Version.maybe(c.version)) and v.major == major]
            first = next((c for c in same if c.loaded_first), None)
            if first is None or not (first.source or "").startswith(SHADOW_SOURCES):
                continue
            own = [c for c in same if (c.source or "").startswith(("pip:", "torch:"))]
            if not own:
                continue
            newest = max(own, key=lambda c: Version.parse(c.version))
            out += _shadow(lib, first, newest)
    return out


def _shadow(lib: str, first: Component, own: Component) -> list[Finding]:
    loaded, wanted = Version.parse(first.version), Version.parse(own.version)
    # NCCL adds symbols in patch releases (ncclCommResume in 2.29.7): compare every part
    name = {"cublas": "cuBLAS", "nccl": "NCCL"}.get(lib, lib)
    where = first.path or first.source
    ev = {"loaded": str(loaded), "loaded_from": where, "bundled": str(wanted),
          "bundled_from": own.source}
    if loaded >= wanted:
        return [finding("library-shadowed", "info", lib,
                        f"{name} {loaded} ({where}) loads before the framework's {own.source} "
                        f"{wanted}: same major and not older, so it works, but it is not the "
                        "tested copy", source=LIBRARY_SOURCE.get(lib), **ev)]
    return [finding(
        "library-shadowed", "error", lib,
        f"{name} {loaded} from {where} is found first and wins over the framework's "
        f"{own.source} {wanted}: the older copy lacks what the framework was built against, "
        f"so it fails with {LIBRARY_SYMPTOM.get(lib, 'missing symbols')}",
        fix=f"remove {where.rsplit('/', 1)[0] if '/' in where else where} from "
        "LD_LIBRARY_PATH (or uninstall that copy) so the bundled one loads",
        source=LIBRARY_SOURCE.get(lib), **ev)]


def jetson_wheels(ctx: Context, info: dict[str, Any], row: Row | None) -> list[Finding]:
    """A CUDA 12 (or older) torch built for aarch64 servers (SBSA) on a Jetson board.

    JetPack builds carry ``nv`` in their version (``2.1.0a0+41361538.nv23.06``); CUDA 13
    unified the Arm platforms (Thor runs the SBSA wheels)."""
    jetson = [g for g in ctx.gpus if g.gpu_class == "jetson"]
    version = str(info.get("version") or "")
    if not jetson or ".nv" in version or info.get("cuda_build") is False:
        return []
    cuda = Version.maybe(info.get("cuda")) or (Version.maybe(row.get("cuda")) if row else None)
    if cuda is None or cuda.major >= 13:
        return []
    return [finding(
        "arch-unsupported", "error", "torch",
        f"torch {version} is a CUDA {cuda} build for aarch64 servers (SBSA, e.g. GH200); it "
        f"does not drive the integrated GPU of {jetson[0].label}: torch.cuda.is_available() "
        "is False or the first kernel fails", fix="install the JetPack build of torch for "
        f"this board's JetPack release (see {JETSON_WHEELS}) or use NVIDIA's L4T PyTorch "
        "container", source=JETSON_WHEELS, cuda=cuda)]
