"""TensorFlow's official GPU binaries ignore a GPU below their lowest compute capability.

compat/frameworks.yaml ``tensorflow_floors`` gives that floor per release (and per OS where the
Windows builds differ), whether or not the release has a CUDA / cuDNN row: TensorFlow logs
"Ignoring visible gpu device ... The minimum required Cuda capability is 3.5" and runs on the
CPU. A GPU below a certain floor is ``arch-unsupported`` (fix: a later release whose build for
this OS has code for it, or a source build with ``TF_CUDA_COMPUTE_CAPABILITIES``); below an
uncertain one it is ``unknown-version``. A build that reports its own arch list is judged by
that list instead (rules_libraries.explicit_build).
"""

from __future__ import annotations

from typing import Any

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import CC, release_key
from dnnctl.doctor import rules_reach
from dnnctl.doctor.context import Context, GpuInfo, finding, unknown
from dnnctl.doctor.model import Finding
from dnnctl.errors import UsageError

IGNORED = ("TensorFlow ignores it ('Ignoring visible gpu device ... The minimum required Cuda "
           "capability is {cc}') and runs on the CPU only")


def rows(ctx: Context, release: str) -> list[Row]:
    """The floor rows of ``release`` for this snapshot's OS (OS-specific rows only where the
    OS is known)."""
    try:
        key = release_key(release)
    except UsageError:
        return []
    return [r for r in ctx.matrix.rows("tensorflow_floors") if _applies(ctx, r)
            and release_key(r["first"]) <= key
            and (not r.get("before") or key < release_key(r["before"]))]


def _applies(ctx: Context, row: Row) -> bool:
    return not row.get("os") or row["os"] == ctx.os_kind


def check(ctx: Context, what: str, info: dict[str, Any]) -> list[Finding]:
    """Each GPU against the floor of the release's official binaries on this OS."""
    if info.get("arch_list") or info.get("cuda_build") is False or not info.get("version") \
            or info.get("package") == "tensorflow-cpu":
        return []
    found = rows(ctx, str(info["version"]))
    out: list[Finding] = []
    for gpu in ctx.known_ccs:
        sure = [r for r in found if not r.uncertain and gpu.cc < CC.parse(r["min_cc"])]
        if sure:
            row = max(sure, key=lambda r: CC.parse(r["min_cc"]))
            out.append(_below(ctx, what, gpu, row, str(info["version"])))
            continue
        for row in found:
            if row.uncertain and gpu.cc < CC.parse(row["min_cc"]):
                out.append(unknown("tensorflow", f"{what}: whether its official binaries run on "
                                   f"{gpu.label} ({gpu.cc.sm}) is not known: a report says "
                                   f"they need compute capability {row['min_cc']}", row=row,
                                   compute_capability=gpu.cc, min_cc=row["min_cc"]))
    return out


def below(findings: list[Finding]) -> set[str]:
    """The compute capabilities the floor rules out (to drop what else was said of them)."""
    return {str(f.evidence.get("compute_capability")) for f in findings
            if f.code == "arch-unsupported"}


def _below(ctx: Context, what: str, gpu: GpuInfo, row: Row, release: str) -> Finding:
    where = f"{row['os'].capitalize()} " if row.get("os") else ""
    built = (f" (built for {', '.join(row['built_for'])})" if row.get("built_for") else "")
    return finding(
        "arch-unsupported", "error", "tensorflow",
        f"{what} has no code for {gpu.label} ({gpu.cc.sm}): its official {where}binaries start "
        f"at compute capability {row['min_cc']}{built}, so "
        + IGNORED.format(cc=row["min_cc"]), fix=_fix(ctx, gpu, release), row=row,
        compute_capability=gpu.cc, min_cc=row["min_cc"])


def _fix(ctx: Context, gpu: GpuInfo, release: str) -> str:
    """The first later release whose official build for this OS runs on the GPU, else what
    rules_reach offers (a release build with code for it, or a source build)."""
    later = sorted((r for r in ctx.matrix.rows("tensorflow_floors")
                    if _applies(ctx, r) and not r.uncertain and r.get("install")
                    and release_key(r["first"]) > release_key(release)
                    and CC.parse(r["min_cc"]) <= gpu.cc), key=lambda r: release_key(r["first"]))
    build = f"TF_CUDA_COMPUTE_CAPABILITIES=\"{gpu.cc}\""
    if later:
        r = later[0]
        where = f"{r['os'].capitalize()} " if r.get("os") else ""
        return (f"install a release whose official {where}build has code for compute "
                f"capability {gpu.cc} (from {r['first']}): `pip install \"{r['install']}\"`; "
                f"or build TensorFlow from source with {build}")
    return rules_reach.release_fix(ctx, "tensorflow") or \
        f"build TensorFlow from source with {build}"
