"""Gradients on dnnctl's own backward kernels, from torch tensors, and their problem keys.

Each ``*_keys`` function returns the backward problems a gradient runs (pass label ->
(op, key)), exactly the keys the public ``dnnctl.ops`` backward functions build for the same
call, so a recorded training workload tunes what runs. Each gradient function calls those
public functions: CUDA tensors go in by pointer, CPU tensors as NumPy views (numpy backend).
Results come back as torch tensors in the input's memory format.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import dnnctl.ops as dops
from dnnctl.ops.batch_norm.backward_function import _BACKWARD as _BN_BACKWARD
from dnnctl.torch import keys
from dnnctl.torch._tensors import (
    as_4d,
    call,
    call_spec,
    fp32,
    in_layout,
    is_nhwc,
    nchw_of,
    nhwc_view,
    storage_view,
)

T = torch.Tensor
Opt = torch.Tensor | None
Keys = dict[str, tuple[str, dict[str, Any]]]


def _cast(t: Opt, like: Opt) -> Opt:
    return t if t is None or like is None or t.dtype == like.dtype else t.to(like.dtype)


# ----------------------------------------------------------------------------- conv2d


def conv2d_keys(x: T, w: T, bias: bool, stride: Sequence[int], padding: Sequence[int],
                dilation: Sequence[int], groups: int, need_x: bool, need_w: bool) -> Keys:
    """dgrad (bias / activation / residual are the forward's) and wgrad (bias grad fused)."""
    nhwc = is_nhwc(x)
    out: Keys = {}
    base = keys.conv2d(x, w, False, tuple(stride), tuple(padding), tuple(dilation), groups,
                       "none", False, nhwc)
    if need_x:
        out["dgrad"] = ("conv2d", {**base, "pass": "dgrad"})
    if need_w:
        out["wgrad"] = ("conv2d", {**base, "bias": bias, "pass": "wgrad"})
    return out


def conv2d(gz: T, x: T, w: T, stride: Sequence[int], padding: Sequence[int],
           dilation: Sequence[int], groups: int, dgrad: bool, wgrad: bool, bias_grad: bool
           ) -> tuple[Opt, Opt, Opt]:
    """(dx, dw, db) of conv2d from the pre-activation gradient ``gz`` (None where not run)."""
    kw = {"stride": tuple(stride), "padding": tuple(padding), "dilation": tuple(dilation),
          "groups": groups}
    gx = gw = gb = None
    if is_nhwc(x):
        g = nhwc_view(gz)
        n, c, h, wd = x.shape
        k, cg, r, s = w.shape
        if dgrad:
            gx = nchw_of(call(dops.conv2d_backward_data, (g, nhwc_view(w)),
                              x_shape=(n, h, wd, c), layout="NHWC", **kw))
        if wgrad:
            dw, gb = call(dops.conv2d_backward_weight, (nhwc_view(x), g),
                          w_shape=(k, r, s, cg), layout="NHWC", bias_grad=bias_grad, **kw)
            gw = nchw_of(dw)
    else:
        g = gz.contiguous()
        if dgrad:
            gx = call(dops.conv2d_backward_data, (g, w.contiguous()), x_shape=tuple(x.shape),
                      layout="NCHW", **kw)
        if wgrad:
            gw, gb = call(dops.conv2d_backward_weight, (x.contiguous(), g),
                          w_shape=tuple(w.shape), layout="NCHW", bias_grad=bias_grad, **kw)
    return gx, gw, gb


# ----------------------------------------------------------------------------- linear / matmul


def linear_keys(x: T, w: T) -> Keys:
    """The two products of ``y = x @ w.T``'s backward as dnnctl.ops.matmul_backward runs
    them: dx = dy @ w and dw^T = x^T @ dy (x's rows folded)."""
    out_f, in_f = w.shape
    rows = x.numel() // in_f
    base = {"batch": 1, "dtype": keys.dtype_name(x.dtype), "bias": False,
            "activation": "none", "tf32": False}
    return {"dgrad": ("matmul", {**base, "m": rows, "n": in_f, "k": out_f, "trans_a": False,
                                 "trans_b": False}),
            "wgrad": ("matmul", {**base, "m": in_f, "n": out_f, "k": rows, "trans_a": True,
                                 "trans_b": False})}


def linear(gz: T, x: T, w: T, bias_grad: bool) -> tuple[T, T, Opt]:
    """(dx, dw, dbias) of ``x @ w.T + bias`` from the pre-activation gradient ``gz``."""
    in_f = w.shape[1]
    x2 = x.reshape(-1, in_f).contiguous()
    g2 = gz.reshape(-1, w.shape[0])
    da, db, dbias = call(dops.matmul_backward, (g2, x2, w.t()), bias_grad=bias_grad)
    return da.reshape(x.shape), db.t(), dbias


def matmul_keys(a: T, b: T) -> Keys:
    """Products of a 2-D / 3-D ``a @ b``'s backward (as dnnctl.ops.matmul_backward runs)."""
    m, k = a.shape[-2:]
    n = b.shape[-1]
    base = {"dtype": keys.dtype_name(a.dtype), "bias": False, "activation": "none",
            "tf32": False}
    if a.dim() == 3 and b.dim() == 2:  # shared b: db over all rows
        rows = a.shape[0] * m
        return {"dgrad": ("matmul", {**base, "batch": 1, "m": rows, "n": k, "k": n,
                                     "trans_a": False, "trans_b": True}),
                "wgrad": ("matmul", {**base, "batch": 1, "m": k, "n": n, "k": rows,
                                     "trans_a": True, "trans_b": False})}
    batch = a.shape[0] if a.dim() == 3 else 1
    return {"dgrad": ("matmul", {**base, "batch": batch, "m": m, "n": k, "k": n,
                                 "trans_a": False, "trans_b": True}),
            "wgrad": ("matmul", {**base, "batch": batch, "m": k, "n": n, "k": m,
                                 "trans_a": True, "trans_b": False})}


def matmul(grad: T, a: T, b: T) -> tuple[T, T]:
    da, db, _ = call(dops.matmul_backward, (grad.contiguous(), a.contiguous(), b.contiguous()),
                     bias_grad=False)
    return da, db


# ----------------------------------------------------------------------------- norms


def rownorm_keys(op: str, x: T, weight: bool, bias: bool) -> Keys:
    return {"backward": (op, {**keys.rownorm(op, x, weight, bias), "pass": "backward"})}


def row_stats(rows: T, eps: float, rms: bool) -> tuple[Opt, Opt]:
    """(mean or None, rstd), (rows,) each, of the (rows, cols) tensor ``rows`` from torch's
    own one-pass reductions: ``native_layer_norm`` (its statistics; it also writes a y, unused)
    and, for rms_norm, a float32-accumulated vector norm. The backward kernels take them in
    place of dnnctl.ops' float32 recompute (a float32 copy of x, then five elementwise or
    reduction passes: about 1.0 ms of a ViT-B/16 4-block training step's 1.4 ms of layer_norm
    backward on the H100). (None, None) where torch would hand back low-precision statistics
    (16-bit tensors off CUDA): the backward then computes them itself in float32."""
    if not rows.is_cuda and rows.dtype not in (torch.float32, torch.float64):
        return None, None
    n = rows.shape[0]
    if rms:
        norm = torch.linalg.vector_norm(rows, 2, -1, dtype=torch.float32)
        return None, torch.rsqrt(norm.square_().div_(rows.shape[1]).add_(eps))
    _, mean, rstd = torch.ops.aten.native_layer_norm(rows, [rows.shape[1]], None, None, eps)
    return mean.reshape(n), rstd.reshape(n)


def layer_norm(grad: T, x: T, weight: Opt, bias: Opt, eps: float, rms: bool
               ) -> tuple[T, Opt, Opt]:
    cols = x.shape[-1]
    rows, g = x.reshape(-1, cols).contiguous(), grad.reshape(-1, cols).contiguous()
    mean, rstd = row_stats(rows, eps, rms)
    if rms:
        dx, dw = call(dops.rms_norm_backward, (g, rows, weight, rstd), eps=eps)
        db = None
    else:
        dx, dw, db = call(dops.layer_norm_backward, (g, rows, weight, mean, rstd), eps=eps,
                          bias=bias is not None)
    return dx.reshape(x.shape), _cast(dw, weight), _cast(db, bias)


def softmax_keys(x: T, dim: int, log: bool) -> Keys:
    return {"backward": ("softmax", {**keys.softmax(x, dim, log), "pass": "backward"})}


def softmax(grad: T, y: T, dim: int, log: bool) -> T:
    return call(dops.softmax_backward, (y.contiguous(), grad.contiguous()), axis=dim, log=log)


def _spatial(x: T, grad: T) -> tuple[T, T, bool]:
    """(x, grad) as the NCHW / NHWC kernels read them, and whether NHWC."""
    nhwc = is_nhwc(x)
    return in_layout(x, nhwc), in_layout(grad, nhwc), nhwc


def batch_norm_keys(x: T, affine: bool, activation: str = "none",
                    residual: bool = False) -> Keys:
    return {"backward": ("batch_norm", {**keys.batch_norm(x, is_nhwc(x), True, affine,
                                                          activation, residual),
                                        "pass": "backward"})}


def batch_norm(grad: T, x: T, weight: Opt, bias: Opt, mean: T, invstd: T,
               activation: str = "none", residual: Opt = None) -> tuple[T, Opt, Opt, Opt]:
    """Training-mode batch_norm (relu(batch_norm [+ residual]) with ``activation="relu"``)
    from the forward's saved (fp32) batch statistics: (dx, dweight, dbias, dresidual)."""
    xs, gs, nhwc = _spatial(x, grad)
    z = None if residual is None else in_layout(residual, nhwc)
    # the op's call pipeline as dnnctl.ops.batch_norm_backward(gs, xs, mean, invstd,
    # weight, layout, bias=, activation=, residual=) enters it
    out = call_spec(_BN_BACKWARD,
                    (gs, xs, fp32(weight), fp32(mean), fp32(invstd),
                     fp32(bias) if activation == "relu" and weight is not None else None, z),
                    ("NHWC" if nhwc else "NCHW", activation), None)
    dx, dw, db = out[0], out[1], out[2]
    dz = None
    if residual is not None:
        dz = nchw_of(out[3]) if nhwc else out[3]
    return (nchw_of(dx) if nhwc else dx), _cast(dw, weight), _cast(db, bias), dz


def group_norm_keys(x: T, groups: int, affine: bool) -> Keys:
    x4 = as_4d(x)
    return {"backward": ("group_norm", {**keys.group_norm(x4, is_nhwc(x4), groups, affine),
                                        "pass": "backward"})}


def group_norm(grad: T, x: T, groups: int, weight: Opt, bias: Opt, eps: float
               ) -> tuple[T, Opt, Opt]:
    xs, gs, nhwc = _spatial(as_4d(x), as_4d(grad))
    dx, dw, db = call(dops.group_norm_backward, (gs, xs), groups=groups, weight=fp32(weight),
                      eps=eps, layout="NHWC" if nhwc else "NCHW")
    dx = nchw_of(dx) if nhwc else dx
    return dx.reshape(x.shape), _cast(dw, weight), _cast(db, bias)


# ----------------------------------------------------------------------------- pools


def pool_keys(x: T, mode: str, kernel: Sequence[int], stride: Sequence[int],
              padding: Sequence[int], dilation: Sequence[int], ceil_mode: bool,
              count_include_pad: bool) -> Keys:
    key = keys.pool2d(x, is_nhwc(x), mode, tuple(kernel), tuple(stride), tuple(padding),
                      tuple(dilation), ceil_mode, count_include_pad)
    return {"backward": ("pool2d", {**key, "pass": "backward"})}


def max_pool2d(grad: T, x: T, kernel: Sequence[int], stride: Sequence[int],
               padding: Sequence[int], dilation: Sequence[int], ceil_mode: bool) -> T:
    """dx from the argmax of dnnctl's max pooling with indices (recomputed, as torch does)."""
    xs, gs, nhwc = _spatial(x, grad)
    kw = {"kernel": tuple(kernel), "stride": tuple(stride), "padding": tuple(padding),
          "dilation": tuple(dilation), "ceil_mode": ceil_mode,
          "layout": "NHWC" if nhwc else "NCHW"}
    _, idx = call(dops.max_pool2d_with_indices, (xs,), **kw)
    dx = call(dops.max_pool2d_backward, (gs, idx), input_shape=tuple(xs.shape), **kw)
    return nchw_of(dx) if nhwc else dx


def avg_pool2d(grad: T, x: T, kernel: Sequence[int], stride: Sequence[int],
               padding: Sequence[int], ceil_mode: bool, count_include_pad: bool) -> T:
    xs, gs, nhwc = _spatial(x, grad)
    dx = call(dops.avg_pool2d_backward, (gs,), input_shape=tuple(xs.shape),
              kernel=tuple(kernel), stride=tuple(stride), padding=tuple(padding),
              ceil_mode=ceil_mode, count_include_pad=count_include_pad,
              layout="NHWC" if nhwc else "NCHW")
    return nchw_of(dx) if nhwc else dx


def gap_keys(x: T) -> Keys:
    return {"backward": ("global_avg_pool2d",
                         {**keys.global_avg_pool2d(x, is_nhwc(x)), "pass": "backward"})}


def global_avg_pool2d(grad: T, x: T) -> T:
    nhwc = is_nhwc(x)
    n, c, h, w = x.shape
    g = nhwc_view(grad) if nhwc else grad.contiguous()
    dx = call(dops.global_avg_pool2d_backward, (g,),
              input_shape=(n, h, w, c) if nhwc else (n, c, h, w),
              layout="NHWC" if nhwc else "NCHW")
    return nchw_of(dx) if nhwc else dx


# ----------------------------------------------------------------------------- activations


def act_name(fn: str, approximate: str) -> str:
    return "gelu_tanh" if fn == "gelu" and approximate == "tanh" else fn


def activation_keys(x: T, fn: str, approximate: str) -> Keys:
    xs, _ = storage_view(x)
    return {"backward": ("activation", {**keys.activation(act_name(fn, approximate), xs),
                                        "pass": "backward"})}


def activation(grad: T, x: T, fn: str, negative_slope: float, approximate: str) -> T:
    """dx of an element-wise activation, over x's storage order (channels-last kept)."""
    xs, cl = storage_view(x)
    if cl:
        gs = grad.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)
    else:
        gs = grad.contiguous()
    name = act_name(fn, approximate)

    def run(dy: Any, xa: Any) -> Any:
        return dops.activation_backward(name, dy, xa, negative_slope=negative_slope)

    dx = call(run, (gs, xs))
    return nchw_of(dx) if cl else dx


# ----------------------------------------------------------------------------- attention


def attention_keys(q: T, k: T, v: T, is_causal: bool, scale: float | None) -> Keys:
    return {"backward": ("attention", {**keys.attention(q, k, v, is_causal, scale),
                                       "pass": "backward"})}


def attention(grad: T, q: T, k: T, v: T, out: T, lse: T, is_causal: bool,
              scale: float | None) -> tuple[T, T, T]:
    """(dq, dk, dv) from the forward's out and lse (dnnctl.ops.attention_backward)."""
    return call(dops.attention_backward, (grad.contiguous(), q.contiguous(), k.contiguous(),
                                          v.contiguous(), out.contiguous(), lse.contiguous()),
                causal=bool(is_causal), scale=scale)
