"""Problem keys of the calls the torch ops make, for recording workloads.

Each function returns the key ``dnnctl.ops.<op>`` builds for the same call (tests check that
they agree with the dispatcher), so a recorded workload tunes exactly what runs.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dnnctl.ops.base import dtype_name


def _dt(x: torch.Tensor) -> str:
    return dtype_name(x.dtype)


def conv2d(x: torch.Tensor, w: torch.Tensor, bias: bool, stride: tuple[int, ...],
           padding: tuple[int, ...], dilation: tuple[int, ...], groups: int, activation: str,
           residual: bool, nhwc: bool, residual_before_act: bool = False) -> dict[str, Any]:
    """x, w logical NCHW / KCRS (as torch); ``nhwc`` is the layout the call runs in."""
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    return {"n": n, "c": c, "h": h, "w": wd, "k": k, "r": r, "s": s, "stride": list(stride),
            "pad": list(padding), "dilation": list(dilation), "groups": groups,
            "dtype": _dt(x), "layout": "NHWC" if nhwc else "NCHW", "bias": bias,
            "activation": activation, "residual": residual,
            "residual_before_act": residual_before_act, "tf32": False}


def linear(x: torch.Tensor, w: torch.Tensor, bias: bool, activation: str) -> dict[str, Any]:
    """y = x @ w.T: rows of x against w stored (out, in), read transposed."""
    out_f, in_f = w.shape
    rows = math.prod(x.shape[:-1])
    return {"batch": 1, "m": rows, "n": out_f, "k": in_f, "dtype": _dt(x), "trans_a": False,
            "trans_b": True, "bias": bias, "activation": activation, "tf32": False}


def matmul(a: torch.Tensor, b: torch.Tensor) -> dict[str, Any]:
    """Contiguous 2-D / 3-D operands (the torch op makes them so)."""
    m, k = a.shape[-2:]
    n = b.shape[-1]
    ba = a.shape[0] if a.dim() == 3 else None
    bb = b.shape[0] if b.dim() == 3 else None
    batch = max(ba or 1, bb or 1)
    if bb in (None, 1) and batch > 1:
        rows, batch = batch * m, 1
    else:
        rows = m
    return {"batch": batch, "m": rows, "n": n, "k": k, "dtype": _dt(a), "trans_a": False,
            "trans_b": False, "bias": False, "activation": "none", "tf32": False}


def rownorm(op: str, x: torch.Tensor, weight: bool, bias: bool) -> dict[str, Any]:
    cols = x.shape[-1]
    key = {"rows": x.numel() // cols, "cols": cols, "dtype": _dt(x), "weight": weight}
    if op == "layer_norm":
        key["bias"] = bias
    return key


def softmax(x: torch.Tensor, dim: int, log: bool) -> dict[str, Any]:
    cols = x.shape[dim]
    return {"rows": x.numel() // cols, "cols": cols, "dtype": _dt(x), "log": log}


def _nchw(x: torch.Tensor, nhwc: bool) -> dict[str, Any]:
    n, c, h, w = x.shape
    return {"n": n, "c": c, "h": h, "w": w, "dtype": _dt(x),
            "layout": "NHWC" if nhwc else "NCHW"}


def batch_norm(x: torch.Tensor, nhwc: bool, training: bool, affine: bool,
               activation: str = "none", residual: bool = False) -> dict[str, Any]:
    key = {**_nchw(x, nhwc), "training": training, "affine": affine}
    # the fields' defaults ("none", no residual) are left out: such keys stay as they were
    if activation != "none":
        key["activation"] = activation
    if residual:
        key["residual"] = True
    return key


def group_norm(x: torch.Tensor, nhwc: bool, groups: int, affine: bool) -> dict[str, Any]:
    return {**_nchw(x, nhwc), "groups": groups, "affine": affine}


def pool2d(x: torch.Tensor, nhwc: bool, mode: str, kernel: tuple[int, ...],
           stride: tuple[int, ...], padding: tuple[int, ...], dilation: tuple[int, ...],
           ceil_mode: bool, count_include_pad: bool) -> dict[str, Any]:
    return {**_nchw(x, nhwc), "mode": mode, "kernel": list(kernel), "stride": list(stride),
            "pad": list(padding), "dilation": list(dilation), "ceil_mode": ceil_mode,
            "count_include_pad": count_include_pad if mode == "avg" else True}


def global_avg_pool2d(x: torch.Tensor, nhwc: bool) -> dict[str, Any]:
    return _nchw(x, nhwc)


def activation(fn: str, storage: torch.Tensor) -> dict[str, Any]:
    """An activation over a tensor's storage (no bias: the key is NCHW by convention)."""
    return {"fn": fn, "shape": list(storage.shape), "dtype": _dt(storage), "bias": "none",
            "layout": "NCHW", "inplace": False}


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
              scale: float | None) -> dict[str, Any]:
    """The key of an SDPA call on BHSD tensors (torch's causal mask is top-left aligned)."""
    from dnnctl.ops.attention.function import parse

    return parse(q, k, v, causal=bool(is_causal), scale=scale).key


def conv_transpose2d(x: torch.Tensor, w: torch.Tensor, out_hw: tuple[int, int],
                     stride: tuple[int, ...], padding: tuple[int, ...],
                     dilation: tuple[int, ...], groups: int, nhwc: bool) -> dict[str, Any]:
    """The conv2d dgrad key a transposed convolution runs: the forward convolution whose
    input is the transposed one's output (``out_hw``) and whose output is its input x."""
    n, cin, _, _ = x.shape
    _, cout_g, r, s = w.shape
    return {"n": n, "c": cout_g * groups, "h": out_hw[0], "w": out_hw[1], "k": cin, "r": r,
            "s": s, "stride": list(stride), "pad": list(padding), "dilation": list(dilation),
            "groups": groups, "dtype": _dt(x), "layout": "NHWC" if nhwc else "NCHW",
            "bias": False, "activation": "none", "residual": False, "tf32": False,
            "pass": "dgrad"}


def hashable(key: dict[str, Any]) -> dict[str, Any]:
    """key with list values as tuples (the dispatcher's problem cache hashes keys)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in key.items()}
