"""Findings from ``doctor --deep``'s live checks (torch on a GPU host, in a child process).

``env.live`` holds what torch really did: the cuDNN it loaded (version and file), each
scaled-dot-product-attention backend on a tiny bf16 call (``ok``, ``unsupported: why`` or the
error), and a one-op launch per visible GPU. Nothing here runs anything: the child did.
"""

from __future__ import annotations

from dnnctl.compat.versions import TorchVersion, parse_cudnn
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.errors import UsageError

SOURCE = "doctor --deep: torch itself, in a child process on this host (live check)"
BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
            "cudnn": "CUDNN_ATTENTION"}


def check(ctx: Context) -> list[Finding]:
    live = ctx.env.live or {}
    if not live:
        return []
    out: list[Finding] = []
    if live.get("error"):
        out.append(finding("live-failed", "warning", "torch", "the live torch check could not "
                           f"run: {live['error']}", fix="run `dnnctl doctor --deep` again; "
                           "if it repeats, `python -c 'import torch; torch.zeros(1).cuda()'` "
                           "shows the same failure"))
    out += _cudnn(ctx, live)
    for name, result in sorted((live.get("sdpa") or {}).items()):
        if result == "ok":
            continue
        unsupported = str(result).startswith("unsupported")
        out.append(finding(
            "live-sdpa", "info" if unsupported else "warning", "torch",
            f"SDPA backend {name} ({BACKENDS.get(name, name)}) on a tiny bf16 call: {result}",
            source=SOURCE, fix=None if unsupported else "models that select this backend fail or fall back; "
            "pin another with torch.nn.attention.sdpa_kernel, or check the GPU/driver/cuDNN "
            "findings above", backend=name))
    for gpu, result in sorted((live.get("launch") or {}).items()):
        if result != "ok":
            out.append(finding("live-launch", "error", "gpu", f"a one-op kernel launch on GPU "
                               f"{gpu} failed: {result}", fix="check `nvidia-smi -q -i "
                               f"{gpu}` (Xid errors, ECC, MIG mode) and the arch/driver "
                               "findings above", source=SOURCE, gpu=gpu))
    if not out and (live.get("sdpa") or live.get("launch")):
        out.append(finding("ok", "info", "torch", "live: a kernel ran on every visible GPU and "
                           "every SDPA backend answered a bf16 call"))
    return out


def _cudnn(ctx: Context, live: dict) -> list[Finding]:
    loaded = parse_cudnn(live.get("cudnn"))
    info = (ctx.env.frameworks or {}).get("torch") or {}
    compiled = parse_cudnn(info.get("cudnn_compiled"))
    if compiled is None and info.get("version"):
        try:
            tv = TorchVersion.parse(info["version"])
        except UsageError:
            tv = None
        row = ctx.matrix.torch_row(tv.line, tv.local) if tv and tv.local else None
        compiled = parse_cudnn(row.get("cudnn")) if row else None
    if loaded is None or compiled is None:
        return []
    where = live.get("cudnn_library") or "?"
    if loaded.major != compiled.major or loaded.trunc(2) < compiled.trunc(2):
        return [finding(
            "live-cudnn", "error", "cudnn",
            f"torch really loaded cuDNN {loaded} ({where}) but was built against {compiled}: "
            "the major must match and the minor be at least as high",
            fix=f"make the bundled copy load first: remove the directory of {where} from "
            "LD_LIBRARY_PATH, or pip install "
            f"'nvidia-cudnn-cu{str(info.get('cuda') or '12')[:2]}>={compiled}'",
            source=SOURCE, cudnn_loaded=loaded, cudnn_compiled=compiled, library=where)]
    return []
