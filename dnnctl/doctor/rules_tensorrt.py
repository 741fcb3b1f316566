"""TensorRT is built once per CUDA major; a build needs a runtime of its own major.

NVIDIA ships each TensorRT release as one build per CUDA major (8.6: a CUDA 11.x build made
with 11.8 and a CUDA 12.x build made with 12.0; 10.x: cu11 / cu12, later cu12 / cu13), linked
against that major's libraries, whose names carry the major (libcublas.so.12). The build is
``frameworks.tensorrt.cuda`` (a tar / zip / deb install: the CUDA in its file name), or the
pip wheel's name (``tensorrt-cu12``, ``tensorrt-cu12-libs``). Against the CUDA runtimes listed:
none of its major is an error for a tar / deb build, which uses the system's libraries; the pip
wheels bring their major's runtime as a dependency (``nvidia-cuda-runtime-cuNN``), so there a
missing one is a warning. The driver must run that CUDA. Where the build's major or the
runtimes are not in the snapshot, that is said, never assumed.
"""

from __future__ import annotations

import re
from typing import Any

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import Version, VersionRange
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.rules_libraries import loadable_majors
from dnnctl.doctor.rules_runtime import runtime_findings

SOURCE = (
    "https://docs.nvidia.com/deeplearning/tensorrt/archives/tensorrt-861/support-matrix/"
    "index.html (8.6.1, supported CUDA versions: 12.1 update 1, 12.0 update 1 'supported using "
    "a single build, built with CUDA toolkit 12.0', and 11.0-11.8 by a single build made with "
    "11.8); https://docs.nvidia.com/deeplearning/tensorrt/11.2.1/installing-tensorrt/"
    "prerequisites.html ('download the TensorRT package whose filename contains cuda-13.3'; "
    "'Pip wheels: Use a CUDA 12.x or 13.x driver/toolkit that matches the wheel suffix "
    "(tensorrt/tensorrt-cu13 for CUDA 13, or tensorrt-cu12 for CUDA 12)'); cyrusbehr in "
    "cyrusbehr/tensorrt-cpp-api#45 (TensorRT 8.6.1.6's CUDA 12 build on CUDA 11.7: "
    "'libcublas.so.12 => not found'; 'You can download TensorRT 8.6 for CUDA 11.x. That "
    "version does not require CUDA 12'); NVIDIA/TensorRT#4614 (tensorrt_cu12_libs requires "
    "nvidia-cuda-runtime-cu12); the builds of each release: compat/libraries.yaml")
_WHEEL = re.compile(r"tensorrt(?:-(?:lean|dispatch))?-cu(\d+)(?:-(?:libs|bindings))?")


def check(ctx: Context) -> list[Finding]:
    """Each TensorRT build here against the CUDA runtimes and the driver."""
    info: dict[str, Any] = (ctx.env.frameworks or {}).get("tensorrt") or {}
    packages = ctx.packages
    wheels = {int(m.group(1)): n for n in sorted(packages) if (m := _WHEEL.fullmatch(n))}
    listed = "tensorrt" in (ctx.env.frameworks or {}) or "tensorrt" in packages \
        or "nvidia-tensorrt" in packages or bool(wheels)
    if not listed:
        return []
    text = str(info.get("version") or packages.get("tensorrt") or next(
        (packages[n] for n in wheels.values() if packages[n]), "")
        or packages.get("nvidia-tensorrt") or "")
    ver = Version.maybe(text.split("+")[0])
    what = f"TensorRT {text}" if text else "TensorRT (version unknown)"
    cuda = Version.maybe(info.get("cuda"))
    builds = {cuda.major: (cuda, None)} if cuda is not None else {}
    for major, name in wheels.items():
        builds.setdefault(major, (Version.parse(f"{major}.0"), name))
    if not builds:
        return [finding(
            "not-judged", "info", "tensorrt", f"{what}: TensorRT is built once per CUDA major "
            "and its build here is not in the snapshot, so its CUDA was not judged",
            fix="give frameworks.tensorrt.cuda (the CUDA in the name of its tar / zip / deb "
            "package, e.g. cuda-12.0), or list its wheel (tensorrt-cu12)", source=SOURCE)]
    out: list[Finding] = []
    for major, (build, wheel) in sorted(builds.items()):
        label = f"{what} ({wheel or f'its CUDA {major} build'})"
        found = _runtime(ctx, label, major, wheel, ver)
        found += runtime_findings(ctx, "tensorrt", build, what=label, jit=False)
        for f in found:
            f.source = f.source if f.source and SOURCE in f.source else \
                SOURCE + (f"; {f.source}" if f.source else "")
        if not found:  # its major's runtime is here: the driver is what is left
            driver_known = ctx.driver is not None or (ctx.env.driver or {}).get("cuda")
            found = [finding(
                "ok", "info", "tensorrt", f"{label}: a CUDA {major}.x runtime is here and the "
                f"driver runs CUDA {build.trunc(2)}", source=SOURCE) if driver_known else
                finding("not-judged", "info", "tensorrt", f"{label}: a CUDA {major}.x runtime "
                        f"is here; whether the driver runs CUDA {major} was not judged (no "
                        "driver version)", source=SOURCE,
                        fix="give the driver's version (driver: {version: ...})")]
        out += found
    return out


def _release(ctx: Context, ver: Version | None) -> Row | None:
    """The tensorrt_builds row of this release, if its version is known and has one."""
    return next((r for r in ctx.matrix.rows("tensorrt_builds") if ver is not None
                 and not r.uncertain and VersionRange.parse(r["tensorrt"]).contains(ver)), None)


def _runtime(ctx: Context, what: str, major: int, wheel: str | None,
             ver: Version | None) -> list[Finding]:
    have = loadable_majors(ctx)
    if have is None:
        return [finding(
            "not-judged", "info", "tensorrt", f"{what} needs a CUDA {major}.x runtime; "
            "which CUDA runtimes are here is not in the snapshot, so this was not judged",
            fix="list the CUDA runtimes (cuda_runtimes), or run `dnnctl doctor` on the machine",
            source=SOURCE, needs_cuda_major=major)]
    if major in have:
        return []
    row = _release(ctx, ver)
    found = ", ".join(f"{m}.x" for m in sorted(have)) or "none"
    libs = [f"{lib}.so.{major}" for lib in (row.get("libraries") or [])] if row else []
    fails = (f"'{libs[0]}: cannot open shared object file'" if libs
             else f"a library of CUDA {major} not found")
    pip = (f"; its pip dependency nvidia-cuda-runtime-cu{major} is not listed either"
           if wheel else "")
    found_f = finding(
        "cuda-mismatch", "warning" if wheel else "error", "tensorrt",
        f"{what}: TensorRT is built once per CUDA major and links that major's libraries"
        + (f" ({', '.join(libs)})" if libs else " (whose names carry the major)")
        + f", but the CUDA runtimes here are {found}: loading it fails with {fails}{pip}",
        fix=_fix(ctx, major, have, ver, row), row=row, needs_cuda_major=major,
        cuda_majors_found=sorted(have))
    found_f.source = SOURCE + (f"; {found_f.source}" if found_f.source else "")
    return [found_f]


def _fix(ctx: Context, major: int, have: set[int], ver: Version | None,
         row: Row | None) -> str:
    """TensorRT's build for the CUDA here (this release's where it has one, else the newest
    release that does), else that major's runtime beside it."""
    add = (f"install a CUDA {major} runtime beside it (the CUDA {major} toolkit on the library "
           f"path, or `pip install nvidia-cuda-runtime-cu{major} nvidia-cublas-cu{major}`)")
    if not have:
        return add
    other = max(have)
    if row is not None and str(other) not in row["cuda_majors"]:
        newest = [r for r in ctx.matrix.rows("tensorrt_builds") if not r.uncertain
                  and str(other) in r["cuda_majors"]]
        if not newest:
            return add
        row = newest[-1]
        release = f"TensorRT {row['tensorrt']}"
        upper = VersionRange.parse(row["tensorrt"]).upper()
        pin = f"<{upper}" if upper is not None else ""
    else:
        release = f"TensorRT {ver.trunc(3)}" if ver is not None else "TensorRT"
        pin = f"=={ver}" if ver is not None else ""
    pip = row is not None and str(other) in (row.get("pip_majors") or [])
    how = (f"`pip install 'tensorrt-cu{other}{pin}'`, or " if pip else "") + \
        f"the tar / zip / deb package whose name contains cuda-{other}"
    return f"install {release} built for CUDA {other} ({how}); or {add}"
