"""Add-ons whose kernels need a newer GPU than the framework they extend.

FlashAttention-2 runs on compute capability 8.0 and newer only; torch.compile's default
backend (TorchInductor) generates Triton kernels, which torch refuses below 7.0 while eager
torch still runs there (matrix table ``gpu_minimums``). Each installed package in a row's
version range is judged against every GPU here; a torch of unknown version is judged as the
releases the matrix knows are (all but 1.13 have torch.compile).
"""

from __future__ import annotations

from collections.abc import Sequence

from dnnctl.compat.versions import CC, Version, VersionRange
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.parse import canonical_name


def _installed(ctx: Context) -> dict[str, str | None]:
    """Package name -> version text (None: installed, version unknown)."""
    out: dict[str, str | None] = {canonical_name(n): str(v)
                                  for n, v in (ctx.env.packages or {}).items()}
    torch = (ctx.env.frameworks or {}).get("torch")
    if torch is None:
        return out
    version = str(torch.get("version") or out.get("torch") or "")
    tag = str(torch.get("local_tag") or (version.split("+", 1)[1] if "+" in version else ""))
    if torch.get("cuda_build") is False or (tag and not tag.lower().startswith("cu")):
        out.pop("torch", None)  # a CPU-only or ROCm build never runs CUDA kernels
    else:
        out["torch"] = version or None
    return out


def check(ctx: Context, earlier: Sequence[Finding] = ()) -> list[Finding]:
    """Every installed add-on against the GPUs below its minimum compute capability; a package
    that ``earlier`` findings already say has no code for a GPU is not judged again."""
    if not ctx.known_ccs:
        return []
    installed = _installed(ctx)
    no_code = {f.component for f in earlier
               if f.code == "arch-unsupported" and f.severity == "error"}
    out: list[Finding] = []
    for row in ctx.matrix.rows("gpu_minimums"):
        name = canonical_name(row["package"])
        if name not in installed or name in no_code or row.uncertain:
            continue
        text = installed[name]
        ver = Version.maybe((text or "").split("+")[0])
        rng = VersionRange.parse(row["versions"])
        if ver is not None and not rng.contains(ver):
            continue
        need = CC.parse(row["min_cc"])
        low = [g for g in ctx.known_ccs if g.cc < need]
        if not low:
            continue
        gpus = ", ".join(f"{g.label} (sm_{g.cc.major}{g.cc.minor})" for g in low)
        what = f"{row['package']} {text}" if ver is not None else \
            f"{row['package']} (version unknown; {rng})"
        out.append(finding(
            "arch-unsupported", row["severity"], name,
            f"{what}: {row['feature']} needs compute capability {need} or newer, and {gpus} "
            f"is older: it fails with {row['symptom']}", fix=row["fix"], row=row,
            min_cc=str(need), compute_capability=[str(g.cc) for g in low]))
    return out
