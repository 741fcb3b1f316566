"""Framework rules: each build's code for the GPU, its CUDA against the driver, its cuDNN."""

from __future__ import annotations

import re
from typing import Any

from dnnctl.compat.matrix import LEGACY_TORCH_BEFORE
from dnnctl.compat.schema import Row
from dnnctl.compat.suggest import best_torch_fix, legacy_torch_fix, python_fits, torch_install
from dnnctl.compat.versions import (
    TorchVersion,
    Version,
    VersionRange,
    parse_cudnn,
    tag_from_cuda,
)
from dnnctl.doctor import (
    fixcheck,
    os_fixes,
    rules_cpu_torch,
    rules_cudnn,
    rules_jax,
    rules_platform,
    rules_python,
    rules_reach,
    rules_tf_custom,
    rules_tf_floor,
    rules_torch_cudnn,
    rules_torch_lines,
    rules_torch_source,
)
from dnnctl.doctor.context import Context, finding, unknown
from dnnctl.doctor.model import Finding
from dnnctl.doctor.rules_libraries import (
    arch_findings,
    explicit_build,
    jetson_wheels,
    library_major,
    rebuild_fix,
)
from dnnctl.doctor.rules_runtime import runtime_findings
from dnnctl.errors import UsageError


def check(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    fw = ctx.env.frameworks or {}
    for name, fn in (("torch", _torch), ("tensorflow", _tensorflow), ("jax", rules_jax.check),
                     ("cupy", _cupy)):
        info = _info(ctx, fw, name)
        if info is None:  # listed with nothing known ({}) is still installed
            continue
        windows = rules_platform.jax_windows(ctx, info) if name == "jax" else []
        if windows:  # what the OS rules out comes before any version is compared
            out += windows
            continue
        if not info.get("version"):  # judge what the build alone says (ROCm, CPU-only)
            out += _build_only(ctx, name, info)
            continue
        found = fn(ctx, info)
        if not any(f.severity in ("error", "warning") or f.code in ("ok", "not-judged")
                   for f in found):  # nothing found is no pass where part was not judged
            found.append(finding("ok", "info", name, f"{name} {info['version']}: no problem "
                                 "found against the matrix", version=info["version"]))
        out += found
    return out


# -- shared -----------------------------------------------------------------------------------

TF_PACKAGES = ("tensorflow", "tensorflow-gpu", "tensorflow-cpu", "tensorflow-intel",
               "tf-nightly", "tf-nightly-gpu")


def _info(ctx: Context, fw: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The framework's entry, or one made from ``packages`` (a hand-written snapshot may list
    a framework only there, with or without its version): never left unjudged."""
    if name == "jax":
        return rules_jax.with_packages(ctx, fw.get(name))
    if name in fw:
        return fw[name]
    packages = ctx.packages
    names = {"torch": ("torch",), "tensorflow": TF_PACKAGES,
             "cupy": tuple(n for n in sorted(packages) if re.fullmatch(r"cupy(-cuda\d+x?)?", n))}
    found = [n for n in names[name] if n in packages]
    if not found:
        return None
    info: dict[str, Any] = {"version": packages[found[0]]} if packages[found[0]] else {}
    if name != "torch":
        info["package"] = found[0]
        if len(found) > 1:
            info["packages"] = found  # as detection records them (a conflict of its own)
    if name == "tensorflow" and found[0] == "tensorflow-cpu":
        info["cuda_build"] = False
    return info


def _cuda_of(info: dict[str, Any], key: str = "cuda") -> Version | None:
    return Version.maybe(info.get(key))


def _build_only(ctx: Context, name: str, info: dict[str, Any]) -> list[Finding]:
    """A framework whose version is unknown: its build type is still judged; otherwise it is
    said to be not judged (never a silent pass)."""
    found: list[Finding] = []
    what = f"{name} (version unknown)"
    if name == "torch":
        local = (info.get("local_tag") or "").lower() or None
        fix = _torch_fix(ctx, None)
        found = _torch_build(ctx, what, info, local, fix)
        if not found and rules_torch_source.is_source_build(info):
            return rules_torch_source.check(ctx, info, what)
    elif name == "jax" and rules_jax.cpu_only(ctx, info):
        found = rules_jax.cpu_finding(ctx, what, None)
    elif info.get("cuda_build") is False:
        found = rules_platform.cpu_only(ctx, name, what)
    if not found:  # the build's own arch list / CUDA, as for a version the matrix lacks
        found = explicit_build(ctx, name, what, info, "",
                               release_fix=rules_reach.release_fix(ctx, name), note="not-judged")
    if not found:  # no release build at all has code for the GPU
        found = rules_reach.no_build(ctx, name, what)
    return found or [finding("not-judged", "info", name, f"{name}: version unknown, not judged "
                             "against the matrix")]


# -- torch ------------------------------------------------------------------------------------

TORCH_ROCM_SOURCE = (
    "https://pytorch.org/get-started/locally/ (ROCm builds, index whl/rocmX.Y, are for AMD "
    "GPUs); modal-labs/modal-examples#681 (a whl/nightly/rocm6.0 torch on an NVIDIA T4: 'No "
    "HIP GPUs are available')")


def _torch_fix(ctx: Context, line: str | None) -> str | None:
    cc0 = ctx.known_ccs[0].cc if ctx.known_ccs else None
    if cc0 is None:
        return None
    gone = rules_reach.unreached(ctx, "torch")
    if gone:  # no current wheel has code for one of the GPUs: an older line or a source build
        build = rules_reach.source_build_fix(ctx, "torch", gone[0])
        old = legacy_torch_fix(ctx.matrix, gone[0].cc, platform=ctx.platform,
                               windows=ctx.windows, python=ctx.python) \
            if _legacy_line(line) else None
        return f"install {old}; or {build}" if old else build
    return best_torch_fix(ctx.matrix, cc0, driver=ctx.driver, platform=ctx.platform,
                          same_line=line, windows=ctx.windows, python=ctx.python)


def _legacy_line(line: str | None) -> bool:
    """An installed torch line older than the matrix's current ones (1.x before 1.13)."""
    return line is not None and Version.parse(line).trunc(2) < LEGACY_TORCH_BEFORE


def _torch_build(ctx: Context, what: str, info: dict[str, Any], local: str | None,
                 fix: str | None) -> list[Finding]:
    """What the build type alone decides: a CPU-only (known, or likely for conda's pytorch)
    or a ROCm (AMD) build."""
    cpu = rules_cpu_torch.cpu_torch(ctx, what, info, local, fix)
    if cpu:
        return cpu
    if (local or "").startswith("rocm") or info.get("hip") or info.get("rocm"):
        return [finding("cuda-mismatch", "error", "torch",
                        f"{what} is a ROCm (AMD) build and cannot use NVIDIA GPUs", fix=fix,
                        source=TORCH_ROCM_SOURCE, build="rocm")]
    return []

def _torch(ctx: Context, info: dict[str, Any]) -> list[Finding]:
    try:
        ver = TorchVersion.parse(info["version"])
    except UsageError:
        return [unknown("torch", f"torch version {info['version']!r} could not be read")]
    # the Python range is the release's wheels', whatever their build (a CPU or untagged wheel
    # too); a source, vendor or conda build and a nightly have their own
    wheel = not (ver.custom or ver.is_dev or _conda(ctx, info)
                 or str(info.get("source") or "").lower().startswith("conda")
                 or rules_torch_source.is_source_build(info))
    python = rules_python.check_release(ctx, "torch", f"torch {ver.text}", ver.line) \
        if wheel else []
    return python + _torch_build_of(ctx, info, ver)


def _torch_build_of(ctx: Context, info: dict[str, Any], ver: TorchVersion) -> list[Finding]:
    """A torch of known version: its build against the GPUs, the driver and cuDNN."""
    what = f"torch {ver.text}"
    local = (info.get("local_tag") or ver.local or "").lower() or None

    def fix(same_line: bool = True) -> str | None:
        return _torch_fix(ctx, ver.line if same_line else None)

    build = _torch_build(ctx, what, info, local, fix())
    if build:
        return build
    rows = ctx.matrix.torch_rows(ver.line)
    jetson = jetson_wheels(ctx, info, None)
    if jetson:
        return jetson
    if ver.custom:
        return _custom(ctx, info, ver, what)
    if rules_torch_source.is_source_build(info):
        return rules_torch_source.check(ctx, info, what)
    if not rows:  # a nightly: by the nearest release line; a 0.x release: its dropped GPUs
        nightly = rules_torch_lines.prerelease(ctx, info, ver, what, local, fix(False))
        if nightly:
            return nightly
        known = sorted({r["torch"] for r in ctx.matrix.rows("torch")}, key=Version.parse)
        reason = f"torch {ver.line} has no rows in the matrix (it knows {known[0]}-{known[-1]})"
        old = rules_torch_lines.legacy(ctx, info, ver, what, fix(False))
        return old + (explicit_build(ctx, "torch", what, info, reason, release_fix=fix(False)) or [
            unknown("torch", reason, torch=ver.text)])
    cuda = _cuda_of(info)
    variant = local if local and local.startswith("cu") else (tag_from_cuda(cuda) if cuda else None)
    if variant is None:
        default = [r for r in rows if r.get("pypi_default")]
        if ctx.os_kind in rules_platform.OS_NAMES:  # PyPI's CUDA default is Linux's only
            pick = default[0] if default else None
            other = fix()
            if other is None and pick is not None and not python_fits(pick, ctx.python):
                other = rules_python.torch_for_python(ctx, ctx.python)  # none for this line
            return rules_platform.torch_pypi(ctx, what, pick, other)
        if not default:
            return [unknown("torch", f"{what}: no CUDA tag and the matrix does not know which "
                            "CUDA the PyPI wheel of this line uses", torch=ver.text)]
        variant = default[0]["variant"]
    row = ctx.matrix.torch_row(ver.line, variant)
    if row is None:
        have = ", ".join(r["variant"] for r in rows)
        reason = f"the matrix has no {variant} wheel of torch {ver.line} (it knows {have})"
        return explicit_build(ctx, "torch", what, info, reason, release_fix=fix(False)) or [
            unknown("torch", f"{what}: {reason}; a custom build without an arch list is not "
                    "judged", torch=ver.text, variant=variant)]
    if row.uncertain:
        return [unknown("torch", f"{what}: the matrix row is uncertain", row=row)]
    what = f"torch {ver.text}" + ("" if local else f" ({variant})")
    cuda = cuda or Version.parse(row["cuda"])
    out = jetson_wheels(ctx, info, row)
    arch, ptx_only = arch_findings(ctx, "torch", what, row, info.get("arch_list"), fix())
    out += arch
    out += runtime_findings(ctx, "torch", cuda, what=what, jit=False, ptx_only=ptx_only, row=row,
                            alt_fix=_older_cuda_fix(ctx, info, ver, cuda))
    compiled = parse_cudnn(info.get("cudnn_compiled")) or parse_cudnn(row.get("cudnn"))
    if compiled is None:  # a release whose bundled cuDNN is not published yet
        out.append(finding("ok", "info", "cudnn", f"{what}: the cuDNN this wheel bundles is not "
                           "in the matrix yet; the copy it loads was not judged", row=row))
        return out
    cudnn_fix = fix()
    if not any(f.code == "arch-unsupported" for f in out):
        out += rules_cudnn.gpu_support(ctx, "torch", what, compiled, cuda, fix=cudnn_fix)
    # cudnn_runtime: the version torch reports; cudnn_loaded (--deep) is the library path
    loaded = parse_cudnn(info.get("cudnn_runtime")) or parse_cudnn(info.get("cudnn_loaded"))
    pip_fix = (f"pip install 'nvidia-cudnn-cu{cuda.major}>={compiled}'" if cuda.major >= 11
               else f"install cuDNN {compiled.trunc(2)} or newer of major {compiled.major} "
               "(no pip package of cuDNN exists for CUDA < 11)")
    none = rules_torch_cudnn.check(ctx, info, what, compiled, cuda, fix(False))
    # wheels before CUDA 11 carry libcudnn in torch/lib (no nvidia-cudnn pip package yet)
    out += none if none is not None else rules_cudnn.need_check(
        ctx, "torch", what, compiled, loaded=loaded, fix=pip_fix, bundled=cuda.major < 11)
    if not ctx.known_ccs:
        out.append(finding("not-judged", "info", "torch", f"{what}: wheel {row['variant']} "
                           f"(CUDA {cuda}, cuDNN {compiled}); no GPU is given, so which GPUs "
                           "it has code for was not judged", row=row, variant=row["variant"],
                           fix="give the GPUs (gpus: [{name: ...}])"))
    elif not any(f.severity in ("error", "warning") for f in out):
        sms = ", ".join(f"sm_{g.cc.major}{g.cc.minor}" for g in ctx.known_ccs)
        out.append(finding("ok", "info", "torch", f"{what}: wheel {row['variant']} (CUDA "
                           f"{cuda}, cuDNN {compiled}) has code for {sms}", row=row,
                           variant=row["variant"], cuda=cuda, cudnn=compiled))
    return out


CUSTOM_SOURCE = (
    "PEP 440 local version labels (pytorch.org's wheels are +cuXYZ / +cpu / +rocmX.Y); "
    "Dao-AILab/flash-attention#709 (nvcr.io/nvidia/pytorch:23.11: a prebuilt flash-attn wheel "
    "fails with an undefined symbol, 'The same works when I build the wheel myself') and #809 "
    "(the same in the NGC container)")


def _custom(ctx: Context, info: dict[str, Any], ver: TorchVersion,
            what: str) -> list[Finding]:
    """A torch built from source or by a vendor (an NGC container): no wheel row applies, so
    it is judged by the CUDA, cuDNN and arch list it reports, else not judged."""
    reason = (f"a custom build (local tag +{ver.local}, e.g. an NGC container's or a source "
              "build), not a pytorch.org wheel: the matrix's wheel rows (arch list, bundled "
              "cuDNN) do not apply")
    out = explicit_build(ctx, "torch", what, info, reason, note="not-judged")
    cuda = _cuda_of(info)
    # with cudnn: [] it links the system's cuDNN and none is there; its own cuDNN if stated,
    # else the major its release line was built with (the message says it may have none)
    line = next((r for r in ctx.matrix.torch_rows(ver.line) if r.get("pypi_default")), None)
    compiled = parse_cudnn(info.get("cudnn_compiled")) or parse_cudnn(info.get("cudnn")) or \
        (parse_cudnn(line.get("cudnn")) if line else None)
    none = rules_torch_cudnn.check(ctx, info, what, compiled, cuda, None) \
        if cuda is not None and compiled is not None else None
    out += none or []
    return out or [finding(
        "not-judged", "info", "torch", f"{what}: {reason}; its CUDA, cuDNN and arch list are "
        "not in the snapshot, so it was not judged", source=CUSTOM_SOURCE,
        fix="add frameworks.torch.cuda, cudnn and arch_list (torch.version.cuda, "
        "torch.backends.cudnn.version(), torch.cuda.get_arch_list())", torch=ver.text)]


# conda's form of an install (https://pytorch.org/get-started/previous-versions: `conda install
# pytorch==X torchvision==Y cudatoolkit=Z -c pytorch`) for a torch that conda installed
CONDA_TORCH = "conda install pytorch={torch} cudatoolkit={cuda} -c pytorch"


def _conda(ctx: Context, info: dict[str, Any]) -> bool:
    """A conda-installed torch: its installer, or conda's package name ``pytorch`` listed."""
    names = set(ctx.packages)
    return str(info.get("installer") or "").lower() == "conda" or "pytorch" in names


def _older_cuda_fix(ctx: Context, info: dict[str, Any], ver: TorchVersion,
                    cuda: Version) -> str | None:
    """A torch build for an older CUDA that passes this doctor's own checks here (the driver
    runs its CUDA, it has code for every GPU, it has wheels for this Python): of the same
    release line where one exists, else the newest current one; None when there is none."""
    if not ctx.known_ccs:
        return None
    def fits(r: Any) -> bool:
        rc = Version.parse(r["cuda"])
        return (not r.uncertain and rc.trunc(2) < cuda.trunc(2) and python_fits(r, ctx.python)
                and not fixcheck.build_problems(ctx, rc, r))

    def key(r: Any) -> tuple[Version, Version]:
        return Version.parse(r["torch"]), Version.parse(r["cuda"])

    same = [r for r in ctx.matrix.torch_rows(ver.line) if fits(r)]
    pick = max(same, key=key) if same else max(
        (r for r in ctx.matrix.current("torch") if fits(r)), key=key, default=None)
    if pick is None:
        return None
    cmd = (CONDA_TORCH.format(torch=pick["torch"], cuda=pick["cuda"]) if _conda(ctx, info)
           else torch_install(pick))
    sms = ", ".join(f"sm_{g.cc.major}{g.cc.minor}" for g in ctx.known_ccs)
    return (f"install a build for an older CUDA: `{cmd}` (torch {pick['torch']} "
            f"{pick['variant']}: CUDA {pick['cuda']}, which this driver runs, with code for "
            f"{sms})")


# -- TensorFlow -----------------------------------------------------------------------------

def _tensorflow(ctx: Context, info: dict[str, Any]) -> list[Finding]:
    ver = Version.maybe(info["version"])
    row = ctx.matrix.tensorflow_row(ver) if ver else None
    what = f"tensorflow {info['version']}"
    local = rules_tf_custom.local_tag(info)
    if local and info.get("cuda_build") is not False:  # its own build: not the release's row
        return rules_tf_custom.check(ctx, what, info, local)
    # the release's Python range first, whatever the build and OS: outside it pip finds no
    # wheel at all, before any GPU question
    python = (rules_python.check_release(ctx, "tensorflow", what, str(ver.trunc(2)))
              if ver else [])
    windows = rules_platform.tensorflow_windows(
        ctx, what, ver, ctx.matrix.tensorflow_row(rules_platform.TF_WINDOWS_LAST_GPU)) \
        or rules_platform.tensorflow_macos(ctx, what, ver, info)
    if windows:
        return python + windows
    # the official binaries' lowest compute capability, whatever the CUDA row says
    floor = rules_tf_floor.check(ctx, what, info)
    if python and (row is None or row.uncertain or info.get("cuda_build") is False):
        return python + floor
    if info.get("cuda_build") is False:  # tensorflow-cpu, or is_built_with_cuda() False
        extra = "[and-cuda]" if row is None or row.get("pip_extra") else ""
        pin = f"=={row['tensorflow']}.*" if row is not None else ""
        fix = f'`pip install "tensorflow{extra}{pin}"`'  # double quotes: cmd.exe too
        if info.get("package") == "tensorflow-cpu":
            fix = f"`pip uninstall -y tensorflow-cpu`, then {fix}"
        return rules_platform.cpu_only(ctx, "tensorflow", what, fix=fix)
    if row is None or row.uncertain:
        if rules_tf_floor.below(floor):  # no CUDA row to check: the GPU is ruled out anyway
            return floor
        reason = f"no {'certain ' if row else ''}tested configuration in the matrix"
        return floor + (explicit_build(ctx, "tensorflow", what, info, reason,
                                       release_fix=rules_reach.release_fix(ctx, "tensorflow"))
                        or [unknown("tensorflow", f"{what}: {reason}", row=row)])
    cuda = _cuda_of(info) or Version.parse(row["cuda"])
    compiled = parse_cudnn(info.get("cudnn")) or Version.parse(row["cudnn"])
    install = f"pip install 'tensorflow[and-cuda]=={row['tensorflow']}.*'"
    release = rules_reach.release_fix(ctx, "tensorflow")
    out, ptx_only = arch_findings(ctx, "tensorflow", what, row, info.get("arch_list"),
                                  rebuild_fix(ctx, "tensorflow", release)
                                  if info.get("arch_list") else release)
    ruled_out = rules_tf_floor.below(floor)  # said by the floor: not "no arch list" again
    out = floor + [f for f in out if str(f.evidence.get("compute_capability")) not in ruled_out
                   or f.code != "unknown-version"]
    out = rules_python.check(ctx, "tensorflow", what, row) + out
    no_code = [f for f in out if f.code == "arch-unsupported" and f.severity == "error"]
    gpu = rules_cudnn.gpu_support(ctx, "tensorflow", what, compiled, cuda)
    no_code += [f for f in gpu if f.code == "cudnn-mismatch" and f.severity == "error"]
    own = runtime_findings(ctx, "tensorflow", cuda, what=what, jit=True, ptx_only=ptx_only,
                           row=row)
    own += library_major(ctx, "tensorflow", what, cuda.major, "libcudart", fix=(
        f"{install} (it installs the CUDA {cuda.major} libraries as pip packages)"
        if row.get("pip_extra") else _runtime_fix(ctx, cuda)), row=row, built=cuda)
    own += gpu + rules_cudnn.need_check(ctx, "tensorflow", what, compiled,
                                        same_minor=rules_cudnn.tf_same_minor(ver), fix=(
        f"{install} (it pulls the matching nvidia-cudnn-cu{cuda.major})"
        if row.get("pip_extra") else f"install cuDNN {compiled.trunc(2)} for CUDA {cuda.major}.x"))
    own += _tf_pip_libraries(ctx, what, row, cuda, compiled, install)
    if no_code:  # its own libraries or a newer driver leave a GPU without code: another release
        _release_only(ctx, own, row, release)
    return out + own


TF_PIP_SOURCE = (
    "https://www.tensorflow.org/install/pip ('pip install tensorflow[and-cuda]': the GPU "
    "libraries as pip packages, Linux, from 2.14); a Colab maintainer in "
    "googlecolab/colabtools#5099 (a plain `pip install tensorflow==2.15.0` saw no GPU)")


def _tf_pip_libraries(ctx: Context, what: str, row: Any, cuda: Version, cudnn: Version,
                      install: str) -> list[Finding]:
    """A release whose CUDA libraries come as the ``[and-cuda]`` extra's nvidia-* wheels,
    with a package list that has none of them and no CUDA runtime or cuDNN listed (unknown,
    not "none": those rules judge a listed one): a plain ``pip install tensorflow`` that finds
    its GPU libraries only where a system CUDA / cuDNN of its versions is on the loader's
    path. A warning: the snapshot cannot say whether one is."""
    pkgs = ctx.packages
    if not row.get("pip_extra") or not pkgs or ctx.os_kind in ("windows", "macos") \
            or "tensorflow-cpu" in pkgs:  # (CPU-only for that reason: duplicate-package)
        return []
    if ctx.env.cuda_runtimes or ctx.env.cudnn or "cuda_runtimes" in ctx.env.listed \
            or "cudnn" in ctx.env.listed:
        return []
    if any(n.startswith((f"nvidia-cudnn-cu{cuda.major}", f"nvidia-cuda-runtime-cu{cuda.major}",
                         "cudatoolkit", "cuda-cudart", "cudnn")) for n in pkgs):
        return []
    return [finding(
        "cuda-mismatch", "warning", "tensorflow",
        f"{what} is installed without its CUDA libraries: none of the nvidia-* CUDA "
        f"{cuda.major} wheels that `{install}` adds is among the packages listed, and no "
        f"system CUDA or cuDNN is listed; unless CUDA {cuda} and cuDNN {cudnn.trunc(2)} "
        "libraries are on the loader's path, TensorFlow registers no GPU "
        "(tf.config.list_physical_devices('GPU') is [])", fix=install, source=TF_PIP_SOURCE,
        conditional=True, needs_cuda=cuda, needs_cudnn=cudnn.trunc(2))]


def _runtime_fix(ctx: Context, cuda: Version) -> str:
    """How to add one CUDA release's runtime libraries beside any other, on this OS."""
    return os_fixes.runtime_install(ctx, cuda)


def _release_only(ctx: Context, found: list[Finding], row: Any, release: str | None) -> None:
    """A release with no code for a GPU here: every fix that keeps the release (its CUDA
    runtime, its cuDNN, a driver for its CUDA) would leave that GPU without kernels, so each
    becomes the release that has code for it, or none where no release has."""
    sms = ", ".join(f"sm_{g.cc.major}{g.cc.minor}" for g in ctx.known_ccs)
    for f in found:
        if f.severity not in ("error", "warning"):
            continue
        f.fix = (f"{release}; the libraries or driver TensorFlow {row['tensorflow']} itself needs "
                 f"would not help: it has no code for {sms}") if release else None


# -- CuPy -------------------------------------------------------------------------------------

def _cupy(ctx: Context, info: dict[str, Any]) -> list[Finding]:
    package = (info.get("package") or "").lower()
    row = ctx.matrix.cupy_row(package) if package else None
    what = f"CuPy {info['version']} ({package or 'package unknown'})"
    ver = Version.maybe(info["version"])
    if row is None or row.uncertain or ver is None:
        return [unknown("cupy", f"{what}: the package is not in the matrix", row=row)]
    if not VersionRange.parse(row["cupy"]).contains(ver):
        return [unknown("cupy", f"{what}: {package} has no release {ver} in the matrix "
                        f"({row['cupy']})", row=row)]
    need = VersionRange.parse(row["cuda"])
    # a wheel's name or _wheel.json ("12.x") gives only the major: prefer a full version
    found = [v for k in ("nvrtc", "cuda", "runtime") if (v := _cuda_of(info, k)) is not None]
    cuda = next((v for v in found if not v.major_only), found[0] if found else None)
    out: list[Finding] = []
    if cuda is not None and not need.admits(cuda):
        out.append(finding("cuda-mismatch", "error", "cupy", f"{what} is built for CUDA {need}; "
                           f"the CUDA it uses is {cuda}", fix=row["install"], row=row, cuda=cuda))
    if cuda is not None and cuda.major_only:
        cuda = None  # the minor is unknown: judged by the major below, never as X.0
    runtime = cuda or min(c[1] for c in need.clauses if c[0] in (">=", "=="))
    for gpu in ctx.known_ccs:
        out += _cupy_arch(ctx, gpu, what, row, ver, cuda, runtime)
    if info.get("arch_list"):  # a CuPy build's own targets (CUPY_NVCC_GENERATE_CODE)
        out += arch_findings(ctx, "cupy", what, row, list(info["arch_list"]), None)[0]
    wheel = re.fullmatch(r"cupy-cuda(\d+)x", package)
    if wheel:
        out += library_major(ctx, "cupy", what, int(wheel.group(1)), "libnvrtc", fix=(
            f"pip install '{package}[ctk]' (the CUDA {wheel.group(1)} libraries as pip "
            f"packages), or install a CUDA {wheel.group(1)}.x toolkit"), row=row)
    out += runtime_findings(ctx, "cupy", runtime, what=what, jit=True, row=row)
    return out


def _cupy_arch(ctx: Context, gpu: Any, what: str, row: Row, ver: Version,
               cuda: Version | None, runtime: Version) -> list[Finding]:
    arch = gpu.arch
    if arch is None:
        return []
    sm = f"sm_{gpu.cc.major}{gpu.cc.minor}"
    lo = Version.parse(arch["min_cuda"])
    hi = Version.maybe(arch.get("last_cuda"))
    gen = ctx.matrix.cupy_gpu(arch)
    if gen is not None and not gen.uncertain and gen.get("fails") \
            and VersionRange.parse(gen["fails"]).contains(ver):
        first = Version.parse(gen["first"])
        return [finding("arch-unsupported", "error", "cupy",
                        f"{what} predates CuPy's support for {gpu.label} ({sm}, CuPy >= "
                        f"{first}): the kernels it compiles at run time (NVRTC) are for an "
                        "older GPU generation and fail with CUDA_ERROR_NO_BINARY_FOR_GPU",
                        fix=_cupy_release_fix(ctx, row, first, lo, hi), row=gen,
                        cupy=ver, compute_capability=gpu.cc)]
    if cuda is not None:
        if cuda < lo or (hi is not None and cuda.trunc(2) > hi):
            rng = f">= {lo}" + (f" and <= {hi}" if hi else "")
            return [finding("arch-unsupported", "error", "cupy",
                            f"{what} compiles its kernels with NVRTC from CUDA {cuda}, which "
                            f"cannot target {gpu.label} ({sm}, needs CUDA {rng}): "
                            "CUDA_ERROR_NO_BINARY_FOR_GPU", fix=_cupy_fix(ctx, lo, hi, row),
                            row=arch, cuda=cuda, compute_capability=gpu.cc)]
        return []
    major = runtime.major
    if major < lo.major or (hi is not None and major > hi.major):
        return [finding("arch-unsupported", "error", "cupy",
                        f"{what} uses CUDA {major}.x, which cannot target {gpu.label} ({sm})",
                        fix=_cupy_fix(ctx, lo, hi, row), row=arch, compute_capability=gpu.cc)]
    if major == lo.major and lo.minor > 0:
        return [unknown("cupy", f"{what}: {gpu.label} ({sm}) needs CUDA >= {lo} components "
                        "(NVRTC); their version is unknown", row=arch,
                        fix=f"pip install 'nvidia-cuda-nvrtc-cu{major}>={lo}'")]
    return []


def _cupy_release_fix(ctx: Context, current: Row, first: Version, lo: Version,
                      hi: Version | None) -> str:
    """A CuPy release >= ``first`` of the installed package when its CUDA can target the GPU
    (CUDA ``lo``..``hi``), else of the package that can (one whose CUDA this driver runs
    first, then the newest CUDA)."""
    best: tuple[tuple[bool, Version], Row, Version] | None = None
    for r in ctx.matrix.rows("cupy"):
        cupy = VersionRange.parse(r["cupy"])
        need = max(first, cupy.lowest() or first)
        cuda = VersionRange.parse(r["cuda"])
        low = max([lo] + [v for op, v, _ in cuda.clauses if op in (">=", "==")])
        if r.uncertain or not cupy.contains(need) or not cuda.contains(low) \
                or (hi is not None and low.trunc(2) > hi):
            continue
        if r is current:
            return _with_nvrtc(f"pip install -U '{r['package']}>={need}'", cuda, low)
        rank = (fixcheck.driver_problem(ctx, low) is None, low)
        if best is None or rank > best[0]:
            best = (rank, r, need)
    if best is None:
        return f"no CuPy package in the matrix has a release >= {first} for a CUDA that can " \
               "target this GPU"
    cmd = f"pip uninstall -y {current['package']} && pip install '{best[1]['package']}>={best[2]}'"
    return _with_nvrtc(cmd, VersionRange.parse(best[1]["cuda"]), best[0][1])


def _with_nvrtc(cmd: str, cuda: VersionRange, low: Version) -> str:
    """``cmd``, and the NVRTC of CUDA >= ``low`` where the package also runs with older."""
    if low <= (cuda.lowest() or low):
        return f"`{cmd}`"
    return (f"`{cmd}` and, unless the CUDA {low.major} NVRTC here is {low} or newer, "
            f"`pip install 'nvidia-cuda-nvrtc-cu{low.major}>={low}'`")


def _cupy_fix(ctx: Context, lo: Version, hi: Version | None, current: Row) -> str:
    """Keep the installed package with newer CUDA components when its CUDA major can reach
    the GPU; otherwise the newest CuPy package whose CUDA range can."""
    best: tuple[Version, Row] | None = None
    for r in ctx.matrix.rows("cupy"):
        rng = VersionRange.parse(r["cuda"])
        low = max([lo] + [v for op, v, _ in rng.clauses if op in (">=", "==")])
        if rng.contains(low) and (hi is None or low.trunc(2) <= hi):
            if r is current:
                return (f"keep {r['package']} and use CUDA >= {low} components: pip install "
                        f"'nvidia-cuda-nvrtc-cu{low.major}>={low}' (or '{r['package']}[ctk]')")
            if best is None or low > best[0]:
                best = (low, r)
    if best is None:
        return "use a CuPy build for a CUDA that can target this GPU"
    return f"pip uninstall {current['package']} && {best[1]['install']} (CUDA >= {best[0]})"
