"""Add-on packages: GPU minimums of their kernels, and the CUDA of cuda-python's bindings.

- FlashAttention-2 runs on compute capability 8.0 and newer only, prebuilt vLLM on 7.0 and
  newer; torch.compile's default backend (TorchInductor) generates Triton kernels, which torch
  refuses below 7.0 while eager torch still runs there (matrix table ``gpu_minimums``). Each
  installed package in a row's version range is judged against every GPU here. A package of
  unknown version is judged only by a row marked ``all_releases`` (every vLLM release);
  otherwise whether the row applies is not known (torch 1.x has no torch.compile, flash-attn
  1.x runs on Turing), so it is said as ``not-judged``, never assumed.
- A row with ``fixed`` is a bug of some releases, not a design limit (CuPy 13.0.0's reductions
  below compute capability 7.0, fixed in 13.1.0): with no GPU's compute capability known it is
  still a warning, because the upgrade it proposes is safe on any GPU.
- cuda-python / cuda-bindings M.x are the CUDA M driver and runtime bindings: they need a driver
  that runs CUDA M (its minor-version-compatibility floor), like any CUDA M runtime.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import CC, Version, VersionRange
from dnnctl.doctor import fixcheck
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.parse import canonical_name
from dnnctl.doctor.rules_runtime import runtime_findings

CUDA_PYTHON_SOURCE = (
    "https://nvidia.github.io/cuda-python/cuda-bindings/12.9.11/install.html (cuda-bindings 12.x: "
    "'Driver: Linux (525.60.13 or later), Windows (528.33 or later)', 'the CUDA 12 "
    "minor-version compatibility baseline'); brandon-yujie-sun (NVIDIA) in NVIDIA/cutlass#2866 "
    "('13.0+ cuda-python requires 580+ driver. You would need to install a 12.9 cuda-python')")


CUPY_WHEEL = re.compile(r"cupy(-cuda\d+x?)?")


def _installed(ctx: Context) -> dict[str, str | None]:
    """Package name -> version text (None: installed, version unknown). CuPy's wheels
    (cupy-cuda12x, cupy-cuda110, ...) count as ``cupy``."""
    out: dict[str, str | None] = {canonical_name(n): str(v)
                                  for n, v in (ctx.env.packages or {}).items()}
    cupy = (ctx.env.frameworks or {}).get("cupy") or {}
    wheel = cupy_wheel(ctx)
    if wheel is not None:
        out["cupy"] = str(cupy.get("version") or out.get(wheel) or "") or None
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


def cupy_wheel(ctx: Context) -> str | None:
    """The CuPy wheel installed (its package name), or None when there is no CuPy."""
    names = list(ctx.packages)
    found = next((n for n in names if CUPY_WHEEL.fullmatch(n)), None)
    cupy = (ctx.env.frameworks or {}).get("cupy")
    if cupy is None:
        return found
    return canonical_name(str(cupy.get("package") or found or "cupy"))


def _fix(ctx: Context, row: Row) -> str:
    """The row's fix, with the installed wheel's name; a bare ``cupy`` is the source package,
    so the wheel for the CUDA major here is named instead where one is known."""
    package = cupy_wheel(ctx) or row["package"]
    majors = {v.major for rt in ctx.env.cuda_runtimes if (v := Version.maybe(rt.version))}
    if package == "cupy" and len(majors) == 1 and min(majors) >= 11:
        package = f"cupy-cuda{min(majors)}x"
    return str(row["fix"]).replace("{package}", package)


def _unknown_gpu(row: Row, name: str, what: str) -> Finding:
    """A release with a fixed bug, and no GPU known: the GPU may be one it fails on."""
    return finding(
        "arch-unsupported", "warning", name,
        f"{what}: {row['feature']} fails on GPUs below compute capability {row['min_cc']} with "
        f"{row['symptom']}; no GPU's compute capability is known here, and {row['fixed']} "
        "fixes it", row=row, min_cc=str(row["min_cc"]), fixed_in=str(row["fixed"]))


def _not_judged(row: Row, name: str, need: CC, gpus: str) -> Finding:
    """A package of unknown version, where only some releases have the row's limit."""
    return finding(
        "not-judged", "info", name,
        f"{name} (version unknown): releases {row['versions']} need compute "
        f"capability {need} or newer for {row['feature']}, and {gpus} is older; whether this "
        "release is one of them is not known, so it was not judged",
        fix=f"name its version (pip show {name})", row=row, min_cc=str(need))


_CU_WHEEL = re.compile(r"-cu\d+$")


def _covered(row: Row, installed: dict[str, str | None]) -> list[str]:
    """The installed names a row covers: its package, and a suite's ``packages`` each also
    under a -cuNN wheel name (cudf-cu12) unless the row lists it with one."""
    names = [canonical_name(row["package"])]
    if not row.get("packages"):
        return names if names[0] in installed else []
    names += [canonical_name(n) for n in row["packages"]]
    return sorted(n for n in installed
                  if n in names or (_CU_WHEEL.search(n) and _CU_WHEEL.sub("", n) in names
                                    and not any(_CU_WHEEL.search(x) for x in names)))


def check(ctx: Context, earlier: Sequence[Finding] = ()) -> list[Finding]:
    """Every installed add-on against the GPUs below its minimum compute capability; a package
    that ``earlier`` findings already say has no code for a GPU is not judged again."""
    installed = _installed(ctx)
    no_code = {f.component for f in earlier
               if f.code == "arch-unsupported" and f.severity == "error"}
    out: list[Finding] = []
    for row, name in ((r, n) for r in ctx.matrix.rows("gpu_minimums")
                      for n in _covered(r, installed)):
        if name in no_code or row.uncertain:
            continue
        text = installed[name]
        ver = Version.maybe((text or "").split("+")[0])
        rng = VersionRange.parse(row["versions"])
        if (ver is None and row.get("fixed")) or (ver is not None and not rng.contains(ver)):
            continue  # a bug of some releases is judged only where the release is known
        unknown_release = ver is None and not row.get("all_releases")
        if not ctx.known_ccs:
            if row.get("fixed"):
                found = _unknown_gpu(row, name, f"{row['package']} {text}")
                found.fix = _fix(ctx, row)
                out.append(found)
            continue
        need = CC.parse(row["min_cc"])
        low = [g for g in ctx.known_ccs if g.cc < need]
        if not low:
            continue
        gpus = ", ".join(f"{g.label} (sm_{g.cc.major}{g.cc.minor})" for g in low)
        if unknown_release:
            out.append(_not_judged(row, name, need, gpus))
            continue
        shown = name if row.get("packages") else row["package"]
        what = f"{shown} {text}" if ver is not None else f"{shown} (version unknown)"
        if row["severity"] == "error":
            no_code.add(name)  # one error per package: a later row's floor adds nothing
        out.append(finding(
            "arch-unsupported", row["severity"], name,
            f"{what}: {row['feature']} needs compute capability {need} or newer, and {gpus} "
            f"is older: it fails with {row['symptom']}", fix=_fix(ctx, row), row=row,
            min_cc=str(need), compute_capability=[str(g.cc) for g in low]))
    return out


def cuda_python(ctx: Context) -> list[Finding]:
    """cuda-bindings (or the cuda-python metapackage) of CUDA major M against the driver."""
    packages = ctx.packages
    name = next((n for n in ("cuda-bindings", "cuda-python") if n in packages), None)
    ver = Version.maybe(packages[name]) if name else None
    if name and ver is None:
        return [finding("not-judged", "info", name, f"{name} (version unknown): its major is "
                        "the CUDA major of its bindings, which decides the driver it needs; "
                        "not judged", fix=f"name its version (pip show {name})",
                        source=CUDA_PYTHON_SOURCE)]
    if ver is None or ver.major < 11:
        return []
    what = f"{name} {packages[name]} (the CUDA {ver.major} bindings)"
    older = Version.parse(f"{ver.major - 1}.0")  # the previous major's bindings, if it runs
    alt = None if fixcheck.driver_problem(ctx, older) else (
        f"`pip install 'cuda-python<{ver.major}'` (bindings for the CUDA this driver runs)")
    found = runtime_findings(ctx, name, Version.parse(f"{ver.major}.0"), what=what, jit=False,
                             alt_fix=alt)
    if not found:  # judged and fine, or nothing to judge it against: never silent
        known = ctx.driver is not None or (ctx.env.driver or {}).get("cuda")
        found = [finding("ok", "info", name, f"{what}: the driver runs CUDA {ver.major}")
                 if known else
                 finding("not-judged", "info", name, f"{what}: they need a driver that runs "
                         f"CUDA {ver.major}; the snapshot has no driver version, so this was "
                         "not judged", fix="give the driver's version (driver: {version: ...})")]
    for f in found:
        f.source = CUDA_PYTHON_SOURCE + (f"; {f.source}" if f.source else "")
    return found
