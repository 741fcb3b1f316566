"""Gradients of the ``torch.ops.dnnctl`` ops, one small function per op, in torch math.

Each takes the forward's saved tensors and arguments plus the output gradient and returns
the input gradients (None where not needed). They are the one place to switch to dnnctl's
own backward ops (``pass: backward / dgrad / wgrad`` problems) as those land.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from dnnctl.torch import reference as ref

T = torch.Tensor
Opt = torch.Tensor | None


def act_grad(fn: str, z: T, grad: T, negative_slope: float = 0.01,
             approximate: str = "none") -> T:
    """d act(z) / dz * grad, computed in float32 (or z's wider dtype)."""
    if fn == "none":
        return grad
    zf, g = z.float() if z.dtype != torch.float64 else z, grad.to(torch.promote_types(
        grad.dtype, torch.float32))
    if fn == "relu":
        d = (zf > 0).to(zf.dtype)
    elif fn == "leaky_relu":
        d = torch.where(zf > 0, 1.0, negative_slope).to(zf.dtype)
    elif fn == "gelu" and approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        u = k * (zf + 0.044715 * zf ** 3)
        t = torch.tanh(u)
        d = 0.5 * (1 + t) + 0.5 * zf * (1 - t * t) * k * (1 + 3 * 0.044715 * zf * zf)
    elif fn == "gelu":
        cdf = 0.5 * torch.erfc(-zf / math.sqrt(2.0))
        d = cdf + zf * torch.exp(-0.5 * zf * zf) / math.sqrt(2.0 * math.pi)
    elif fn == "silu":
        s = torch.sigmoid(zf)
        d = s * (1 + zf * (1 - s))
    elif fn == "sigmoid":
        s = torch.sigmoid(zf)
        d = s * (1 - s)
    elif fn == "tanh":
        t = torch.tanh(zf)
        d = 1 - t * t
    else:
        raise ValueError(f"no gradient for activation {fn!r}")
    return (g * d).to(grad.dtype)


def conv2d(grad: T, x: T, w: T, bias: Opt, residual: Opt, stride: Sequence[int],
           padding: Sequence[int], dilation: Sequence[int], groups: int, activation: str,
           needs: Sequence[bool]) -> tuple[Opt, Opt, Opt, Opt]:
    """Gradients of residual + act(conv(x, w) + bias) for (x, w, bias, residual)."""
    gz = grad
    if activation != "none":
        z = ref.conv2d(x, w, bias, stride, padding, dilation, groups, "none", None)
        gz = act_grad(activation, z, grad)
    xin, pad2 = x, list(padding)
    if len(padding) == 4:
        top, bottom, left, right = padding
        xin, pad2 = F.pad(x, (left, right, top, bottom)), [0, 0]
    gx, gw, gb = torch.ops.aten.convolution_backward(
        gz, xin, w, None if bias is None else [bias.shape[0]], list(stride), pad2,
        list(dilation), False, [0, 0], groups, [needs[0], needs[1], bias is not None and needs[2]])
    if gx is not None and len(padding) == 4:
        gx = gx[:, :, padding[0]:padding[0] + x.shape[2], padding[2]:padding[2] + x.shape[3]]
    return gx, gw, gb, grad if residual is not None and needs[3] else None


def linear(grad: T, x: T, w: T, bias: Opt, activation: str,
           needs: Sequence[bool]) -> tuple[Opt, Opt, Opt]:
    """Gradients of act(x @ w.T + bias) for (x, w, bias)."""
    gz = grad if activation == "none" else act_grad(activation, F.linear(x, w, bias), grad)
    g2 = gz.reshape(-1, w.shape[0])
    gx = (gz @ w) if needs[0] else None
    gw = (g2.t() @ x.reshape(-1, w.shape[1])) if needs[1] else None
    gb = g2.sum(0) if bias is not None and needs[2] else None
    return gx, gw, gb


def matmul(grad: T, a: T, b: T, needs: Sequence[bool]) -> tuple[Opt, Opt]:
    ga = (grad @ b.mT).sum_to_size(a.shape) if needs[0] else None
    gb = (a.mT @ grad).sum_to_size(b.shape) if needs[1] else None
    return ga, gb


def _normalized_grad(g: T, xhat: T, rstd: T, w: Opt, dims: tuple[int, ...],
                     wshape: Sequence[int]) -> T:
    """dL/dx of y = xhat * w (+ b), xhat = (x - mean) * rstd with statistics over ``dims``."""
    dxhat = g if w is None else g * w.reshape(wshape)
    return rstd * (dxhat - dxhat.mean(dims, keepdim=True)
                   - xhat * (dxhat * xhat).mean(dims, keepdim=True))


def _f(t: T) -> T:
    return t if t.dtype == torch.float64 else t.float()


def layer_norm(grad: T, x: T, weight: Opt, bias: Opt, eps: float, rms: bool,
               needs: Sequence[bool]) -> tuple[Opt, Opt, Opt]:
    """Gradients of layer_norm (rms=False) / rms_norm (rms=True) over the last axis."""
    xf, g = _f(x), _f(grad)
    w = weight if weight is None else _f(weight)
    d = xf if rms else xf - xf.mean(-1, keepdim=True)
    rstd = torch.rsqrt(d.pow(2).mean(-1, keepdim=True) + eps)
    xhat = d * rstd
    if rms:  # no mean: y = x * rstd(x)
        dxhat = g if w is None else g * w
        gx = rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True))
    else:
        gx = _normalized_grad(g, xhat, rstd, w, (-1,), (-1,))
    lead = tuple(range(x.dim() - 1))
    gw = (g * xhat).sum(lead).to(weight.dtype) if weight is not None and needs[1] else None
    gb = g.sum(lead).to(bias.dtype) if bias is not None and needs[2] else None
    return (gx.to(x.dtype) if needs[0] else None), gw, gb


def softmax(grad: T, y: T, dim: int, log: bool) -> T:
    g, yf = _f(grad), _f(y)
    if log:
        gx = g - yf.exp() * g.sum(dim, keepdim=True)
    else:
        gx = yf * (g - (g * yf).sum(dim, keepdim=True))
    return gx.to(y.dtype)


def batch_norm(grad: T, x: T, weight: Opt, bias: Opt, mean: T, invstd: T, training: bool,
               needs: Sequence[bool]) -> tuple[Opt, Opt, Opt]:
    """Gradients for (x, weight, bias); ``mean`` / ``invstd`` per channel (the batch's in
    training, the running statistics' in inference)."""
    shape = (1, -1, 1, 1)
    g, xf = _f(grad), _f(x)
    xhat = (xf - mean.reshape(shape)) * invstd.reshape(shape)
    w = None if weight is None else _f(weight)
    if training:
        gx = _normalized_grad(g, xhat, invstd.reshape(shape), w, (0, 2, 3), shape)
    else:
        gx = g * invstd.reshape(shape) * (1 if w is None else w.reshape(shape))
    gw = (g * xhat).sum((0, 2, 3)).to(weight.dtype) if weight is not None and needs[1] else None
    gb = g.sum((0, 2, 3)).to(bias.dtype) if bias is not None and needs[2] else None
    return (gx.to(x.dtype) if needs[0] else None), gw, gb


def group_norm(grad: T, x: T, groups: int, weight: Opt, bias: Opt, eps: float,
               needs: Sequence[bool]) -> tuple[Opt, Opt, Opt]:
    n, c = x.shape[:2]
    xf, g = _f(x).reshape(n, groups, -1), _f(grad)
    d = xf - xf.mean(-1, keepdim=True)
    rstd = torch.rsqrt(d.pow(2).mean(-1, keepdim=True) + eps)
    xhat = d * rstd
    wshape = (1, c) + (1,) * (x.dim() - 2)
    dxhat = g if weight is None else g * _f(weight).reshape(wshape)
    dxg = dxhat.reshape(n, groups, -1)
    gx = rstd * (dxg - dxg.mean(-1, keepdim=True) - xhat * (dxg * xhat).mean(-1, keepdim=True))
    red = (0,) + tuple(range(2, x.dim()))
    xh = xhat.reshape(x.shape)
    gw = (g * xh).sum(red).to(weight.dtype) if weight is not None and needs[1] else None
    gb = g.sum(red).to(bias.dtype) if bias is not None and needs[2] else None
    return (gx.reshape(x.shape).to(x.dtype) if needs[0] else None), gw, gb


def max_pool2d(grad: T, x: T, kernel: Sequence[int], stride: Sequence[int],
               padding: Sequence[int], dilation: Sequence[int], ceil_mode: bool) -> T:
    _, idx = torch.ops.aten.max_pool2d_with_indices(x, kernel, stride, padding, dilation,
                                                    ceil_mode)
    return torch.ops.aten.max_pool2d_with_indices_backward(grad, x, kernel, stride, padding,
                                                           dilation, ceil_mode, idx)


def avg_pool2d(grad: T, x: T, kernel: Sequence[int], stride: Sequence[int],
               padding: Sequence[int], ceil_mode: bool, count_include_pad: bool) -> T:
    return torch.ops.aten.avg_pool2d_backward(grad, x, kernel, stride, padding, ceil_mode,
                                              count_include_pad, None)


def global_avg_pool2d(grad: T, x: T) -> T:
    return (grad / (x.shape[2] * x.shape[3])).expand(x.shape).contiguous(
        memory_format=torch.channels_last if x.is_contiguous(
            memory_format=torch.channels_last) and not x.is_contiguous()
        else torch.contiguous_format)


def activation(grad: T, x: T, fn: str, negative_slope: float, approximate: str) -> T:
    return act_grad(fn, x, grad, negative_slope, approximate)
