"""A container image's own CUDA requirement against the host driver.

NVIDIA's CUDA base images set ``NVIDIA_REQUIRE_CUDA`` (``cuda>=12.4 brand=tesla,driver>=470,
driver<471 ...``): the NVIDIA Container Toolkit checks it against the host driver before the
container starts and refuses it ("nvidia-container-cli: requirement error: unsatisfied
condition: cuda>=12.4"). Minor-version compatibility does not help: nothing in the image has
run yet. Space-separated constraints are ORed, comma-separated ones ANDed; ``cuda`` is the
CUDA version the driver supports, ``driver`` its version. ``NVIDIA_DISABLE_REQUIRE`` set
turns the check off. A group naming a ``brand`` or ``arch`` is not judged (never assumed).
"""

from __future__ import annotations

import re

from dnnctl.compat.drivers import driver_need
from dnnctl.compat.versions import Version
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.rules_runtime import driver_fix

REQUIRE_SOURCE = (
    "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/"
    "docker-specialized.html (Constraints: NVIDIA_REQUIRE_* is a logical expression the "
    "toolkit checks before the container starts, `cuda` a constraint on the CUDA driver "
    "version; NVIDIA_DISABLE_REQUIRE disables them; these variables are set in the NVIDIA base "
    "CUDA images); vllm-project/vllm#5635 (the vLLM 0.5.0 image on driver 530, CUDA 12.1: "
    "'nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.4, please "
    "update your driver to a newer version, or use an earlier cuda container')")
_CLAUSE = re.compile(r"(cuda|driver)\s*(>=|<=|==|=|>|<)\s*([0-9][0-9.]*)")
_OPS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
        "<": lambda a, b: a < b, "==": lambda a, b: a == b, "=": lambda a, b: a == b}


def check(ctx: Context) -> list[Finding]:
    """An error when no group of the image's NVIDIA_REQUIRE_CUDA holds for this driver."""
    env = ctx.env.environment or {}
    require = (env.get("NVIDIA_REQUIRE_CUDA") or "").strip()
    if not require or (env.get("NVIDIA_DISABLE_REQUIRE") or "").strip().lower() in (
            "1", "true", "yes"):
        return []
    reported = Version.maybe((ctx.env.driver or {}).get("cuda"))
    have = reported.trunc(2) if reported is not None else ctx.driver_cuda[0]
    groups = [_holds_here(ctx, g, reported) for g in require.split()]
    if not groups or any(g is not False for g in groups):
        return []  # one group holds, or one could not be judged
    if reported is None and ctx.driver is None and ctx.driver_span is not None:
        have = ctx.branch_cuda()[1]  # a bare branch: the most any driver of it supports
    need = [Version.parse(m.group(3)) for m in _CLAUSE.finditer(require)
            if m.group(1) == "cuda" and m.group(2) in (">=", ">")]
    cuda = max(need) if need else None
    fix = "upgrade the host's NVIDIA driver"
    if cuda is not None:
        floor = driver_need(ctx.matrix, cuda, windows=ctx.windows).full
        if floor is not None:
            fix = f"on the host, {driver_fix(ctx, floor)}"
    fix += (f"; or use an image built for CUDA <= {have}" if have is not None
            else "; or use an image built for an older CUDA")
    # a live detection ran inside the started container: the check was passed some other way
    live = (ctx.env.driver or {}).get("present") is True
    return [finding(
        "driver-too-old", "warning" if live else "error", "driver",
        f"the container image requires {_shown(require, cuda)} (NVIDIA_REQUIRE_CUDA) but the "
        f"host driver supports CUDA {have if have is not None else '(unknown)'}: the NVIDIA "
        "Container "
        "Toolkit refuses to start it ('unsatisfied condition'); minor-version compatibility "
        "does not apply to this check" + ("; this container did start, so the check was "
                                          "turned off or bypassed" if live else ""),
        fix=fix, source=REQUIRE_SOURCE, require=require, driver_cuda=have, required_cuda=cuda)]


def _shown(require: str, cuda: Version | None) -> str:
    """The requirement as the message names it: its CUDA floor, and that the other groups
    (brand / driver branches) do not match either."""
    if cuda is None or len(require.split()) == 1:
        return repr(require)
    return f"cuda>={cuda} (its other alternatives do not match this driver either)"


def _holds_here(ctx: Context, group: str, reported: Version | None) -> bool | None:
    """_holds for this driver; one known by its branch alone holds a group only where its
    oldest and newest driver agree."""
    span = ctx.driver_span
    if ctx.driver is not None or span is None:
        return _holds(group, reported.trunc(2) if reported else ctx.driver_cuda[0], ctx.driver)
    lo, hi = ctx.branch_cuda()
    ends = {_holds(group, reported.trunc(2) if reported else cuda, drv)
            for cuda, drv in ((lo, span[0]), (hi, span[1]))}
    return ends.pop() if len(ends) == 1 else None


def _holds(group: str, cuda: Version | None, driver: Version | None) -> bool | None:
    """Whether every comma-separated constraint of ``group`` holds: False when one fails,
    None when none fails but one is not known (brand=, arch=, or a version not in the
    snapshot)."""
    known = True
    for part in group.split(","):
        m = _CLAUSE.fullmatch(part.strip())
        have = None if m is None else cuda if m.group(1) == "cuda" else driver
        if m is None or have is None:
            known = False
        elif not _OPS[m.group(2)](have, Version.parse(m.group(3))):
            return False
    return True if known else None
