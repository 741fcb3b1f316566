"""MIG: a MIG device is a slice of a GPU, and one process sees fewer of them than may be listed.

A MIG device is an entry of ``gpus`` with a ``mig`` field other than ``mode`` alone
(``profile``, ``parent``, ``gpu_instance``, ``compute_instance``; the profile may be unknown) or
a name such as "NVIDIA A100-SXM4-80GB MIG 3g.40gb" (``nvidia-smi -L``, a bug report); a GPU
with ``mig.mode: true`` is in MIG mode, and CUDA sees its MIG devices instead of it. Which of them one
process can use: those ``CUDA_VISIBLE_DEVICES`` names (all when it is unset), and of those,
with drivers before R570 only one, from R570 one compute instance per GPU instance (matrix
table ``mig_enumeration``, from NVIDIA's MIG user guide).
"""

from __future__ import annotations

import re
from collections import Counter

from dnnctl.compat.schema import Row
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import EnvSnapshot, Finding, Gpu
from dnnctl.doctor.parse import mig_profile

GUIDE = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/mig-device-names.html"
SYMPTOM = ("code that uses them as several GPUs (DDP, device_map, --devices 0,1) fails: "
           "torch.cuda.device_count() is 1, or an NVML-based count disagrees with CUDA and the "
           "first call fails with 'device >= 0 && device < num_gpus INTERNAL ASSERT FAILED' or "
           "'invalid device ordinal'")


def check(ctx: Context) -> list[Finding]:
    """MIG devices said to be slices; more visible to one process than CUDA enumerates."""
    migs = [g for g in ctx.env.gpus if _is_mig(g)]
    if not migs:
        return _mode_only(ctx.env)
    out = [_slices(ctx.env, migs)]
    visible = _visible(ctx.env, migs)
    if len(visible) < 2:
        return out
    rows = _enumeration(ctx)
    if not rows:
        return out
    per = {r["per"] for r in rows}
    if per == {"gpu_instance"}:
        return out + _shared_instances(visible, rows[-1])
    n = len(visible)
    names = ", ".join(sorted(Counter(_profile(g) or "?" for g in visible)))
    if per == {"process"}:
        why = (f"with driver {ctx.driver_label} (before R570) CUDA enumerates only one MIG device per "
               "process")
    else:
        why = ("with a driver before R570 CUDA enumerates only one MIG device per process "
               "(R570 and later: one compute instance per GPU instance)")
    out.append(finding(
        "mig-enumeration", "warning", "gpu",
        f"{n} MIG devices ({names}) are visible to one process, but {why}: only one of them "
        f"is a CUDA device, and {SYMPTOM}", fix=_fix(visible), row=rows[0],
        visible=n, driver=ctx.driver, profiles=[_profile(g) for g in visible],
        cuda_visible_devices=(ctx.env.environment or {}).get("CUDA_VISIBLE_DEVICES")))
    return out



def _enumeration(ctx: Context) -> list:
    """The mig_enumeration rows for this driver: every row when it is unknown, or a bare
    branch whose oldest and newest driver differ (Windows: not on this numbering)."""
    span = None if ctx.windows else ctx.driver_span
    if span is None:
        return ctx.matrix.mig_enumeration(None)
    lo, hi = (ctx.matrix.mig_enumeration(d) for d in span)
    return lo if lo == hi else ctx.matrix.mig_enumeration(None)

def _is_mig(gpu: Gpu) -> bool:
    """A MIG device: a profile (in ``mig`` or the name), or any MIG-device field."""
    return bool(_profile(gpu)) or any(k != "mode" for k in (gpu.mig or {}))


def _mode_only(env: EnvSnapshot) -> list[Finding]:
    """GPUs in MIG mode whose MIG devices are not listed: CUDA sees those, not the GPU."""
    on = [g for g in env.gpus if (g.mig or {}).get("mode") is True]
    if not on:
        return []
    names = ", ".join(g.name or f"GPU {g.index}" for g in on)
    return [finding("ok", "info", "gpu", f"{names}: in MIG mode, so CUDA sees its MIG devices "
                    "(none listed here), not the whole GPU, and one process uses only one of "
                    "them", source=f"{GUIDE} (MIG device names)", mig_mode=True)]


def _profile(gpu: Gpu) -> str | None:
    return (gpu.mig or {}).get("profile") or mig_profile(gpu.name)


def _base_name(env: EnvSnapshot, gpu: Gpu) -> str:
    """The GPU a MIG device is cut from: its parent entry's name, else its own name without
    the MIG part."""
    parent = (gpu.mig or {}).get("parent")
    for g in env.gpus:
        if parent and parent in (g.uuid, str(g.index)) and not _is_mig(g) and g.name:
            return g.name
    return re.sub(r"[\s-]+MIG[\s-].*$", "", gpu.name or "") or "a GPU"


def _slices(env: EnvSnapshot, migs: list[Gpu]) -> Finding:
    by_gpu: dict[str, list[str]] = {}
    for g in migs:
        by_gpu.setdefault(_base_name(env, g), []).append(_profile(g) or "?")
    text = "; ".join(f"{len(p)} on {name} ({', '.join(p)})" for name, p in by_gpu.items())
    return finding("ok", "info", "gpu", f"MIG devices: {text}; each is a slice of its GPU (its "
                   "own SMs and memory), not a whole GPU", source=f"{GUIDE} (MIG device names)")


def _visible(env: EnvSnapshot, migs: list[Gpu]) -> list[Gpu]:
    """The MIG devices one process may see: those CUDA_VISIBLE_DEVICES names (a UUID or its
    prefix, or the pre-R470 MIG-GPU-<uuid>/<GI>/<CI>), or those of the GPUs it names."""
    text = (env.environment or {}).get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return migs
    entries = [e.strip() for e in text.split(",") if e.strip()]
    named = [e for e in entries if e.upper().startswith("MIG-")]
    if named:
        return [next((g for g in migs if _names(e, g)), Gpu(uuid=e)) for e in named]
    index_of = {g.uuid: str(g.index) for g in env.gpus
                if g.uuid and g.index is not None and not _is_mig(g)}
    return [g for g in migs if any(_on_gpu(e, g, index_of) for e in entries)]


def _names(entry: str, gpu: Gpu) -> bool:
    old = re.fullmatch(r"MIG-(GPU-[^/]+)/(\d+)/(\d+)", entry)
    mig = gpu.mig or {}
    if old:
        return (mig.get("parent") == old.group(1) and mig.get("gpu_instance") == int(old.group(2))
                and mig.get("compute_instance") == int(old.group(3)))
    return bool(gpu.uuid) and gpu.uuid.startswith(entry)


def _on_gpu(entry: str, gpu: Gpu, index_of: dict[str, str]) -> bool:
    """Is ``gpu`` (a MIG device) on the GPU that ``entry`` (an index or GPU-<uuid>) names?"""
    parent = (gpu.mig or {}).get("parent")
    if parent is None:
        return True  # which GPU it belongs to is unknown: it may be visible
    if entry.upper().startswith("GPU-"):
        return parent.startswith(entry)
    return entry == index_of.get(parent, parent)


def _shared_instances(visible: list[Gpu], row: Row) -> list[Finding]:
    """R570+: one compute instance per GPU instance; several CIs of one GI are one device."""
    groups: dict[tuple[str, object], list[Gpu]] = {}
    for g in visible:
        mig = g.mig or {}
        profile = _profile(g) or ""
        if isinstance(mig.get("gpu_instance"), int):
            key: tuple[str, object] = (str(mig.get("parent")), mig["gpu_instance"])
        elif re.match(r"\d+c\.", profile):  # a CI of a split GPU instance (1c.3g.40gb)
            key = (str(mig.get("parent")), profile.split(".", 1)[1])
        else:
            continue  # a GPU instance with one CI: enumerated on its own
        groups.setdefault(key, []).append(g)
    shared = [g for members in groups.values() if len(members) > 1 for g in members]
    if not shared:
        return []
    names = ", ".join(_profile(g) or "?" for g in shared)
    return [finding(
        "mig-enumeration", "warning", "gpu",
        f"{len(shared)} visible MIG devices ({names}) are compute instances of the same GPU "
        "instance: CUDA enumerates one compute instance per GPU instance and picks one of "
        f"them, so {SYMPTOM}", fix=_fix(shared), row=row, visible=len(shared),
        profiles=[_profile(g) for g in shared])]


def _fix(devices: list[Gpu]) -> str:
    first = next((g.uuid for g in devices if g.uuid and g.uuid.upper().startswith("MIG-")), None)
    text = ("run one process per MIG device, each started with CUDA_VISIBLE_DEVICES set to that "
            "device's UUID (MIG-...; `nvidia-smi -L` lists them)")
    return text + (f", e.g. `export CUDA_VISIBLE_DEVICES={first}` for the first" if first
                   else "")
