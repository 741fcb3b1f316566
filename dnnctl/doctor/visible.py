"""What ``CUDA_VISIBLE_DEVICES`` shows CUDA, read as the CUDA runtime reads it.

The value is a comma-separated sequence; each entry is a device index (CUDA's numbering, from
0, fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``) or a GPU / MIG UUID (``GPU-…`` or
``MIG-…``, a unique prefix is enough). CUDA takes the entries in order and stops at the first
invalid one: "If one of the indices is invalid, only the devices whose index precedes the
invalid index are visible" (CUDA C++ Programming Guide, 'CUDA Environment Variables'). So an
empty value, ``-1``, an index past the last GPU or a UUID of no GPU here as the first entry
hides every GPU, and one later in the list hides that GPU and all after it.

Validity needs the machine's GPUs: their number (``driver.gpu_count``, else the physical GPUs
the snapshot lists) for indices, and every GPU's UUID for UUIDs. What is not known is never
called invalid.
"""

from __future__ import annotations

from dataclasses import dataclass

from dnnctl.doctor.model import EnvSnapshot

SOURCE = (
    "https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#env-vars "
    "(CUDA_VISIBLE_DEVICES: 'Only the devices whose index is present in the sequence are "
    "visible to CUDA applications ... If one of the indices is invalid, only the devices whose "
    "index precedes the invalid index are visible'; GPU and MIG UUIDs are accepted)")


@dataclass(frozen=True)
class Visible:
    """``shown``: the entries CUDA takes (in order); ``stop``: the first invalid entry (None:
    none is, or none is known to be); ``why``: what makes it invalid; ``count``: the GPUs
    CUDA could number here (None: unknown); ``valid``: every entry not known to be invalid
    (what the value would show with the invalid ones taken out)."""

    value: str
    shown: tuple[str, ...]
    stop: str | None
    why: str
    count: int | None
    valid: tuple[str, ...]

    @property
    def hides_all(self) -> bool:
        """CUDA sees no device (the first entry is invalid)."""
        return self.stop is not None and not self.shown


def gpu_count(env: EnvSnapshot) -> int | None:
    """The GPUs CUDA could number: the driver's count, else the physical GPUs listed."""
    count = (env.driver or {}).get("gpu_count")
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        return count
    physical = [g for g in env.gpus if not (g.mig or {}).get("profile")]
    return len(physical) or None


def parse(env: EnvSnapshot) -> Visible | None:
    """CUDA_VISIBLE_DEVICES from the snapshot's environment, read as CUDA does (None: unset)."""
    value = (env.environment or {}).get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    value = str(value)
    count = gpu_count(env)
    uuids = [g.uuid for g in env.gpus]
    known_uuids = [u.lower() for u in uuids if u] if uuids and all(uuids) else None
    entries = [raw.strip() for raw in value.split(",")]
    reasons = [_invalid(e, count, known_uuids) for e in entries]
    valid = tuple(e for e, why in zip(entries, reasons) if not why)
    for k, why in enumerate(reasons):
        if why:
            return Visible(value, tuple(entries[:k]), entries[k], why, count, valid)
    return Visible(value, tuple(entries), None, "", count, valid)


def _invalid(entry: str, count: int | None, uuids: list[str] | None) -> str:
    """Why CUDA rejects ``entry`` ("" when it takes it or that is not known)."""
    if not entry:
        return "an empty entry"
    low = entry.lower()
    if low.startswith(("gpu-", "mig-")):
        if uuids is None or low.startswith("mig-"):
            return ""  # MIG devices' UUIDs are not in the snapshot's GPU list
        matches = [u for u in uuids if u.startswith(low)]
        if not matches:
            return f"{entry} is the UUID of no GPU here"
        if len(matches) > 1:
            return f"{entry} is a prefix of {len(matches)} GPUs' UUIDs"
        return ""
    sign = entry[1:] if entry[0] in "+-" else entry
    if not sign.isdigit():
        return f"{entry!r} is neither a device index nor a GPU-/MIG- UUID"
    index = int(entry)
    if index < 0:
        return f"{entry} is a negative index"
    if count is not None and index >= count:
        return f"index {index} is past the last GPU here, index {count - 1}" if count \
            else f"index {index}: no GPU here"
    return ""  # (a repeated index: CUDA's handling is not documented, so not judged)
