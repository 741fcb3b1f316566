"""torch versions the matrix has no rows for: a pre-release (nightly) of a line, judged by the
wheel of the nearest release line with the same CUDA tag; a 0.x release, judged by the compute
capabilities its binaries are known to have dropped. Used by rules_frameworks."""

from __future__ import annotations

from typing import Any

from dnnctl.compat.versions import TorchVersion, Version, VersionRange, tag_from_cuda
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.rules_libraries import arch_findings
from dnnctl.doctor.rules_runtime import runtime_findings

NIGHTLY_SOURCE = (
    "https://pytorch.org/get-started/locally/ (Preview (Nightly) builds, index "
    "whl/nightly/cuXYZ, carry the +cuXYZ tag of the CUDA they are built with)")
# 0.x binaries: which compute capabilities they carried no code for
LEGACY_SOURCE = (
    "pytorch/pytorch#4841 (soumith: 'remove cuda capability 3.0 and 5.0 from binaries', done for "
    "0.3.1 per the 0.3.1 checklist #4821; 'fyi 0.4.1 binaries have 5.0 support added back'; "
    "3.0 stays out: 'misses some cuda instructions that we heavily rely on'); "
    "pytorch/pytorch#5125 (the warning 'PyTorch no longer supports this GPU because it is too "
    "old'; 'will continue to work if you build pytorch from source')")
LEGACY_DROPPED = ((VersionRange.parse(">=0.3.1, <0.4.1"), ("3.0", "5.0")),
                  (VersionRange.parse(">=0.4.1, <1.0"), ("3.0",)))


def _lines(ctx: Context) -> list[Version]:
    return sorted({Version.parse(r["torch"]) for r in ctx.matrix.rows("torch")})


def nearest_line(ctx: Context, ver: TorchVersion) -> str | None:
    """The release line a pre-release belongs to: its own line where the matrix has it, else
    the first release after it (1.14 nightlies became 2.0), else the newest line; None for a
    release (not a pre-release) or a version below the matrix."""
    lines = _lines(ctx)
    line = ver.release.trunc(2)
    if not lines or line < lines[0]:
        return None
    if not ver.is_dev and (line > lines[-1] or line in lines):
        return None  # a release newer than the matrix is not guessed at
    later = [v for v in lines if v >= line]
    return str(later[0] if later else lines[-1])


def prerelease(ctx: Context, info: dict[str, Any], ver: TorchVersion, what: str,
               local: str | None, release_fix: str | None) -> list[Finding]:
    """A nightly judged by the wheel of the nearest release line with its CUDA tag: the arch
    list and the CUDA against the driver; [] where no such wheel row is known, or where the
    build reports its own arch list (rules_libraries.explicit_build judges that)."""
    if info.get("arch_list"):
        return []  # its own arch list is better evidence than a release line's
    proxy = nearest_line(ctx, ver)
    cuda = Version.maybe(info.get("cuda")) or ver.cuda
    variant = local if local and local.startswith("cu") else (tag_from_cuda(cuda) if cuda
                                                              else None)
    row = ctx.matrix.torch_row(proxy, variant) if proxy and variant else None
    if row is None or row.uncertain:
        return []
    cuda = cuda or Version.parse(row["cuda"])
    kind = "a pre-release (nightly)" if ver.is_dev or ver.line != proxy else "a build"
    note = finding(
        "not-judged", "info", "torch",
        f"{what}: {kind} of torch {ver.line}, which the matrix has no release rows for; "
        f"judged by the {variant} wheel of torch {proxy}, the nearest release line (the arch "
        "list of a nightly is assumed to be that wheel's: builds of one CUDA tag share their "
        "arch settings); its cuDNN and Python were not checked", source=NIGHTLY_SOURCE,
        line=proxy, variant=variant)
    arch, ptx_only = arch_findings(ctx, "torch", what, row, None, release_fix)
    return [note, *arch, *runtime_findings(ctx, "torch", cuda, what=what, jit=False,
                                           ptx_only=ptx_only, row=row)]


def legacy(ctx: Context, info: dict[str, Any], ver: TorchVersion, what: str,
           release_fix: str | None) -> list[Finding]:
    """A 0.x release binary on a GPU whose compute capability its binaries dropped."""
    if info.get("arch_list"):
        return []  # a build that reports its arch list is judged by it
    dropped = next((ccs for rng, ccs in LEGACY_DROPPED if rng.contains(ver.release)), ())
    out: list[Finding] = []
    for gpu in ctx.known_ccs:
        if str(gpu.cc) not in dropped:
            continue
        sm = gpu.cc.sm
        back = " (0.4.1 added it back)" if str(gpu.cc) == "5.0" and \
            ver.release < Version.parse("0.4.1") else ""
        fix = (f"torch 0.3.0{' or 0.4.1' if back else ''}, or a source build with "
               f"TORCH_CUDA_ARCH_LIST={gpu.cc}")
        if release_fix:
            fix += f", or a current release with code for {sm}: {release_fix}"
        out.append(finding(
            "arch-unsupported", "error", "torch",
            f"{what}: its release binaries carry no code for {sm} ({gpu.label}){back}: torch "
            "warns 'PyTorch no longer supports this GPU because it is too old' and CUDA "
            "kernels fail", fix=fix, source=LEGACY_SOURCE, gpu_cc=str(gpu.cc)))
    return out
