"""paddlepaddle-gpu 3.x: the CUDA variant from what it brought along, and the GPUs it has code for.

From 3.0 every CUDA build of a release has the same version number (no ``.postNNN`` tag): the
variant is the package index it came from (``.../packages/stable/cu118/``, ``cu126``,
``cu129``), and the wheel requires the nvidia-* runtime wheels of that CUDA. So the variant is
read from the CUDA runtime pip brought: a ``packages`` entry ``nvidia-cuda-runtime-cuNN`` (its
version: 12.9.79 is the CUDA 12.9 build), or a ``cuda_runtimes`` copy whose source is that
wheel or paddlepaddle-gpu itself. Matrix table ``paddle3``: each variant's CUDA and index, and
the compute capabilities a confirmed report shows it runs on or has no code for (the CUDA 12.9
build has none for sm_61, PaddleX#4682); a GPU outside both is not judged.
"""

from __future__ import annotations

import re

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import Version, VersionRange
from dnnctl.doctor import fixcheck
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.parse import canonical_name
from dnnctl.doctor.rules_runtime import runtime_findings

COMPONENT = "paddlepaddle-gpu"
NO_KERNEL = ("every GPU op fails with 'CUDA error(209), no kernel image is available for "
             "execution on the device' (paddle.utils.run_check() included)")
_RUNTIME = re.compile(r"nvidia-cuda-runtime-cu(\d+)")


def check(ctx: Context, release: Version, what: str) -> list[Finding] | None:
    """Findings for an untagged 3.x ``release``; None when its variant cannot be read (the
    caller then says the version is not in the matrix)."""
    rows = [r for r in ctx.matrix.rows("paddle3")
            if VersionRange.parse(r["paddle"]).contains(release)]
    cudas = variant_cudas(ctx)
    found = [r for r in rows if any(c == Version.parse(r["cuda"]).trunc(2) for c in cudas)]
    if not rows or not cudas:
        return None
    if len(found) != 1:
        listed = ", ".join(str(c) for c in sorted(cudas))
        return [finding("not-judged", "info", COMPONENT,
                        f"{what}: its CUDA variant is not known (pip's CUDA runtime here: "
                        f"{listed}; the variants of {release.trunc(2)} in the matrix: "
                        f"{', '.join(r['variant'] for r in rows)}); its GPU code was not "
                        "judged", fix="name the index it came from (pip show paddlepaddle-gpu; "
                        "pip's --index-url)")]
    row = found[0]
    what = f"{what} ({row['variant']}: CUDA {row['cuda']})"
    out = runtime_findings(ctx, COMPONENT, Version.parse(row["cuda"]), what=what, jit=False,
                           row=row)
    out += _arch(ctx, row, rows, release, what)
    return out or [finding("ok", "info", COMPONENT, f"{what}: the driver runs it", row=row)]


def variant_cudas(ctx: Context) -> set[Version]:
    """The CUDA major.minor of the runtime pip installed: nvidia-cuda-runtime-cuNN's version,
    or a runtime copy found in that wheel (or in paddlepaddle-gpu)."""
    out: set[Version] = set()
    for name, ver in (ctx.env.packages or {}).items():
        if _RUNTIME.fullmatch(canonical_name(name)) and (v := Version.maybe(ver)) is not None:
            out.add(v.trunc(2))
    for rt in ctx.env.cuda_runtimes:
        src = (rt.source or "").lower()
        if (src.startswith("pip:nvidia-cuda-runtime") or src.startswith(f"pip:{COMPONENT}")) \
                and (v := Version.maybe(rt.version)) is not None:
            out.add(v.trunc(2))
    return out


def _arch(ctx: Context, row: Row, rows: list[Row], release: Version,
          what: str) -> list[Finding]:
    """Each GPU against what the variant is known to run on."""
    out: list[Finding] = []
    for gpu in ctx.known_ccs:
        sm = f"sm_{gpu.cc.major}{gpu.cc.minor}"
        if str(gpu.cc) in (row.get("no_code_for") or []):
            out.append(finding(
                "arch-unsupported", "error", COMPONENT,
                f"{what} has no code for {gpu.label} ({sm}): {NO_KERNEL}",
                fix=_fix(ctx, rows, release, str(gpu.cc)), row=row, variant=row["variant"],
                compute_capability=gpu.cc))
        elif str(gpu.cc) not in (row.get("code_for") or []):
            out.append(finding("not-judged", "info", COMPONENT,
                               f"{what}: whether it has code for {gpu.label} ({sm}) is not "
                               "in the matrix; not judged", row=row))
    return out


def _fix(ctx: Context, rows: list[Row], release: Version, cc: str) -> str:
    """The same release from an index whose build runs on ``cc`` (and on this driver): removed
    first, since pip takes the installed build as meeting the same version number."""
    for r in rows:
        if cc in (r.get("code_for") or []) and \
                fixcheck.driver_problem(ctx, Version.parse(r["cuda"])) is None:
            # PIP_INDEX_URL is pip's -i, set apart to keep each command line short (as
            # rules_paddle.install sets PIP_FIND_LINKS)
            return (f"`pip uninstall -y {COMPONENT}`, then `export PIP_INDEX_URL="
                    f"{r['index']}`, then `pip install "
                    f"{COMPONENT}=={release}` (its CUDA {r['cuda']} build, which runs on "
                    f"compute capability {cc}); afterwards `unset PIP_INDEX_URL`")
    return (f"no {COMPONENT} {release.trunc(2)} build in the matrix is known to run on compute "
            f"capability {cc} with this driver; a newer GPU, or a build from source with "
            f"-DCUDA_ARCH_BIN={cc.replace('.', '')}")
