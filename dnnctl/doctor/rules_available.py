"""torch reports CUDA unavailable (``torch.cuda.is_available()`` False): never a pass.

A snapshot whose ``frameworks.torch.cuda_available`` is False names the first cause it
supports, in this order:

- the driver is older than the CUDA torch was built with (the driver's newest CUDA, from its
  version through compat/cuda.yaml or as the driver reports it, below the build's): an error
  with the driver that CUDA needs and a torch build this driver runs; torch itself says "The
  NVIDIA driver on your system is too old (found version 8000)" (pytorch/pytorch#1564);
- no driver, or a driver that sees no GPU (rules_driver.py names these);
- ``CUDA_VISIBLE_DEVICES`` empty, or starting with an invalid entry (``-1``, an index past the
  last GPU, a UUID of no GPU here; :mod:`dnnctl.doctor.visible`): CUDA sees no device;
- a CPU-only build (rules_platform.py names it);
- the build's CUDA unknown, the driver's known: a warning that a build for any newer CUDA
  fails on this driver, with the driver the next CUDA release needs;
- none of these: still a warning that torch cannot reach the GPU, with what to check.
"""

from __future__ import annotations

from typing import Any

from dnnctl.compat.drivers import driver_need
from dnnctl.compat.schema import Row
from dnnctl.compat.suggest import cubin_status, python_fits, torch_install
from dnnctl.compat.versions import TorchVersion, Version
from dnnctl.doctor import fixcheck, visible
from dnnctl.doctor.context import Context, finding, flag
from dnnctl.doctor.model import Finding
from dnnctl.doctor.rules_runtime import driver_fix, runtime_findings
from dnnctl.errors import UsageError

# findings that already explain why torch sees no GPU
CAUSES = {"no-driver", "no-gpu", "driver-mismatch", "driver-too-old", "fabric-manager",
          "cuda-init"}
TOO_OLD_SOURCE = (
    "pytorch/pytorch#1564 (torch.cuda.is_available() False, 'The NVIDIA driver on your system "
    "is too old (found version 8000)'; the maintainer: 'upgrade your driver'); the driver per "
    "CUDA release: compat/cuda.yaml")
CHECK = ("run `nvidia-smi` (it must list the GPU and a driver) and "
         "`python -c 'import torch; print(torch.version.cuda)'` (None: a CPU-only build)")


def check(ctx: Context, found: list[Finding]) -> list[Finding]:
    """The cause of ``cuda_available: false`` for torch, unless a finding already names one."""
    info = (ctx.env.frameworks or {}).get("torch")
    if not isinstance(info, dict) or flag(info.get("cuda_available")) is not False:
        return []
    if any(_names_cause(f) for f in found):
        return []
    what = f"torch {info['version']}" if info.get("version") else "torch (version unknown)"
    cuda = _build_cuda(info)
    if cuda is not None:
        too_old = _too_old(ctx, what, cuda)
        if too_old:
            return too_old
    hidden = _hidden(ctx, what)
    if hidden:
        return hidden
    if cuda is None and ctx.driver_cuda[0] is not None:
        return _maybe_too_old(ctx, what, info)
    if any(f.severity == "error" and f.component in ("driver", "gpu")
           or f.severity in ("error", "warning") and f.component == "torch" for f in found):
        return []  # something about torch or the driver is already flagged
    return [finding("cuda-unavailable", "warning", "torch",
                    f"{what} reports CUDA unavailable (torch.cuda.is_available() is False) and "
                    "this snapshot shows no cause: torch cannot reach the GPU", fix=CHECK,
                    cuda=cuda)]


def _names_cause(f: Finding) -> bool:
    if f.severity not in ("error", "warning"):
        return False
    # a snapshot that names no GPU gets a no-gpu warning: that is no cause
    if f.code in CAUSES and f.component in ("driver", "gpu", "fabric", "torch") and (
            f.severity == "error" or f.component == "torch"):
        return True
    if f.code == "live-failed":  # doctor --deep: torch itself said why
        return True
    return f.component == "torch" and f.evidence.get("build") in ("cpu", "rocm")


def _build_cuda(info: dict[str, Any]) -> Version | None:
    """The CUDA torch was built with: ``cuda`` (torch.version.cuda), else its +cuXYZ tag."""
    cuda = Version.maybe(info.get("cuda"))
    if cuda is not None or not info.get("version"):
        return cuda
    try:
        return TorchVersion.parse(info["version"]).cuda
    except UsageError:
        return None


def _too_old(ctx: Context, what: str, cuda: Version) -> list[Finding]:
    """driver-too-old for the build's CUDA, with a torch build this driver runs."""
    out = runtime_findings(ctx, "torch", cuda, what=what, jit=False,
                           alt_fix=_runnable_torch(ctx, cuda))
    out = [f for f in out if f.code == "driver-too-old"]
    for f in out:
        f.message += " (so torch.cuda.is_available() is False)"
    return out


def _hidden(ctx: Context, what: str) -> list[Finding]:
    seen = visible.parse(ctx.env)
    if seen is None or not seen.hides_all:
        return []
    return [finding("no-gpu", "warning", "torch",
                    f"CUDA_VISIBLE_DEVICES={seen.value!r} hides every GPU from CUDA "
                    f"({seen.why}): {what} reports CUDA unavailable "
                    "(torch.cuda.is_available() is False)",
                    fix="`unset CUDA_VISIBLE_DEVICES` (or `export CUDA_VISIBLE_DEVICES=0` for the "
                    "first GPU)", source=visible.SOURCE, cuda_visible_devices=seen.value)]


def _maybe_too_old(ctx: Context, what: str, info: dict[str, Any]) -> list[Finding]:
    """The build's CUDA unknown, the driver's newest CUDA known: a build for any newer CUDA
    fails here, and the next CUDA release after the driver's says which driver it needs."""
    have = ctx.driver_cuda[0]
    if ctx.driver is None and ctx.driver_span is not None and have is not None:
        have = ctx.branch_cuda()[1] or have  # a bare branch: what its newest driver supports
    newer = sorted(v for r in ctx.matrix.rows("cuda_releases") if not r.uncertain
                   and (v := Version.parse(r["version"]).trunc(2)) > have)
    if not newer:
        return [finding("cuda-unavailable", "warning", "torch",
                        f"{what} reports CUDA unavailable (torch.cuda.is_available() is False) "
                        f"with a driver for CUDA {have}: torch cannot reach the GPU", fix=CHECK)]
    nxt = newer[0]
    need = driver_need(ctx.matrix, nxt, windows=ctx.windows)
    floor = need.full or need.minimum
    fix = (f"check `python -c 'import torch; print(torch.version.cuda)'`: a CUDA newer than "
           f"{have} needs a newer driver (CUDA {nxt}: "
           f"{driver_fix(ctx, floor) if floor else 'the driver is not in the matrix'})")
    alt = _runnable_torch(ctx, None)
    fix += f"; or {alt}" if alt else _rebuild(info, have)
    return [finding("driver-too-old", "warning", "torch",
                    f"{what} reports CUDA unavailable (torch.cuda.is_available() is False) and "
                    f"the driver supports CUDA {have} at most: a torch built for a newer CUDA "
                    "fails here ('The NVIDIA driver on your system is too old'); the CUDA this "
                    "torch was built with is not in the snapshot",
                    fix=fix, source=TOO_OLD_SOURCE, row=need.release_row, driver_cuda=have,
                    next_cuda=nxt, required=floor)]


def _rebuild(info: dict[str, Any], have: Version) -> str:
    source = "source" in str(info.get("installer") or "").lower()
    return (f"; or rebuild torch with CUDA_HOME set to a CUDA <= {have} toolkit" if source
            else f" (no torch wheel in the matrix is built for CUDA <= {have})")


def _runs(ctx: Context, cuda: Version) -> bool:
    """Whether this driver runs CUDA ``cuda`` (by its version, else by the CUDA it reports)."""
    if ctx.driver is not None:
        return fixcheck.driver_problem(ctx, cuda) is None
    have = ctx.driver_cuda[0]
    if have is None:
        return False
    need = driver_need(ctx.matrix, cuda, windows=ctx.windows)
    return cuda.trunc(2) <= have or (need.mvc and have.major == cuda.major)


def _runnable_torch(ctx: Context, cuda: Version | None) -> str | None:
    """The newest torch wheel (the matrix's current lines) whose CUDA this driver runs, older
    than ``cuda``, with code for every GPU here; None when there is none."""
    def fits(r: Row) -> bool:
        rc = Version.parse(r["cuda"])
        return (not r.uncertain and (cuda is None or rc.trunc(2) < cuda.trunc(2))
                and python_fits(r, ctx.python) and _runs(ctx, rc)
                and all(cubin_status(g.cc, r, ctx.platform) for g in ctx.known_ccs))

    rows = [r for r in ctx.matrix.current("torch") if fits(r)]
    if not rows:
        return None
    pick = max(rows, key=lambda r: (Version.parse(r["torch"]), Version.parse(r["cuda"])))
    return (f"install a torch build for CUDA {pick['cuda']}, which this driver runs: "
            f"`{torch_install(pick)}`")
