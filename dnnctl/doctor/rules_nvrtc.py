"""torch's runtime-compiled kernels (NVRTC) on a GPU newer than torch's CUDA knows.

torch compiles some kernels at run time with the NVRTC of the CUDA it was built with (the
jiterator: ``prod``, some unary/binary ops; the TorchScript fusers), for the GPU's own
architecture. NVRTC targets what the nvcc of the same release targets (jjsjann123 in
https://github.com/pytorch/pytorch/pull/48455: 'nvrtc supports the same set of arch for nvcc';
compat/cuda.yaml ``cuda_releases.targets``): CUDA 11.0 stops at sm_80, 11.1-11.7 at sm_86/87,
and sm_89 / sm_90 appear in 11.8. A GPU newer than that fails with 'nvrtc: error: invalid value
for --gpu-architecture (-arch)' even though torch's sm_80/sm_86 cubins run on it, until torch
caps the NVRTC target at the newest architecture that NVRTC knows:

- CUDA 11.0 builds: capped from torch 1.7.1 (pytorch/pytorch#48151, cherry-picked to 1.7.1 in
  #48309, for the RTX 30xx sm_86 regression of #47669).
- CUDA 11.1-11.7 builds: capped from torch 1.13.0 (pytorch/pytorch#87611 'attempted fix for
  nvrtc with lovelace', ngimel: 'versions less than 11.8 support only up to sm_86'; the release
  branch pick #87618 on 2022-10-24), for sm_89 (RTX 40xx) in
  https://github.com/pytorch/pytorch/issues/87595 ('4090 is sm89 that's explicitly supported
  only by cuda 11.8'); nightlies from 2022-10-25 on (atalman: 'deployed the fix').
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dnnctl.compat.suggest import best_torch_fix, python_fits, torch_install
from dnnctl.compat.versions import TorchVersion, Version
from dnnctl.doctor.context import Context, GpuInfo, finding
from dnnctl.doctor.model import Finding

SOURCE = ("https://github.com/pytorch/pytorch/issues/87595 (ngimel: '4090 is sm89 that's "
          "explicitly supported only by cuda 11.8'); pytorch/pytorch#87611 and its release "
          "pick #87618 (cap the jiterator's NVRTC arch, CUDA 11.1-11.7 -> sm_86); #48151 / "
          "#48309 (the same cap for NVRTC 11.0, in torch 1.7.1); #48455 ('nvrtc supports the "
          "same set of arch for nvcc')")


@dataclass(frozen=True)
class Cap:
    """torch builds on CUDA ``lo``-``hi`` cap their NVRTC target from release ``fixed`` on."""

    lo: Version
    hi: Version
    fixed: Version
    nightly_line: str | None = None  # the nightly line that had the bug before ``nightly_date``
    nightly_date: int | None = None


CAPS = (
    Cap(Version.parse("11.0"), Version.parse("11.0"), Version.parse("1.7.1")),
    Cap(Version.parse("11.1"), Version.parse("11.7"), Version.parse("1.13.0"), "1.14", 20221025),
)


def check(ctx: Context) -> list[Finding]:
    """A torch whose NVRTC cannot target a GPU here, in a release without the cap."""
    info = (ctx.env.frameworks or {}).get("torch") or {}
    if not info.get("version") or not ctx.known_ccs:
        return []
    try:
        ver = TorchVersion.parse(info["version"])
    except Exception:  # noqa: BLE001 - an unreadable version is judged by rules_frameworks
        return []
    cuda = Version.maybe(info.get("cuda")) or ver.cuda
    cap = next((c for c in CAPS if cuda is not None
                and c.lo <= cuda.trunc(2) <= c.hi), None)
    row = ctx.matrix.cuda_release(cuda) if cap is not None and cuda is not None else None
    if cap is None or row is None:
        return []
    newest = max(Version.parse(t) for t in row["targets"])
    state = _state(ver, cap)
    out: list[Finding] = []
    for gpu in ctx.known_ccs:
        cc = Version.parse(str(gpu.cc))
        if state is None or str(gpu.cc) in row["targets"] or cc < newest:
            continue
        out.append(_finding(ctx, gpu, ver, cuda, cap, state))
    return out


def _state(ver: TorchVersion, cap: Cap) -> str | None:
    """'old': a release (or nightly) without the cap; 'nightly?': a nightly of unknown date
    of the line that had it without the cap for a while; None: the cap is there."""
    if cap.nightly_line and ver.line == cap.nightly_line:
        m = re.search(r"dev(\d{8})", ver.text)
        if m is None:
            return "nightly?"
        return "old" if int(m.group(1)) < (cap.nightly_date or 0) else None
    return "old" if ver.release < cap.fixed else None


def _finding(ctx: Context, gpu: GpuInfo, ver: TorchVersion, cuda: Version, cap: Cap,
             state: str) -> Finding:
    sm = f"sm_{gpu.cc.major}{gpu.cc.minor}"
    when = (f"a {cap.nightly_line} nightly whose date is not known (nightlies before "
            f"{str(cap.nightly_date)[:4]}-{str(cap.nightly_date)[4:6]}-{str(cap.nightly_date)[6:]} "
            "lack the fix)" if state == "nightly?" else f"a release before {cap.fixed}")
    variant = f"cu{cuda.major}{cuda.minor}"
    same = ctx.matrix.torch_row(str(cap.fixed.trunc(2)), variant)
    fixes = []
    if same is not None and python_fits(same, ctx.python):
        fixes.append(f"`{torch_install(same)}` (the same CUDA, with the cap)")
    other = best_torch_fix(ctx.matrix, gpu.cc, driver=ctx.driver, platform=ctx.platform,
                           windows=ctx.windows, python=ctx.python)
    if other:
        fixes.append(f"`{other.split(' (')[0]}`" + (
            f" ({other.split(' (', 1)[1]}" if " (" in other else " (a CUDA that knows "
            f"{sm})"))
    return finding(
        "arch-unsupported", "warning" if state == "nightly?" else "error", "torch",
        f"torch {ver.text} (CUDA {cuda.trunc(2)}) is {when}: its runtime-compiled kernels "
        f"(NVRTC {cuda.trunc(2)}, e.g. the jiterator's prod) are compiled for {gpu.label} "
        f"({sm}), which NVRTC {cuda.trunc(2)} cannot target: 'nvrtc: error: invalid value for "
        "--gpu-architecture (-arch)'", fix=" or ".join(fixes) or None, source=SOURCE,
        torch_cuda=str(cuda.trunc(2)), compute_capability=str(gpu.cc),
        fixed_in=str(cap.fixed))
