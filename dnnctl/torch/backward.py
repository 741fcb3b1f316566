"""Gradients of the ``torch.ops.dnnctl`` ops, one small function per op.

Each takes the forward's saved tensors and arguments plus the output gradient and returns
the input gradients (None where not needed). ``plan`` is the op's plan handle: per backward
problem (``pass: dgrad / wgrad / backward``, the matmul products of linear / matmul) it
picks dnnctl's own backward kernel (:mod:`dnnctl.torch.own_grads`) or torch's path here
(torch's own backward kernels, as eager autograd runs them; rms_norm, which torch has no
public backward kernel for, as a float32 formula), as :func:`dnnctl.torch.grad_plan.decide`
says (the handle's backward mode and plan). A problem dnnctl refuses runs torch's path and
is counted in ``FALLBACKS``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from dnnctl.errors import DnnctlError
from dnnctl.ops.batch_norm.vendor_backward import cudnn_backward
from dnnctl.ops.dispatch import use_plan
from dnnctl.torch import grad_plan as gp
from dnnctl.torch import kernels as K
from dnnctl.torch import own_grads as og
from dnnctl.torch import reference as ref
from dnnctl.torch._tensors import is_nhwc

T = torch.Tensor
Opt = torch.Tensor | None


def _own(op: str, labels: Sequence[str], run: Callable[[], Any], plan: int) -> Any:
    """run() on dnnctl under the handle's plan, counted per pass label; None (and a
    FALLBACKS count) on refusal."""
    chosen = K.plan_of(plan)
    try:
        if chosen is None:  # the active plan, if any, stays active
            out = run()
        else:
            with use_plan(chosen):
                out = run()
    except DnnctlError as exc:
        K._fallback(f"{op} backward", exc)
        return None
    for label in labels:
        gp.count(op, label, "dnnctl")
    return out


def _torch(op: str, labels: Sequence[str]) -> None:
    for label in labels:
        gp.count(op, label, "torch")


def _single(op: str, plan: int, x: T, make_keys: Callable[[], og.Keys],
            run: Callable[[], Any], call_key: tuple | None = None) -> Any:
    """The one ``backward`` problem of a memory-bound op on dnnctl, or None for torch
    (``call_key``: see :func:`dnnctl.torch.grad_plan.decide`)."""
    if "backward" in gp.decide(op, plan, x, make_keys, call_key=call_key):
        out = _own(op, ("backward",), run, plan)
        if out is not None:
            return out
    _torch(op, ("backward",))
    return None


_ATEN = torch.ops.aten


def _common(*tensors: Opt) -> torch.dtype:
    """The widest floating dtype of the given tensors (None ones left out)."""
    dt = None
    for t in tensors:
        if t is not None:
            d = t.dtype
            dt = d if dt is None or dt is d else torch.promote_types(dt, d)
    return dt  # type: ignore[return-value]


def _to(t: Opt, dtype: torch.dtype) -> Opt:
    """t in ``dtype`` (itself when it is already: a no-op ``.to`` is a C call too)."""
    return t if t is None or t.dtype is dtype else t.to(dtype)


def _mask(needs: Sequence[bool], weight: Opt, bias: Opt) -> list[bool]:
    """torch's output mask (dx, dweight, dbias) of a normalization backward."""
    return [needs[0], weight is not None and needs[1], bias is not None and needs[2]]


def differentiated(forward: Callable[[], T], inputs: Sequence[Opt], needs: Sequence[bool],
                   grad: T) -> tuple[Opt, ...]:
    """The gradients of ``forward()`` (torch's own ops over ``inputs``, the saved tensors
    themselves) for the inputs ``needs`` asks, with a graph of their own: for a backward
    that must itself be differentiable (``create_graph=True``) where torch's fused backward
    kernel has no derivative, as eager autograd does there."""
    wanted = [t for t, n in zip(inputs, needs) if n and t is not None]
    got = iter(torch.autograd.grad(forward(), wanted, grad, create_graph=True,
                                   allow_unused=True) if wanted else ())
    out = [next(got) if n and t is not None else None for t, n in zip(inputs, needs)]
    return tuple(torch.zeros_like(t) if g is None and t is not None and n else g
                 for g, t, n in zip(out, inputs, needs))


def act_grad(fn: str, z: T, grad: T, negative_slope: float = 0.01,
             approximate: str = "none") -> T:
    """d act(z) / dz * grad by torch's own backward kernel (as eager autograd runs it), in
    the wider of z's and grad's dtypes, returned in grad's."""
    if fn == "none":
        return grad
    dt = _common(z, grad)
    g, zz = _to(grad, dt), _to(z, dt)
    if fn == "relu":
        out = _ATEN.threshold_backward(g, zz, 0)
    elif fn == "leaky_relu":
        out = _ATEN.leaky_relu_backward(g, zz, negative_slope, False)
    elif fn == "gelu":
        out = _ATEN.gelu_backward(g, zz, approximate=approximate)
    elif fn == "silu":
        if torch.is_grad_enabled():  # create_graph: silu_backward has no derivative; eager
            # autograd takes this formula then too
            sig = torch.sigmoid(zz)
            out = g * sig * (1 + zz * (1 - sig))
        else:
            out = _ATEN.silu_backward(g, zz)
    elif fn == "sigmoid":
        out = _ATEN.sigmoid_backward(g, torch.sigmoid(zz))
    elif fn == "tanh":
        out = _ATEN.tanh_backward(g, torch.tanh(zz))
    elif fn == "relu6":  # torch's F.relu6 is hardtanh(0, 6)
        out = _ATEN.hardtanh_backward(g, zz, 0.0, 6.0)
    elif fn == "hardswish":
        out = _ATEN.hardswish_backward(g, zz)
    elif fn == "hardsigmoid":
        out = _ATEN.hardsigmoid_backward(g, zz)
    else:
        raise ValueError(f"no gradient for activation {fn!r}")
    return _to(out, grad.dtype)


def conv2d(grad: T, x: T, w: T, bias: Opt, residual: Opt, stride: Sequence[int],
           padding: Sequence[int], dilation: Sequence[int], groups: int, activation: str,
           needs: Sequence[bool], plan: int = 0, residual_before_act: bool = False
           ) -> tuple[Opt, Opt, Opt, Opt]:
    """Gradients of residual + act(conv(x, w) + bias) (or of act(conv(x, w) + bias +
    residual), ``residual_before_act``) for (x, w, bias, residual)."""
    gz = grad
    before = residual_before_act and residual is not None and activation != "none"
    if activation != "none":
        z = ref.conv2d(x, w, bias, stride, padding, dilation, groups, "none",
                       residual if before else None)
        gz = act_grad(activation, z, grad)
    need_x, need_w, need_b = needs[0], needs[1], bias is not None and needs[2]
    use = gp.decide("conv2d", plan, x, lambda: og.conv2d_keys(
        x, w, need_b, stride, padding, dilation, groups, need_x, need_w or need_b))
    gx = gw = gb = None
    dgrad, wgrad = need_x and "dgrad" in use, (need_w or need_b) and "wgrad" in use
    if dgrad or wgrad:
        labels = [lb for lb, on in (("dgrad", dgrad), ("wgrad", wgrad)) if on]
        got = _own("conv2d", labels, lambda: og.conv2d(gz, x, w, stride, padding, dilation,
                                                       groups, dgrad, wgrad, need_b), plan)
        if got is None:
            dgrad = wgrad = False
        else:
            gx, gw, gb = got
    rest = [need_x and not dgrad, need_w and not wgrad, need_b and not wgrad]
    if any(rest):
        _torch("conv2d", [lb for lb, on in (("dgrad", rest[0]), ("wgrad", rest[1] or rest[2]))
                          if on])
        tx, tw, tb = _conv2d_torch(gz, x, w, bias, stride, padding, dilation, groups, rest)
        gx, gw, gb = (tx if rest[0] else gx), (tw if rest[1] else gw), (tb if rest[2] else gb)
    return gx, gw, gb, (gz if before else grad) if residual is not None and needs[3] else None


def _conv2d_torch(gz: T, x: T, w: T, bias: Opt, stride: Sequence[int],
                  padding: Sequence[int], dilation: Sequence[int], groups: int,
                  mask: Sequence[bool]) -> tuple[Opt, Opt, Opt]:
    xin, pad2 = x, list(padding)
    if len(padding) == 4:
        top, bottom, left, right = padding
        xin, pad2 = F.pad(x, (left, right, top, bottom)), [0, 0]
    gx, gw, gb = torch.ops.aten.convolution_backward(
        gz, xin, w, None if bias is None else [bias.shape[0]], list(stride), pad2,
        list(dilation), False, [0, 0], groups, [mask[0], mask[1], bias is not None and mask[2]])
    if gx is not None and len(padding) == 4:
        gx = gx[:, :, padding[0]:padding[0] + x.shape[2], padding[2]:padding[2] + x.shape[3]]
    return gx, gw, gb


def linear(grad: T, x: T, w: T, bias: Opt, activation: str,
           needs: Sequence[bool], plan: int = 0) -> tuple[Opt, Opt, Opt]:
    """Gradients of act(x @ w.T + bias) for (x, w, bias)."""
    gz = grad if activation == "none" else act_grad(activation, F.linear(x, w, bias), grad)
    need_b = bias is not None and needs[2]
    use = gp.decide("matmul", plan, x, lambda: og.linear_keys(x, w))
    if {"dgrad", "wgrad"} <= use:  # dnnctl.ops.matmul_backward runs both products
        got = _own("matmul", ("dgrad", "wgrad"), lambda: og.linear(gz, x, w, need_b), plan)
        if got is not None:
            gx, gw, gb = got
            return (gx if needs[0] else None), (gw if needs[1] else None), _cast(gb, bias)
    _torch("matmul", ("dgrad", "wgrad"))
    g2 = gz.reshape(-1, w.shape[0])
    gx = (gz @ w) if needs[0] else None
    gw = (g2.t() @ x.reshape(-1, w.shape[1])) if needs[1] else None
    gb = g2.sum(0) if need_b else None
    return gx, gw, gb


def _cast(t: Opt, like: Opt) -> Opt:
    return t if t is None or like is None or t.dtype == like.dtype else t.to(like.dtype)


def matmul(grad: T, a: T, b: T, needs: Sequence[bool], plan: int = 0) -> tuple[Opt, Opt]:
    if a.shape[:-2] == b.shape[:-2] or (a.dim() == 3 and b.dim() == 2):
        use = gp.decide("matmul", plan, a, lambda: og.matmul_keys(a, b))
        if {"dgrad", "wgrad"} <= use:
            got = _own("matmul", ("dgrad", "wgrad"), lambda: og.matmul(grad, a, b), plan)
            if got is not None:
                return (got[0] if needs[0] else None), (got[1] if needs[1] else None)
    _torch("matmul", ("dgrad", "wgrad"))
    ga = (grad @ b.mT).sum_to_size(a.shape) if needs[0] else None
    gb = (a.mT @ grad).sum_to_size(b.shape) if needs[1] else None
    return ga, gb


def _f(t: T) -> T:
    return t if t.dtype == torch.float64 else t.float()


def layer_norm(grad: T, x: T, weight: Opt, bias: Opt, eps: float, rms: bool,
               needs: Sequence[bool], plan: int = 0) -> tuple[Opt, Opt, Opt]:
    """Gradients of layer_norm (rms=False) / rms_norm (rms=True) over the last axis."""
    op = "rms_norm" if rms else "layer_norm"
    got = _single(op, plan, x, lambda: og.rownorm_keys(op, x, weight is not None,
                                                       bias is not None),
                  lambda: og.layer_norm(grad, x, weight, bias, eps, rms))
    if got is not None:
        gx, gw, gb = got
        return (gx if needs[0] else None), (gw if needs[1] else None), (
            gb if needs[2] else None)
    if not rms:  # torch's own kernels: the statistics (one pass), then its fused backward
        dt, shape = _common(x, grad, weight, bias), [x.shape[-1]]
        xd = _to(x, dt)
        _, mean, rstd = _ATEN.native_layer_norm(xd, shape, None, None, eps)
        gx, gw, gb = _ATEN.native_layer_norm_backward(
            _to(grad, dt), xd, shape, mean, rstd, _to(weight, dt), _to(bias, dt),
            _mask(needs, weight, bias))
        return _cast(gx, x), _cast(gw, weight), _cast(gb, bias)
    xf, g = _f(x), _f(grad)  # rms_norm: y = x * rstd(x), no mean
    w = weight if weight is None else _f(weight)
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    xhat = xf * rstd
    dxhat = g if w is None else g * w
    gx = rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True))
    gw = None
    if weight is not None and needs[1]:
        gw = g * xhat  # summed over the leading dims; a single row (1-D x) has none, and
        # sum(()) would reduce every dim
        gw = (gw.sum(tuple(range(x.dim() - 1))) if x.dim() > 1 else gw).to(weight.dtype)
    return (gx.to(x.dtype) if needs[0] else None), gw, None


def softmax(grad: T, y: T, dim: int, log: bool, plan: int = 0) -> T:
    got = _single("softmax", plan, y, lambda: og.softmax_keys(y, dim, log),
                  lambda: og.softmax(grad, y, dim, log))
    if got is not None:
        return got
    dt = _common(grad, y)  # torch's own kernels
    fn = _ATEN._log_softmax_backward_data if log else _ATEN._softmax_backward_data
    return _to(fn(_to(grad, dt), _to(y, dt), dim, dt), y.dtype)


def relu_gate(grad: T, x: T, weight: Opt, bias: Opt, mean: T, invstd: T,
              residual: Opt = None) -> T:
    """grad through relu(batch_norm(x) [+ residual]): zero where the forward's
    pre-activation (x - mean) * invstd * weight + bias [+ residual] (fp32, recomputed from
    x) was not positive."""
    shape = (1, -1) + (1,) * (x.dim() - 2)
    scale = invstd.float() if weight is None else invstd.float() * weight.float()
    pre = (x.float() - mean.float().view(shape)) * scale.view(shape)
    if bias is not None:
        pre = pre + bias.float().view(shape)
    if residual is not None:
        pre = pre + residual.float()
    return grad * (pre > 0).to(grad.dtype)


def batch_norm(grad: T, x: T, weight: Opt, bias: Opt, mean: T, invstd: T, training: bool,
               needs: Sequence[bool], plan: int = 0, activation: str = "none",
               residual: Opt = None, y: Opt = None, eps: float = 1e-5
               ) -> tuple[Opt, Opt, Opt, Opt]:
    """Gradients for (x, weight, bias, residual); ``mean`` / ``invstd`` per channel (the
    batch's in training, the running statistics' in inference: torch only, dnnctl's
    backward is the training one). ``activation="relu"``: of relu(batch_norm(x) [+
    residual]) (the fused op), ``y`` its output when saved (torch's path then gates the
    gradient by it, as the ReLU's own backward does); without the ReLU the residual's
    gradient is grad itself. torch's path runs the kernels eager autograd runs: the ReLU's
    threshold_backward, then cuDNN's batch_norm backward where torch would pick cuDNN
    (``eps``: the forward's), else torch's native one."""
    if x.numel() == 0:  # an empty batch: no gradient flows (torch's kernels refuse it)
        return ((torch.zeros_like(x) if needs[0] else None),
                (torch.zeros_like(weight) if weight is not None and needs[1] else None),
                (torch.zeros_like(bias) if bias is not None and needs[2] else None),
                (torch.zeros_like(residual) if residual is not None and needs[3] else None))
    if training and (residual is None or activation == "relu"):
        got = _single("batch_norm", plan, x,
                      lambda: og.batch_norm_keys(x, weight is not None, activation,
                                                 residual is not None),
                      lambda: og.batch_norm(grad, x, weight, bias, mean, invstd, activation,
                                            residual),
                      (x.shape, x.stride(), x.dtype, x.get_device(), weight is not None,
                       activation, residual is not None))
        if got is not None:
            gx, gw, gb, gz = got
            return ((gx if needs[0] else None), (gw if needs[1] else None),
                    (gb if needs[2] else None), (gz if needs[3] else None))
    # torch's own kernel (as eager autograd runs it), in the wider of x's and grad's dtypes
    # with float32 (or wider) parameters and statistics; inference passes the running
    # statistics as (mean, 1 / invstd**2) with eps 0, which gives back invstd
    if activation == "relu":
        grad = (relu_gate(grad, x, weight, bias, mean, invstd, residual) if y is None
                else _ATEN.threshold_backward(grad, y if y.dtype is grad.dtype
                                              else y.to(grad.dtype), 0))
    gz = _cast(grad, residual) if residual is not None and needs[3] else None
    got = (cudnn_backward(x, grad, weight, bias, mean, invstd, eps, is_nhwc(x))
           if training else None)
    if got is not None:
        gx, gw, gb = got
        return ((gx if needs[0] else None), (gw if needs[1] else None),
                (gb if needs[2] else None), gz)
    dt = _common(x, grad)
    acc = torch.promote_types(dt, torch.float32)
    mean, invstd = _to(mean, acc), _to(invstd, acc)
    stats = (None, None, mean, invstd) if training else (
        mean, invstd.double().pow(-2).to(acc), None, None)
    w = _to(weight, acc) if weight is not None or training else torch.ones_like(mean)
    gx, gw, gb = _ATEN.native_batch_norm_backward(_to(grad, dt), _to(x, dt), w, *stats,
                                                  training, 0.0,
                                                  _mask(needs[:3], weight, bias))
    return _cast(gx, x), _cast(gw, weight), _cast(gb, bias), gz


def group_norm(grad: T, x: T, groups: int, weight: Opt, bias: Opt, eps: float,
               needs: Sequence[bool], plan: int = 0) -> tuple[Opt, Opt, Opt]:
    if x.dim() in (3, 4):
        got = _single("group_norm", plan, x,
                      lambda: og.group_norm_keys(x, groups, weight is not None),
                      lambda: og.group_norm(grad, x, groups, weight, bias, eps))
        if got is not None:
            gx, gw, gb = got
            return (gx if needs[0] else None), (gw if needs[1] else None), (
                gb if needs[2] else None)
    if torch.is_grad_enabled():  # create_graph: native_group_norm_backward has no
        # derivative
        return differentiated(lambda: F.group_norm(x, groups, weight, bias, eps),
                              (x, weight, bias), needs, grad)  # type: ignore[return-value]
    n, c = x.shape[:2]  # torch's own kernels, in the widest dtype of the tensors
    dt = _common(x, grad, weight)
    xc, hw = x.to(dt).contiguous(), math.prod(x.shape[2:])
    _, mean, rstd = _ATEN.native_group_norm(xc, None, None, n, c, hw, groups, eps)
    gx, gw, gb = _ATEN.native_group_norm_backward(
        grad.to(dt).contiguous(), xc, mean, rstd, _to(weight, dt), n, c, hw, groups,
        _mask(needs, weight, bias))
    return _cast(gx, x), _cast(gw, weight), _cast(gb, bias)


def max_pool2d(grad: T, x: T, kernel: Sequence[int], stride: Sequence[int],
               padding: Sequence[int], dilation: Sequence[int], ceil_mode: bool,
               plan: int = 0) -> T:
    got = _single("pool2d", plan, x, lambda: og.pool_keys(x, "max", kernel, stride, padding,
                                                          dilation, ceil_mode, True),
                  lambda: og.max_pool2d(grad, x, kernel, stride, padding, dilation, ceil_mode))
    if got is not None:
        return got
    _, idx = torch.ops.aten.max_pool2d_with_indices(x, kernel, stride, padding, dilation,
                                                    ceil_mode)
    return torch.ops.aten.max_pool2d_with_indices_backward(grad, x, kernel, stride, padding,
                                                           dilation, ceil_mode, idx)


def avg_pool2d(grad: T, x: T, kernel: Sequence[int], stride: Sequence[int],
               padding: Sequence[int], ceil_mode: bool, count_include_pad: bool,
               plan: int = 0) -> T:
    got = _single("pool2d", plan, x,
                  lambda: og.pool_keys(x, "avg", kernel, stride, padding, (1, 1), ceil_mode,
                                       count_include_pad),
                  lambda: og.avg_pool2d(grad, x, kernel, stride, padding, ceil_mode,
                                        count_include_pad))
    if got is not None:
        return got
    if x.is_cuda and any(padding) and not x.is_contiguous() and \
            x.is_contiguous(memory_format=torch.channels_last):
        # torch's channels-last CUDA kernel ignores the padding and returns wrong gradients
        # (pytorch/pytorch#188344, fixed by #188345 in July 2026): run its NCHW kernel
        gx = torch.ops.aten.avg_pool2d_backward(grad.contiguous(), x.contiguous(), kernel,
                                                stride, padding, ceil_mode,
                                                count_include_pad, None)
        return gx.contiguous(memory_format=torch.channels_last)
    return torch.ops.aten.avg_pool2d_backward(grad, x, kernel, stride, padding, ceil_mode,
                                              count_include_pad, None)


def global_avg_pool2d(grad: T, x: T, plan: int = 0) -> T:
    got = _single("global_avg_pool2d", plan, x, lambda: og.gap_keys(x),
                  lambda: og.global_avg_pool2d(grad, x))
    if got is not None:
        return got
    return (grad / (x.shape[2] * x.shape[3])).expand(x.shape).contiguous(
        memory_format=torch.channels_last if x.is_contiguous(
            memory_format=torch.channels_last) and not x.is_contiguous()
        else torch.contiguous_format)


def activation(grad: T, x: T, fn: str, negative_slope: float, approximate: str,
               plan: int = 0) -> T:
    got = _single("activation", plan, x, lambda: og.activation_keys(x, fn, approximate),
                  lambda: og.activation(grad, x, fn, negative_slope, approximate))
    if got is not None:
        return got
    return act_grad(fn, x, grad, negative_slope, approximate)


def attention(grad: T, q: T, k: T, v: T, out: T, lse: T, is_causal: bool,
              scale: float | None, enable_gqa: bool, needs: Sequence[bool], plan: int = 0
              ) -> tuple[Opt, Opt, Opt]:
    """(dq, dk, dv) of SDPA: dnnctl's attention backward (from the saved out and lse), or
    torch's, by recomputing the forward under autograd in the inputs' dtype."""
    if q.dim() == 4:
        got = _single("attention", plan, q,
                      lambda: og.attention_keys(q, k, v, is_causal, scale),
                      lambda: og.attention(grad, q, k, v, out, lse, is_causal, scale))
        if got is not None:
            return tuple(g if n else None for g, n in zip(got, needs))  # type: ignore[return-value]
    kw = {"enable_gqa": True} if enable_gqa else {}
    if torch.is_grad_enabled():  # create_graph: gradients with a graph to q, k, v; torch's
        # math SDPA, whose backward is differentiable (the fused kernels' are not)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def forward() -> T:
            with sdpa_kernel(SDPBackend.MATH):
                return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal,
                                                      scale=scale, **kw)
        return differentiated(forward, (q, k, v), needs[:3], grad)  # type: ignore[return-value]
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(bool(n)) for t, n in zip((q, k, v), needs)]
        o = F.scaled_dot_product_attention(*leaves, is_causal=is_causal, scale=scale, **kw)
        wanted = [t for t in leaves if t.requires_grad]
        grads = iter(torch.autograd.grad(o, wanted, grad.to(o.dtype)) if wanted else ())
    return tuple(next(grads) if n else None for n in needs[:3])  # type: ignore[return-value]
