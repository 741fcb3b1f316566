"""paddlepaddle-gpu: the CUDA and cuDNN its ``.postNNN`` wheel is built for, against the
driver, the cuDNN installed and the GPUs (matrix table ``paddle``, from Paddle's install pages).
Where a release's Windows page names another cuDNN for a tag than its Linux page (2.2-2.3's
CUDA 11.2 wheels: cuDNN 8.2.1 on Windows, 8.1.1 on Linux; both pages say 8.2.1 from 2.4), the
row for the snapshot's OS judges it.

The wheels bundle neither CUDA nor cuDNN: they dlopen the system's copies, so a cuDNN older
than the one the tag's page names fails at its first cuDNN calls, and a driver older than the tag's CUDA cannot run it at all.
"""

from __future__ import annotations

import re

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import Version, VersionRange, parse_cudnn
from dnnctl.doctor import rules_cudnn, rules_paddle3
from dnnctl.doctor.context import Context, finding, unknown
from dnnctl.doctor.model import Finding
from dnnctl.doctor.rules_libraries import library_major
from dnnctl.doctor.rules_runtime import runtime_findings

DYNLOAD_SOURCE = (
    "PaddlePaddle/Paddle paddle/fluid/platform/dynload/dynamic_loader.cc (cuBLAS, cuDNN, "
    "cuSOLVER, NVRTC and the driver opened with GetDsoHandleFromSearchPath(FLAGS_cuda_dir, "
    "\"libcublas.so\") and the like: unversioned names, no runtime library among them); "
    "PaddlePaddle/PaddleOCR#63 (paddlepaddle-gpu 1.7.2.post107 ran on a CUDA 10.2 machine "
    "once cuDNN's directory was on the loader path)")
COMPONENT = "paddlepaddle-gpu"
TAG = re.compile(r"(\d+(?:\.\d+){1,2})(?:\.(post\d+))?")


def check(ctx: Context) -> list[Finding]:
    """The installed paddlepaddle-gpu wheel's tag against what is installed here."""
    packages = ctx.packages
    if COMPONENT not in packages:
        return []
    text = packages[COMPONENT].strip()
    what = f"{COMPONENT} {text or '(version unknown)'}"
    m = TAG.fullmatch(text)
    if m is None:
        return [finding("not-judged", "info", COMPONENT, f"{what}: which CUDA and cuDNN it is "
                        "built for depends on its version and .postNNN tag; not judged",
                        fix="name its version (pip show paddlepaddle-gpu)")]
    release, tag = Version.parse(m.group(1)), m.group(2)
    if tag is None and release.major >= 3:  # one version for every CUDA variant
        judged = rules_paddle3.check(ctx, release, what)
        if judged is not None:
            return judged
    rows = _rows(ctx, release)
    row = rows.get(tag) if tag is not None else None
    if row is None:
        known = ", ".join(sorted(rows)) or "none"
        why = ("has no .postNNN tag (the default build of its release, which the matrix does "
               "not list)" if tag is None else f"has a tag the matrix does not know for "
               f"{release.trunc(2)} (it knows: {known})")
        return [unknown(COMPONENT, f"{what} {why}; its CUDA and cuDNN were not judged",
                        release=release, tag=tag)]
    if row.uncertain:
        return [unknown(COMPONENT, f"{what}: the matrix row is uncertain", row=row)]
    cuda, need = Version.parse(row["cuda"]), Version.parse(row["cudnn"])
    wheel = "Windows wheel: " if row.get("os") == "windows" else ""
    what = f"{what} ({wheel}CUDA {cuda}, cuDNN >= {need})"
    out = runtime_findings(ctx, COMPONENT, cuda, what=what, jit=False, row=row)
    # (no minor judged: Paddle opens its CUDA libraries at run time by unversioned names,
    # DYNLOAD_SOURCE, so a post107 build runs on a CUDA 10.2 runtime)
    out += library_major(ctx, COMPONENT, what, cuda.major, "libcudart",
                         fix=_other_tag(ctx, row, release) or
                         f"install the CUDA {cuda} runtime libraries", row=row)
    out += _cudnn(ctx, what, row, need)
    out += rules_cudnn.gpu_support(ctx, COMPONENT, what, need, cuda)
    return out or [finding("ok", "info", COMPONENT, f"{what}: its driver, CUDA and cuDNN needs "
                           "are met here", row=row)]


def _rows(ctx: Context, release: Version) -> dict[str, Row]:
    """The rows of ``release`` by tag, for the snapshot's OS: a row for that OS wins over the
    row without one; rows for another OS do not apply (an unknown OS keeps the rows without)."""
    out: dict[str, Row] = {}
    for r in ctx.matrix.rows("paddle"):
        if r.get("os") not in (None, ctx.os_kind):
            continue
        if VersionRange.parse(r["paddle"]).contains(release) and (
                r["tag"] not in out or r.get("os")):
            out[r["tag"]] = r
    return out


def _cudnn(ctx: Context, what: str, row: Row, need: Version) -> list[Finding]:
    """The cuDNN that loads: the major of the build, a minor at least the page's."""
    fix = _cudnn_fix(ctx, row, need)
    copies = [v for c in ctx.env.cudnn if (v := parse_cudnn(c.version)) is not None]
    same = [v for v in copies if v.major == need.major]
    if rules_cudnn.loaded_copy(ctx, need.major) is not None or not same:
        return rules_cudnn.need_check(ctx, COMPONENT, what, need, fix=fix)
    newest = max(same)
    if newest.trunc(2) >= need.trunc(2):
        return []
    return [finding(
        "cudnn-mismatch", "error", "cudnn",
        f"{what}: Paddle's {_page(row)} asks for cuDNN {need} or newer with CUDA "
        f"{row['cuda']}, and the newest cuDNN {need.major} here is {newest}: cuDNN calls fail "
        "(e.g. 'CUDNN_STATUS_BAD_PARAM' in batch_norm)", fix=fix, row=row,
        cudnn_needed=need, cudnn_found=newest)]


def _page(row: Row) -> str:
    return "Windows install page" if row.get("os") == "windows" else "install page"


def _cudnn_fix(ctx: Context, row: Row, need: Version) -> str:
    if ctx.os_kind == "windows":  # the wheels load cudnn64_N.dll from the CUDA bin folder
        return _windows_cudnn_fix(ctx, row, need)
    apt = row.get("cudnn_apt")
    if apt:
        return (f"`sudo apt-get install {apt}` (cuDNN {apt.split('=')[1].split('-')[0]} for "
                f"CUDA {row['cuda']} from NVIDIA's machine-learning apt repository)")
    cuda = Version.parse(row["cuda"])
    if cuda.major >= 11 and need.major >= 8:  # NVIDIA's cuDNN wheel of that major
        return (f"`pip install 'nvidia-cudnn-cu{cuda.major}>={need.trunc(2)},"
                f"<{need.major + 1}'`")
    return (f"install cuDNN {need.trunc(2)} or newer (cuDNN {need.major}.x) for CUDA "
            f"{row['cuda']} (https://developer.nvidia.com/rdp/cudnn-archive)")


def _windows_cudnn_fix(ctx: Context, row: Row, need: Version) -> str:
    """cuDNN's Windows archive unpacked into the CUDA toolkit the wheel uses (or first on
    PATH): the version the page names, for that CUDA."""
    cuda = Version.parse(row["cuda"])
    folder = next((src for rt in ctx.env.cuda_runtimes
                   if (v := Version.maybe(rt.version)) is not None
                   and v.trunc(2) == cuda.trunc(2)
                   and (src := (rt.path or (rt.source or "").removeprefix("system:")))), None)
    where = folder or f"the CUDA {cuda} toolkit folder"
    for_cuda = f"{cuda.major}.x" if cuda.major >= 11 else str(cuda)
    return (f"install cuDNN {need} for CUDA {for_cuda} (https://developer.nvidia.com/rdp/"
            f"cudnn-archive) into {where}, or put its bin folder first on PATH")


def _other_tag(ctx: Context, row: Row, release: Version) -> str | None:
    """The same release's wheel for a CUDA runtime found here, if the matrix has one."""
    have = {Version.maybe(rt.version) for rt in ctx.env.cuda_runtimes} - {None}
    for r in _rows(ctx, release).values():
        if r is row:
            continue
        cuda = Version.parse(r["cuda"])
        if any(h is not None and h.trunc(2) == cuda.trunc(2) for h in have):
            return install(r, release) + f" (its build for CUDA {cuda})"
    return None


def install(row: Row, release: Version) -> str:
    """The commands that install ``release`` with ``row``'s tag: 2.x tagged wheels are on
    Paddle's own page (PIP_FIND_LINKS is pip's ``-f``, set apart to keep each line short)."""
    pin = f"`pip install paddlepaddle-gpu=={release}.{row['tag']}`"
    return f"`export PIP_FIND_LINKS={row['index']}`, then {pin}" if row.get("index") else pin
