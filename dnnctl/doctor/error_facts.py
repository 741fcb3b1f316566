"""What a snapshot says about one cause of an error message (compat/errors.yaml ``fact``).

Each check reads the snapshot (and what the message itself captured: a compute capability,
a library's major, the CUDA a driver reports) and answers one of YES (the snapshot shows this
cause), LIKELY (the snapshot makes it the one to check first, without proving it), NO (the
snapshot rules it out) or None (it cannot say), with a short clause saying why. Checks never
guess: where a field is absent they answer None.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dnnctl.compat.drivers import driver_need
from dnnctl.compat.errors import ErrorMatch
from dnnctl.compat.suggest import reach_row
from dnnctl.compat.versions import CC, Version
from dnnctl.doctor import stack
from dnnctl.doctor.context import Context
from dnnctl.doctor.parse import canonical_name
from dnnctl.doctor.rules_requires import TORCH_FAMILY
from dnnctl.doctor.rules_runtime import driver_fix

YES, LIKELY, NO = "yes", "likely", "no"


@dataclass
class Outcome:
    state: str | None  # YES | LIKELY | NO | None (the snapshot does not say)
    says: str = ""  # why, as a clause ("torch 2.5.1+cu124 has no code for sm_61")
    fix: str | None = None  # a fix the snapshot makes concrete, else the cause's own
    evidence: dict[str, Any] = field(default_factory=dict)


UNKNOWN = Outcome(None)
Check = Callable[[Context, ErrorMatch, str | None], Outcome]
CHECKS: dict[str, Check] = {}


def check(name: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        CHECKS[name] = fn
        return fn
    return register


def evaluate(fact: str | None, ctx: Context, m: ErrorMatch) -> Outcome:
    """The answer of the check ``fact``: "name" or "name:argument"; "a|b", the first of a and
    b that answers; a trailing "?", a check that can make the cause likely, never certain
    (a YES becomes LIKELY). Unknown names and no fact at all answer None."""
    for one in (fact or "").split("|"):
        one = one.strip()
        soft = one.endswith("?")
        name, _, arg = one.rstrip("?").partition(":")
        fn = CHECKS.get(name)
        outcome = fn(ctx, m, arg or None) if fn is not None else UNKNOWN
        if outcome.state is not None:
            if soft and outcome.state == YES:
                outcome = Outcome(LIKELY, outcome.says, outcome.fix, outcome.evidence)
            return outcome
    return UNKNOWN


# -- what the message captured ---------------------------------------------------------------


def message_cc(m: ErrorMatch) -> CC | None:
    """The compute capability the message names (groups cc, sm or arch), if any."""
    for key in ("cc", "sm", "arch"):
        cc = CC.maybe(m.groups.get(key)) if m.groups.get(key) else None
        if cc is not None:
            return cc
    return None


def gpu_ccs(ctx: Context, m: ErrorMatch) -> list[CC]:
    """The message's compute capability, else those of the snapshot's GPUs."""
    cc = message_cc(m)
    return [cc] if cc is not None else [g.cc for g in ctx.known_ccs if g.cc is not None]


def cuda_of(text: str | None) -> Version | None:
    """"11040" (cudaDriverGetVersion) or "11.4" -> 11.4."""
    if not text:
        return None
    if re.fullmatch(r"\d{4,6}", text.strip()):
        v = int(text)
        return Version.parse(f"{v // 1000}.{(v % 1000) // 10}")
    v = Version.maybe(text)
    return v.trunc(2) if v is not None else None


def lib_version(m: ErrorMatch) -> tuple[int, int | None] | None:
    """(major, minor or None) of the library the message names: groups major / minor, or a
    Windows DLL's digits (cudart64_101.dll -> (10, 1), cudart64_110.dll -> (11, 0),
    cublas64_12.dll -> (12, None))."""
    if m.groups.get("major", "").isdigit():
        minor = m.groups.get("minor", "")
        return int(m.groups["major"]), int(minor) if minor.isdigit() else None
    digits = m.groups.get("dll", "")
    if digits.isdigit():
        return (int(digits[:-1]), int(digits[-1])) if len(digits) == 3 else (int(digits), None)
    return None


def lib_major(m: ErrorMatch) -> int | None:
    """The major of the library the message names (lib_version)."""
    v = lib_version(m)
    return v[0] if v else None


# -- GPUs and builds ------------------------------------------------------------------------


@check("gpu_code")
def _gpu_code(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    """torch's build (its arch list, else its wheel's) against the GPU's compute capability."""
    info = stack.torch_info(ctx, packages=True)
    ccs = gpu_ccs(ctx, m)
    if info is None or not ccs:
        return UNKNOWN
    row = stack.torch_row(ctx, packages=True)
    arch = info.get("arch_list") or (row.get("arch_list") if row else None)
    if not arch:
        return UNKNOWN
    what = f"torch {info.get('version') or '(version unknown)'}"
    missing = [cc for cc in ccs if reach_row(cc, row or {}, ctx.platform, list(arch))[0] is None]
    if missing:
        return Outcome(YES, f"{what} has no code for {', '.join(c.sm for c in missing)} "
                            f"(its arch list: {' '.join(arch)})", evidence={"arch_list": arch})
    return Outcome(NO, f"{what} has code for {', '.join(c.sm for c in ccs)}")


@check("ext_code")
def _ext_code(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    """Each compiled extension's arch list against the GPUs."""
    ccs = gpu_ccs(ctx, m)
    exts = ctx.env.extensions or {}
    if not ccs or not exts:
        return UNKNOWN
    bad, unknown = [], []
    for name, info in exts.items():
        arch = info.get("arch_list")
        if not arch:
            unknown.append(name)
            continue
        try:
            miss = [cc for cc in ccs if reach_row(cc, {}, ctx.platform, list(arch))[0] is None]
        except Exception:  # noqa: BLE001 - a hand-written list that does not parse
            unknown.append(name)
            continue
        if miss:
            bad.append(f"{name} ({' '.join(arch)}) has no code for "
                       + ", ".join(c.sm for c in miss))
    if bad:
        return Outcome(YES, "; ".join(bad))
    if unknown:
        return UNKNOWN
    return Outcome(NO, "every listed extension has code for " + ", ".join(c.sm for c in ccs))


@check("gpu_below")
def _gpu_below(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    """A GPU (the message's, else the snapshot's) below compute capability ``arg``."""
    floor = CC.maybe(arg)
    ccs = gpu_ccs(ctx, m)
    if floor is None or not ccs:
        return UNKNOWN
    low = [cc for cc in ccs if cc < floor]
    if low:
        return Outcome(YES, f"compute capability {', '.join(str(c) for c in low)} is below "
                            f"{floor}")
    return Outcome(NO, f"every GPU is of compute capability {floor} or later")


@check("cpu_build")
def _cpu_build(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    """torch a CPU-only build (cuda_build false, +cpu), or one with CUDA."""
    info = stack.torch_info(ctx, packages=True)
    if info is None:
        return UNKNOWN
    version = str(info.get("version") or "")
    tag = str(info.get("local_tag") or (version.split("+", 1)[1] if "+" in version else ""))
    what = f"torch {version or '(version unknown)'}"
    if info.get("cuda_build") is False or tag.lower() == "cpu":
        return Outcome(YES, f"{what} is a CPU-only build")
    if tag.lower().startswith("cu") or info.get("cuda") or info.get("cuda_build") is True:
        return Outcome(NO, f"{what} is a CUDA build")
    if version and ctx.os_kind in ("windows", "macos"):
        return Outcome(LIKELY, f"{what} carries no +cuXYZ tag, and PyPI's torch wheels for "
                               f"{ctx.os_kind} are CPU-only")
    return UNKNOWN


@check("nvcc_arch")
def _nvcc_arch(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    """The CUDA toolkits here against the architecture the message names."""
    cc = message_cc(m)
    kits = [Version.maybe(c.version) for c in ctx.env.cuda_runtimes if c.toolkit]
    kits = [v for v in kits if v is not None]
    if cc is None or not kits:
        return UNKNOWN
    can = _targeting(ctx, cc)
    bad = [v for v in kits if v.trunc(2) not in can]
    if not bad:
        return Outcome(NO, f"the CUDA toolkit here ({', '.join(str(v) for v in kits)}) can "
                           f"target {cc.sm}: another nvcc runs the build")
    if not can:
        return Outcome(YES, f"no CUDA release in the matrix targets {cc.sm}")
    first, last = min(can), max(can)
    v = bad[0]
    if v < first:
        return Outcome(YES, f"nvcc of CUDA {v} is older than {cc.sm}: CUDA {first} is the first "
                            f"release that targets it", fix=f"a CUDA {first} or newer toolkit "
                            "(CUDA_HOME / PATH pointing at it)", evidence={"nvcc": str(v)})
    return Outcome(YES, f"nvcc of CUDA {v} no longer targets {cc.sm}: CUDA {last} is the last "
                        f"release that does", fix=f"a CUDA {last} or older toolkit, or leave "
                        f"{cc.sm} out of TORCH_CUDA_ARCH_LIST / CMAKE_CUDA_ARCHITECTURES",
                   evidence={"nvcc": str(v)})


def _targeting(ctx: Context, cc: CC) -> list[Version]:
    """The CUDA releases (major.minor) whose nvcc can target ``cc``."""
    out = []
    for row in ctx.matrix.rows("cuda_releases"):
        targets = [CC.maybe(t) for t in row.get("targets") or []]
        if cc in targets:
            out.append(Version.parse(row["version"]).trunc(2))
    return out


@check("host_gcc")
def _host_gcc(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    """The host compiler here against the newest major the message says nvcc accepts."""
    tc = ctx.env.toolchain or {}
    kind = "clang" if m.groups.get("clang_max") else "gcc"
    top = m.groups.get("clang_max") or m.groups.get("gcc_max")
    ccbin = tc.get("nvcc_ccbin") or {}
    have = ccbin.get("version") if ccbin.get("kind") == kind else tc.get(kind)
    v = Version.maybe(have) if isinstance(have, str) else None
    if not top or v is None:
        return UNKNOWN
    if v.major > int(top):
        return Outcome(YES, f"{kind} {v} is newer than {kind} {top}, the newest this nvcc "
                            "accepts")
    return Outcome(NO, f"{kind} {v} is accepted: another host compiler runs the build")


# -- the driver -------------------------------------------------------------------------------


def _needed_cuda(ctx: Context, m: ErrorMatch) -> tuple[Version | None, str]:
    """The newest CUDA something here needs (the message's, else the runtimes' and builds')."""
    need = cuda_of(m.groups.get("need"))
    if need is not None:
        return need, "the message"
    found: list[tuple[Version, str]] = []
    cuda, _ = stack.torch_stack(ctx, packages=True)
    if cuda is not None:
        found.append((cuda.trunc(2), "torch's build"))
    for rt in ctx.env.cuda_runtimes:
        v = Version.maybe(rt.version)
        if v is not None:
            found.append((v.trunc(2), f"the CUDA {v.trunc(2)} runtime"))
    for name, info in (ctx.env.frameworks or {}).items():
        v = Version.maybe((info or {}).get("cuda")) if name != "torch" else None
        if v is not None and len(v.key) >= 2:
            found.append((v.trunc(2), f"{name}'s build"))
    if not found:
        return None, ""
    return max(found, key=lambda x: x[0])


def origin(ctx: Context, m: ErrorMatch) -> str | None:
    """The installed package (other than torch's own) whose files the message names — a
    path segment such as ``.../ctransformers/models/ggml/ggml-cuda.cu`` or
    ``site-packages/llama_cpp/...``: the program that printed it."""
    installed = ctx.packages
    for seg in re.findall(r"[/\\]([A-Za-z][\w.-]*)(?=[/\\])", m.text):
        name = canonical_name(seg)
        for cand in (name, name + "-python"):
            if cand in installed and cand not in TORCH_FAMILY:
                return cand
    return None


@check("driver_cuda")
def _driver_cuda(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    """The driver's CUDA (the message's 'found version', else the snapshot's) against the
    newest CUDA a runtime or build here needs; where the message comes from another
    installed package's files (:func:`origin`), against that package's build, whose CUDA the
    snapshot does not give: the message itself says the driver is older than it."""
    have = cuda_of(m.groups.get("driver_cuda")) or ctx.driver_cuda[0]
    pkg = origin(ctx, m) if m.groups.get("need") is None else None
    if pkg is not None and have is not None:
        return Outcome(YES, f"the driver supports CUDA {have}; {pkg}'s build, whose files the "
                            f"message names, was made with a newer CUDA (which one is not in "
                            "the snapshot)",
                       fix=f"a driver for the CUDA {pkg} was built with (newer than {have}: "
                           f"the newest driver for this GPU), or a {pkg} build for CUDA {have} "
                           "or older", evidence={"driver_cuda": str(have), "origin": pkg})
    need, who = _needed_cuda(ctx, m)
    if have is None or need is None:
        return UNKNOWN
    if have < need:
        dn = driver_need(ctx.matrix, need, windows=ctx.windows)
        floor = dn.full or dn.minimum
        return Outcome(YES, f"the driver supports CUDA {have}; {who} needs CUDA {need}",
                       fix=driver_fix(ctx, floor) if floor else None,
                       evidence={"driver_cuda": str(have), "needed_cuda": str(need)})
    return Outcome(NO, f"the driver supports CUDA {have}, at least the {need} {who} needs")


@check("no_driver")
def _no_driver(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    if ctx.driver_present is False:
        return Outcome(YES, "no NVIDIA driver is loaded here")
    if ctx.driver_present or ctx.driver is not None:
        return Outcome(NO, "a driver is loaded"
                       + (f" ({ctx.driver})" if ctx.driver is not None else ""))
    return UNKNOWN


@check("no_gpu")
def _no_gpu(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    if str((ctx.env.driver or {}).get("gpu_count")) == "0":
        return Outcome(YES, "the driver lists no GPU")
    if ctx.env.gpus:
        return Outcome(NO, f"the driver lists {len(ctx.env.gpus)} GPU(s)")
    return UNKNOWN


@check("driver_mismatch")
def _driver_mismatch(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    drv = ctx.env.driver or {}
    kmod, lib = drv.get("kernel_module"), drv.get("library")
    if drv.get("mismatch") is True or (kmod and lib and kmod != lib):
        return Outcome(YES, f"kernel module {kmod or '?'} and user-space library {lib or '?'} "
                            "differ")
    if kmod and lib:
        return Outcome(NO, f"kernel module and user-space library are both {kmod}")
    return UNKNOWN


@check("stub")
def _stub(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    path = (ctx.env.driver or {}).get("libcuda")
    if not path:
        return UNKNOWN
    for row in ctx.matrix.rows("libcuda_paths"):
        if re.search(row["match"], path[:200], re.IGNORECASE):
            return Outcome(YES, f"the libcuda found first is {path}, {row['what']}")
    return Outcome(NO, f"the libcuda found first is {path}")


@check("compute_mode")
def _compute_mode(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    modes = [g.compute_mode for g in ctx.env.gpus if g.compute_mode]
    odd = [x for x in modes if x != "default"]
    if odd:
        return Outcome(YES, f"a GPU is in the {odd[0].replace('_', '-')} compute mode")
    if modes and len(modes) == len(ctx.env.gpus):
        return Outcome(NO, "every GPU is in the default compute mode")
    return UNKNOWN


@check("forward_compat")
def _forward_compat(ctx: Context, m: ErrorMatch, arg: str | None) -> Outcome:
    if ctx.forward_compat is None:
        return UNKNOWN if not ctx.env.driver else Outcome(NO, "cuda-compat is not in use")
    if ctx.gpus and not ctx.fc_eligible:
        return Outcome(YES, "cuda-compat is in use with a GPU it does not support")
    return UNKNOWN
