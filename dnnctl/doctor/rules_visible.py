"""``CUDA_VISIBLE_DEVICES`` naming GPUs this machine does not have.

Read as CUDA reads it (:mod:`dnnctl.doctor.visible`): an invalid first entry (empty, ``-1``, an
index past the last GPU, a UUID of no GPU here) hides every GPU — programs then find "no
CUDA-capable device" (cudaErrorNoDevice, 100) and torch reports CUDA unavailable — and an
invalid later entry hides it and every GPU after it. A warning either way: the variable may be
set on purpose, but then this machine runs nothing on its GPUs. Where torch already reports
CUDA unavailable, rules_available.py names the variable as the cause instead.
"""

from __future__ import annotations

from dnnctl.doctor import visible
from dnnctl.doctor.context import Context, finding, flag
from dnnctl.doctor.model import Finding


def check(ctx: Context) -> list[Finding]:
    """One warning when CUDA_VISIBLE_DEVICES hides GPUs through an invalid entry."""
    seen = visible.parse(ctx.env)
    if seen is None or seen.stop is None:
        return []
    torch = (ctx.env.frameworks or {}).get("torch")
    if seen.hides_all and isinstance(torch, dict) and \
            flag(torch.get("cuda_available")) is False:
        return []  # rules_available: the cause of torch's "CUDA unavailable"
    fixed = ",".join(dict.fromkeys(seen.valid))
    if seen.hides_all:
        message = (f"CUDA_VISIBLE_DEVICES={seen.value!r} shows CUDA no GPU ({seen.why}), so "
                   "programs find no CUDA device: 'no CUDA-capable device is detected', "
                   "torch.cuda.is_available() False")
        first = "0" if seen.count else None
        fix = ("`unset CUDA_VISIBLE_DEVICES`"
               + (f" or name a GPU that exists (`export CUDA_VISIBLE_DEVICES={first}`)"
                  if first else "")
               + " — unless hiding the GPUs is meant")
    else:
        message = (f"CUDA_VISIBLE_DEVICES={seen.value!r} shows CUDA only "
                   f"{', '.join(seen.shown)}: {seen.why}, and CUDA stops reading the list at "
                   "the first invalid entry, so it and every GPU named after it stay hidden")
        fix = (f"name only GPUs that exist: `export CUDA_VISIBLE_DEVICES={fixed}`"
               + (f" (this machine's GPUs are 0-{seen.count - 1})" if seen.count else ""))
    return [finding("visible-devices", "warning", "gpu", message, fix=fix,
                    source=visible.SOURCE, cuda_visible_devices=seen.value,
                    invalid=seen.stop, gpu_count=seen.count, shown=list(seen.shown))]
