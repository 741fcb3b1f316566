"""``torch.autocast`` for the ``torch.ops.dnnctl`` ops, with torch's own casting policy.

Inside an autocast region torch casts its ops' inputs: convolutions and matrix products to
the region's dtype (float16 / bfloat16), on CUDA normalizations and softmax to float32, and leaves
batch norm, pooling and activations in their input's dtype. The dnnctl ops follow the same
policy, so a patched model under autocast computes in the dtypes eager torch does (and runs
dnnctl's float16 / bfloat16 kernels for its convolutions and GEMMs). Ops with no entry here
fall through autocast unchanged, as torch's batch_norm, pooling and activations do.
"""

from __future__ import annotations

from typing import Any

import torch

from dnnctl.torch.reference import ACTS

# op -> "low" (the autocast dtype) or "fp32": torch's CUDA lists
POLICY: dict[str, str] = {
    "conv2d": "low", "conv_transpose2d": "low", "linear": "low", "matmul": "low",
    "attention": "low",
    "layer_norm": "fp32", "rms_norm": "fp32", "group_norm": "fp32",
    "softmax": "fp32", "log_softmax": "fp32",
}
# torch's CPU autocast casts the same products down, but has no float32 entry for the norms
# or softmax: they run in their input's dtype there
POLICIES: dict[str, dict[str, str]] = {
    "cuda": POLICY,
    "cpu": {op: p for op, p in POLICY.items() if p == "low"},
}
DEVICES = tuple(POLICIES)


def _cast(value: Any, device_type: str, dtype: torch.dtype) -> Any:
    """value with its floating tensors on ``device_type`` (not float64) cast to ``dtype``."""
    if isinstance(value, torch.Tensor):
        if (value.is_floating_point() and value.device.type == device_type
                and value.dtype is not torch.float64 and value.dtype is not dtype):
            return value.to(dtype)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, device_type, dtype) for v in value)
    return value


def autocast_key(device_type: str) -> Any:
    """The device's Autocast dispatch key (AutocastCUDA, AutocastCPU)."""
    return getattr(torch._C.DispatchKey,
                   "Autocast" + torch._C._dispatch_key_for_device(device_type))


def runner(names: list[str], call: Any, policy: str, device_type: str) -> Any:
    """What autocast does for an op with arguments ``names``: its inputs cast by ``policy``,
    then ``call(*args)`` with the device's autocast key excluded (the op's own torch calls
    run as the casts left them, as under torch's autocast kernels)."""
    keyset = torch._C.DispatchKeySet(autocast_key(device_type))
    res = names.index("residual") if "residual" in names else -1
    act = names.index("activation") if "activation" in names else -1
    before = names.index("residual_before_act") if "residual_before_act" in names else -1

    def run(*args: Any) -> Any:
        dtype = (torch.get_autocast_dtype(device_type) if policy == "low"
                 else torch.float32)
        with torch._C._ExcludeDispatchKeyGuard(keyset):
            r = args[res] if 0 <= res < len(args) else None
            if isinstance(r, torch.Tensor) and r.dtype is not dtype:
                # eager adds the residual to the product in the autocast dtype with type
                # promotion (a float32 residual stream stays float32): no fused add then
                if 0 <= before < len(args) and args[before]:  # act(conv + bias + residual)
                    plain = list(args)  # activation comes before residual_before_act
                    fn, plain[res], plain[act], plain[before] = args[act], None, "none", False
                    return ACTS[fn](call(*_cast(tuple(plain), device_type, dtype)) + r)
                out = call(*_cast((*args[:res], None, *args[res + 1:]), device_type, dtype))
                return out + r
            return call(*_cast(args, device_type, dtype))

    return run


def register(lib: torch.library.Library, direct: dict[str, Any]
             ) -> dict[tuple[str, str], Any]:
    """Register the autocast kernels of the ops in :data:`POLICY` on ``lib``; return the
    same casts around each op's ``direct`` entry (plain eager tensors, no dispatcher), by
    (device type, op)."""
    runs: dict[tuple[str, str], Any] = {}
    for device_type, policies in POLICIES.items():
        if not torch._C._is_autocast_available(device_type):
            continue
        key = autocast_key(device_type)
        for name, policy in policies.items():
            op = getattr(torch.ops.dnnctl, name).default
            names = [a.name for a in op._schema.arguments]
            run = runner(names, op, policy, device_type)
            lib.impl(name, (lambda r: lambda _keyset, *args: r(*args))(run), key.name,
                     with_keyset=True)
            op.py_impl(key)(run)  # the Python dispatcher (torch.compile) takes this one
            runs[(device_type, name)] = runner(names, direct[name], policy, device_type)
    return runs
