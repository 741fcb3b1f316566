"""dnnctl forwards for torch.nn modules: which modules dnnctl can run, and how.

:func:`forward_for` returns ``(forward, op, note)`` for a module dnnctl covers or
``(None, None, reason)`` for one it leaves to torch. A forward calls the ``torch.ops.dnnctl``
operator when autograd or a compiler is watching, and the eager kernel directly otherwise
(no dispatcher round trip on the inference hot path).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear
from torch.nn.utils.parametrize import type_before_parametrizations

from dnnctl.ops.matmul.function import _MATMUL
from dnnctl.ops.rownorm.function import _ROWNORM
from dnnctl.torch import attention, keys
from dnnctl.torch import grad_plan as gp
from dnnctl.torch import kernels as K
from dnnctl.torch import own_grads as og
from dnnctl.torch._tensors import is_nhwc
from dnnctl.torch.geometry import (
    CONV_ATTRS,
    POOL_ATTRS,
    Geometry,
    conv1d_args,
    conv_args,
    conv_t_args,
    pool_args,
)
from dnnctl.torch.library import batch_norm_train_, direct_ok, plain_eager, run_op
from dnnctl.torch.native import Direct

# Each forward is a functools.partial of a module-level function over the module: a deep
# copy of the model (copy.deepcopy: EMA weights, an evaluation copy) rebinds it to the copy's
# own module, where a closure would keep computing with the original's parameters.


def _training_torch(x: torch.Tensor) -> bool:
    """A call autograd records, eager, on CUDA: where :func:`dnnctl.torch.grad_plan.
    torch_trains` may hand a whole product (forward and gradients) to torch."""
    return _grad_on() and x.is_cuda and plain_eager(x)


_grad_on = torch.is_grad_enabled


def _param(m: nn.Module, name: str) -> Any:
    """``m.<name>`` of a parameter (or a None one) from the module's dict: nn.Module.__getattr__
    costs ~0.5 us a read (a failed normal lookup first). A name not in the dict (a
    parametrized tensor: parametrize's class makes it a property, computed on every read)
    is read as an attribute."""
    d = m._parameters
    return d[name] if name in d else getattr(m, name)


def _buffer(m: nn.Module, name: str) -> Any:
    """``m.<name>`` of a buffer, as :func:`_param` reads a parameter."""
    d = m._buffers
    return d[name] if name in d else getattr(m, name)


def _note_torch(op: str, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Count a product torch trains: its forward as a vendor call through torch, its
    gradients as torch's (what the op's own path would count)."""
    K.VENDOR_VIA_TORCH[op] += 1
    if x.requires_grad:
        gp.count(op, "dgrad", "torch")
    if w.requires_grad or (bias is not None and bias.requires_grad):
        gp.count(op, "wgrad", "torch")


def _conv_fwd(m: nn.Conv2d, handle: int, geometry: Geometry,
              x: torch.Tensor) -> torch.Tensor:
    eager = plain_eager(x)  # (one compile check for the geometry and the route)
    stride, pad, dil = geometry.eager_of(m) if eager else geometry.of(m)
    # read once: a parametrized weight (spectral_norm in training updates its power
    # iteration on each read) is computed once a call, as the module's own forward does
    w, b = _param(m, "weight"), _param(m, "bias")
    groups = m.groups
    if (eager and len(pad) == 2 and _grad_on() and x.is_cuda and x.dim() == 4 and x.numel()
            and gp.torch_trains(
                "conv2d", handle, x, w,
                # x's strides stand for its layout (is_nhwc(x) is a function of them)
                (x.shape, x.stride(), x.dtype, x.get_device(), w.shape, w.dtype, b is None,
                 stride, pad, dil, groups),
                _conv_key, _conv_grad_keys, b is not None, stride, pad, dil, groups)):
        _note_torch("conv2d", x, w, b)
        return F.conv2d(x, w, b, stride, pad, dil, groups)
    return run_op("conv2d", x, w, b, stride, pad, dil, groups, "none", None, handle)


def _conv_key(xm: torch.Tensor, wm: torch.Tensor, bias: bool, stride: Any, pad: Any,
              dil: Any, groups: int) -> dict[str, Any]:
    """A conv with nothing fused: its forward key (see grad_plan.torch_trains)."""
    return keys.conv2d(xm, wm, bias, stride, pad, dil, groups, "none", False, is_nhwc(xm))


def _conv_grad_keys(xm: torch.Tensor, wm: torch.Tensor, bias: bool, stride: Any, pad: Any,
                    dil: Any, groups: int) -> og.Keys:
    return og.conv2d_keys(xm, wm, bias, stride, pad, dil, groups, True, True)


def _conv(m: nn.Conv2d, handle: int) -> Callable[..., Any]:
    return partial(_conv_fwd, m, handle, Geometry(CONV_ATTRS, conv_args))


def conv1d_as_2d(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                 geometry: tuple[list[int], list[int], list[int]], groups: int,
                 act: str, residual: torch.Tensor | None, handle: int) -> torch.Tensor:
    """(N, C, L) as conv2d over (N, C, 1, L) with a (K, C/g, 1, k) filter (and residual):
    views, so autograd flows through them; an unbatched (C, L) input as a batch of one."""
    if x.dim() == 2:
        return conv1d_as_2d(x.unsqueeze(0), w, b, geometry, groups, act,
                            None if residual is None else residual.unsqueeze(0),
                            handle).squeeze(0)
    y = run_op("conv2d", x.unsqueeze(2), w.unsqueeze(2), b, *geometry, groups, act,
               None if residual is None else residual.unsqueeze(2), handle)
    return y.squeeze(2)


def _conv1d_fwd(m: nn.Conv1d, handle: int, geometry: Geometry,
                x: torch.Tensor) -> torch.Tensor:
    return conv1d_as_2d(x, m.weight, m.bias, geometry.of(m), m.groups, "none", None, handle)


def _conv1d(m: nn.Conv1d, handle: int) -> Callable[..., Any]:
    return partial(_conv1d_fwd, m, handle, Geometry(CONV_ATTRS, conv1d_args))


def _conv_t_fwd(m: nn.ConvTranspose2d, handle: int, geometry: Geometry, x: torch.Tensor,
                output_size: Any = None) -> torch.Tensor:
    """A transposed convolution as dnnctl's conv2d data gradient; an explicit output_size or
    an unbatched input runs the module's own forward."""
    if output_size is not None or x.dim() != 4:
        return type(m).forward(m, x, output_size)
    stride, pad, opad, dil = geometry.of(m)
    return run_op("conv_transpose2d", x, m.weight, m.bias, stride, pad, opad, dil, m.groups,
                  handle)


def _conv_t(m: nn.ConvTranspose2d, handle: int) -> Callable[..., Any]:
    return partial(_conv_t_fwd, m, handle,
                   Geometry(("stride", "padding", "output_padding", "dilation"), conv_t_args))


def _mha(m: nn.MultiheadAttention, handle: int) -> Callable[..., Any]:
    return partial(attention.mha_forward, m, handle)


def linear_call(direct: Direct, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                act: str, handle: int) -> torch.Tensor:
    """A patched linear's (and linear -> act's) call: in eager inference its site's replay
    Program once one is recorded (:class:`Direct`: no run_op, no signature), else
    ``dnnctl::linear``. A linear torch runs itself (a vendor choice: ``F.linear``) makes no
    site, and Direct stops looking for one after a few calls."""
    if x.is_cuda and direct_ok(x, w, b):
        if act == "none" and x.numel() and K.torch_runs_linear(x, w, b, handle):
            # torch's own cuBLAS call is the choice: straight to it (what run_op's kernel
            # would do, less its checks)
            K.VENDOR_VIA_TORCH["matmul"] += 1
            return F.linear(x, w, b)
        x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        if x2.is_contiguous() and x2.numel() and w.dim() == 2:
            # the arrays and scalars kernels.linear gives dnnctl.ops.matmul
            arrays = (x2, w.t(), b)
            k = (x.shape, x.stride(), x.dtype, x.device, w.shape, w.dtype, b is None)
            y = direct.run(k, arrays, K.plan_of(handle))
            if y is None:
                y = run_op("linear", x, w, b, act, handle)
                direct.learn(k, _MATMUL, arrays, (None if act == "none" else act, False))
                return y
            return y if x2 is x else y.reshape(*x.shape[:-1], w.shape[0])
    return run_op("linear", x, w, b, act, handle)


def _linear_fwd(m: nn.Linear, handle: int, direct: Direct, x: torch.Tensor) -> torch.Tensor:
    w, b = _param(m, "weight"), _param(m, "bias")  # read once (see _conv_fwd)
    return _linear_of(handle, direct, x, w, b)


def _linear_of(handle: int, direct: Direct, x: torch.Tensor, w: torch.Tensor,
               b: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, w, b)`` on dnnctl, or torch's where a training plan says torch."""
    if (_training_torch(x) and x.dim() >= 2 and x.numel() and w.numel()
            and gp.torch_trains(
                "matmul", handle, x, w,
                (x.shape, x.dtype, x.get_device(), w.shape, w.dtype, b is None),
                lambda xm, wm: keys.linear(xm, wm, b is not None, "none"),
                lambda xm, wm: og.linear_keys(xm, wm))):
        _note_torch("matmul", x, w, b)
        return F.linear(x, w, b)
    return linear_call(direct, x, w, b, "none", handle)


def _linear(m: nn.Linear, handle: int) -> Callable[..., Any]:
    return partial(_linear_fwd, m, handle, Direct())


def _gpt_conv1d_fwd(m: nn.Module, handle: int, direct: Direct, x: torch.Tensor) -> Any:
    """transformers' Conv1D: ``addmm(bias, x.view(-1, nx), weight)`` with the weight stored
    (nx, nf), viewed back to x's leading dims: a linear of the weight's transpose (a view)."""
    w, b = _param(m, "weight"), _param(m, "bias")
    if w.dim() != 2 or x.shape[-1] != w.shape[0] or b is None or b.shape != (w.shape[1],):
        return type(m).forward(m, x)  # (torch's error, or its result)
    return _linear_of(handle, direct, x, w.t(), b)


def _gpt_conv1d(m: nn.Module, handle: int) -> Callable[..., Any]:
    return partial(_gpt_conv1d_fwd, m, handle, Direct())


# modules of other libraries, known by their class's name and the names its forward's code
# reads (its exact set: a class that computes anything else is not taken), each a published
# class whose forward is known
BY_CODE: dict[tuple[str, frozenset[str]], tuple[str, Callable[[Any, int], Callable[..., Any]]]] = {
    # GPT-2, OpenAI GPT, Image GPT, CTRL: huggingface/transformers pytorch_utils.py
    # (modeling_utils.py before v4.20): size_out = x.size()[:-1] + (self.nf,); x =
    # torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight); x.view(size_out)
    ("Conv1D", frozenset({"size", "nf", "torch", "addmm", "bias", "view", "weight"})):
        ("matmul", _gpt_conv1d),
}


def _by_code(kind: type) -> tuple[str, Callable[[Any, int], Callable[..., Any]]] | None:
    code = getattr(kind.__dict__.get("forward"), "__code__", None)
    if code is None:
        return None
    return BY_CODE.get((kind.__name__, frozenset(code.co_names)))


def bn_fwd(m: nn.BatchNorm2d, handle: int, x: torch.Tensor, activation: str = "none",
           residual: torch.Tensor | None = None) -> torch.Tensor:
    """A BatchNorm2d's forward on dnnctl (training: batch statistics, its running ones
    updated as torch does), + ``residual`` and batch_norm's fused ReLU when asked."""
    if x.dim() != 4:
        raise ValueError(f"expected 4D input (got {x.dim()}D input)")
    rm, rv = _buffer(m, "running_mean"), _buffer(m, "running_var")
    w, b = _param(m, "weight"), _param(m, "bias")
    if not m.training:
        return run_op("batch_norm", x, rm, rv, w, b, m.eps, handle, activation, residual)
    momentum = m.momentum
    if momentum is None:  # a cumulative average (BN recalibration: swa_utils.update_bn sets
        # it): torch's factor, 1 / the batches seen with this one
        momentum = 1.0 / float(_buffer(m, "num_batches_tracked") + 1)
    if (plain_eager(x) and rm.dtype is _F32 and rv.dtype is _F32 and rm.is_contiguous()
            and rv.is_contiguous()):
        # eager: the kernel updates the running statistics in place, as torch's does
        y = batch_norm_train_(x, rm, rv, w, b, momentum, m.eps, handle, activation, residual)
    else:  # the functional op (torch.compile, modes): new statistics, copied back
        y, nm, nv, _, _ = run_op("batch_norm_train", x, rm, rv, w, b, momentum, m.eps,
                                 handle, activation, residual)
        # one launch; the new statistics carry no gradient (no torch.no_grad block, which
        # torch.export writes as a subgraph its verifier refused in a training ResNet)
        torch._foreach_copy_([rm, rv], [nm.detach(), nv.detach()])
    # a buffer with no gradient, as torch's module does
    _buffer(m, "num_batches_tracked").add_(1)
    return y


_F32 = torch.float32


def _bn(m: nn.BatchNorm2d, handle: int) -> Callable[..., Any]:
    return partial(bn_fwd, m, handle)


def _bn1d_fwd(m: nn.BatchNorm1d, handle: int, x: torch.Tensor) -> torch.Tensor:
    """(N, C) or (N, C, L) as batch_norm over the (N, C, 1, L) view (statistics per C)."""
    if x.dim() not in (2, 3):
        raise ValueError(f"expected 2D or 3D input (got {x.dim()}D input)")
    x4 = x[:, :, None, None] if x.dim() == 2 else x.unsqueeze(2)
    return bn_fwd(m, handle, x4).reshape(x.shape)


def _bn1d(m: nn.BatchNorm1d, handle: int) -> Callable[..., Any]:
    return partial(_bn1d_fwd, m, handle)


def _instance_norm_fwd(m: Any, handle: int, x: torch.Tensor) -> torch.Tensor:
    """Per-sample, per-channel statistics: group_norm with one channel per group (2d: (N, C,
    H, W), 1d: (N, C, L); an unbatched input as a batch of one)."""
    if x.dim() == (3 if isinstance(m, nn.InstanceNorm2d) else 2):
        return _instance_norm_fwd(m, handle, x.unsqueeze(0)).squeeze(0)
    return run_op("group_norm", x, x.shape[1], m.weight, m.bias, m.eps, handle)


def _instance_norm(m: Any, handle: int) -> Callable[..., Any]:
    return partial(_instance_norm_fwd, m, handle)


def _rows(m: Any, x: torch.Tensor) -> tuple[torch.Tensor, Any, Any] | None:
    """A norm over the trailing ``normalized_shape`` as rows of their product: (x as rows,
    weight, bias flattened); None where x's trailing dims are not normalized_shape (torch's
    own forward then raises its error)."""
    nd = len(m.normalized_shape)
    if nd == 1:
        return x, _param(m, "weight"), _bias(m)
    if tuple(x.shape[-nd:]) != tuple(m.normalized_shape):
        return None
    flat = [None if t is None else t.reshape(-1) for t in (_param(m, "weight"), _bias(m))]
    return x.reshape(*x.shape[:-nd], -1), flat[0], flat[1]


def _bias(m: Any) -> Any:
    """A norm's bias (see :func:`_param`); None for RMSNorm, which has none."""
    d = m._parameters
    return d["bias"] if "bias" in d else getattr(m, "bias", None)


def _layer_norm_fwd(m: nn.LayerNorm, handle: int, direct: Direct,
                    x: torch.Tensor) -> torch.Tensor:
    rows = _rows(m, x)
    if rows is None:
        return type(m).forward(m, x)
    xr, w, b = rows
    return _rownorm_call(direct, "layer_norm", x, xr, w, b, m.eps, handle)


def _rownorm_call(direct: Direct, op: str, x: torch.Tensor, xr: torch.Tensor, w: Any,
                  b: Any, eps: float, handle: int) -> torch.Tensor:
    """A patched LayerNorm's / RMSNorm's call on x (``xr``: x as rows of the normalized
    size): in eager inference its site's Program once recorded (:class:`Direct`), else
    ``dnnctl::<op>``."""
    args = (xr, w, eps, handle) if op == "rms_norm" else (xr, w, b, eps, handle)
    if x.is_cuda and direct_ok(x, w, b):
        x2 = xr if xr.dim() == 2 else xr.reshape(-1, xr.shape[-1])
        if x2.is_contiguous():
            # the arrays and scalars kernels.layer_norm / rms_norm give dnnctl.ops
            arrays, k = (x2, w, b, None), (x.shape, x.stride(), x.dtype, x.device, eps)
            y = direct.run(k, arrays, K.plan_of(handle))
            if y is None:
                y = run_op(op, *args)
                direct.learn(k, _ROWNORM, arrays, (op, eps))
            return y if y.shape == x.shape else y.reshape(x.shape)
    y = run_op(op, *args)
    return y if xr is x else y.reshape(x.shape)


def _layer_norm(m: nn.LayerNorm, handle: int) -> Callable[..., Any]:
    return partial(_layer_norm_fwd, m, handle, Direct())


def _rms_norm_fwd(m: Any, handle: int, direct: Direct, x: torch.Tensor) -> torch.Tensor:
    rows = _rows(m, x)
    if rows is None:
        return type(m).forward(m, x)
    xr, w, _ = rows
    eps = m.eps if m.eps is not None else torch.finfo(x.dtype).eps
    return _rownorm_call(direct, "rms_norm", x, xr, w, None, eps, handle)


def _rms_norm(m: Any, handle: int) -> Callable[..., Any]:
    return partial(_rms_norm_fwd, m, handle, Direct())


def _group_norm_fwd(m: nn.GroupNorm, handle: int, x: torch.Tensor) -> torch.Tensor:
    return run_op("group_norm", x, m.num_groups, _param(m, "weight"), _param(m, "bias"), m.eps,
                  handle)


def _group_norm(m: nn.GroupNorm, handle: int) -> Callable[..., Any]:
    return partial(_group_norm_fwd, m, handle)


def _max_pool_fwd(m: nn.MaxPool2d, handle: int, geometry: Geometry,
                  x: torch.Tensor) -> torch.Tensor:
    k, st, pad, dil = geometry.of(m)
    return run_op("max_pool2d", x, k, st, pad, dil, m.ceil_mode, handle)


def _max_pool(m: nn.MaxPool2d, handle: int) -> Callable[..., Any]:
    return partial(_max_pool_fwd, m, handle, Geometry((*POOL_ATTRS, "dilation"), pool_args))


def _avg_pool_fwd(m: nn.AvgPool2d, handle: int, geometry: Geometry,
                  x: torch.Tensor) -> torch.Tensor:
    k, st, pad, _ = geometry.of(m)
    return run_op("avg_pool2d", x, k, st, pad, m.ceil_mode, m.count_include_pad, handle)


def _avg_pool(m: nn.AvgPool2d, handle: int) -> Callable[..., Any]:
    return partial(_avg_pool_fwd, m, handle, Geometry(POOL_ATTRS, pool_args))


def _adaptive_size(m: Any) -> tuple[Any, Any] | None:
    """(out_h, out_w) of an adaptive pool (None: the input's size), None if not 2-D."""
    size = m.output_size
    if isinstance(size, int):
        return size, size
    if isinstance(size, (tuple, list)) and len(size) == 2:
        return size[0], size[1]
    return None


def _adaptive_fwd(m: Any, handle: int, x: torch.Tensor) -> torch.Tensor:
    """An adaptive pool as the op it equals for this input: the global average for 1 x 1
    (average pools), else a pool of window = stride = input / output where the output
    divides the input (the windows are then uniform); anything else is torch's."""
    if x.dim() == 3:  # an unbatched (C, H, W) image, as torch's module takes it
        return _adaptive_fwd(m, handle, x.unsqueeze(0)).squeeze(0)
    size = _adaptive_size(m)
    if x.dim() != 4 or size is None:
        return type(m).forward(m, x)
    h, w = int(x.shape[2]), int(x.shape[3])
    oh, ow = (h if size[0] is None else size[0]), (w if size[1] is None else size[1])
    avg = isinstance(m, nn.AdaptiveAvgPool2d)
    if avg and (oh, ow) == (1, 1):
        return run_op("global_avg_pool2d", x, handle)
    if not oh or not ow or h % oh or w % ow:
        return type(m).forward(m, x)
    k = [h // oh, w // ow]
    if avg:
        return run_op("avg_pool2d", x, k, k, [0, 0], False, True, handle)
    return run_op("max_pool2d", x, k, k, [0, 0], [1, 1], False, handle)


def _adaptive(m: Any, handle: int) -> Callable[..., Any]:
    return partial(_adaptive_fwd, m, handle)


def _act_fwd(name: str, extra: tuple[Any, ...], handle: int, x: torch.Tensor) -> torch.Tensor:
    return run_op(name, x, *extra, handle)


def _act_inplace_fwd(name: str, extra: tuple[Any, ...], handle: int,
                     x: torch.Tensor) -> torch.Tensor:
    """An ``inplace=True`` activation module: the result is written back into x, as the
    module's own forward does (code may read x afterwards). Where autograd records it, the
    op reads a copy of x, which its backward keeps (as torch's autograd keeps the original
    of an in-place op whose gradient needs its input): x itself is overwritten, and a
    backward reading the saved x would refuse to run. The fx path calls the out-of-place
    form where nothing else can see x (see fuse.py)."""
    if x.requires_grad and _grad_on():
        return x.copy_(run_op(name, x.clone(), *extra, handle))
    return x.copy_(run_op(name, x, *extra, handle))


def _act_set_fwd(m: nn.Module, name: str, handle: int, inplace: bool,
                 x: torch.Tensor) -> torch.Tensor:
    """An activation with a setting (GELU's approximate, LeakyReLU's negative_slope), read
    at each call: one changed after patch is used."""
    extra = (m.approximate,) if name == "gelu" else (float(m.negative_slope),)
    return (_act_inplace_fwd if inplace else _act_fwd)(name, extra, handle, x)


def act_call(m: nn.Module, handle: int, inplace: bool) -> Callable[..., Any] | None:
    """The dnnctl forward of an activation module (in place or not), None if it is none."""
    found = act_of(m)
    if found is None:
        return None
    if found[1]:
        return partial(_act_set_fwd, m, found[0], handle, inplace)
    return partial(_act_inplace_fwd if inplace else _act_fwd, found[0], found[1], handle)


def _softmax_fwd(m: nn.Module, name: str, handle: int, x: torch.Tensor) -> torch.Tensor:
    return run_op(name, x, m.dim, handle)


def _softmax(log: bool) -> Callable[[nn.Module, int], Callable[..., Any]]:
    def make(m: nn.Module, handle: int) -> Callable[..., Any]:
        return partial(_softmax_fwd, m, "log_softmax" if log else "softmax", handle)
    return make


def act_of(m: nn.Module) -> tuple[str, tuple] | None:
    """(dnnctl op name, extra arguments) of an activation module, else None."""
    kind = type(m)  # exact types: a subclass may change forward
    if kind in (nn.ReLU, nn.SiLU, nn.Sigmoid, nn.Tanh):
        return kind.__name__.lower(), ()
    if kind is nn.GELU:
        return "gelu", (m.approximate,)
    if kind is nn.LeakyReLU:
        return "leaky_relu", (float(m.negative_slope),)
    if kind in (nn.ReLU6, nn.Hardswish, nn.Hardsigmoid):  # MobileNetV2 / V3
        return kind.__name__.lower(), ()
    return None


def why_not(m: nn.Module) -> str | None:
    """Why dnnctl does not run this module (None: it does)."""
    if isinstance(m, (nn.Conv2d, nn.Conv1d, nn.ConvTranspose2d)):
        if m.padding_mode != "zeros":
            return f"padding_mode {m.padding_mode!r} (dnnctl pads with zeros)"
        if m.padding == "same" and any(st != 1 for st in m.stride):
            return "padding 'same' with a stride"
    elif isinstance(m, (nn.InstanceNorm2d, nn.InstanceNorm1d)):
        if m.track_running_stats:
            return "track_running_stats=True (inference would use running statistics)"
    elif isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)):
        if m.training and not m.track_running_stats:
            return "training without running statistics"
        if not m.track_running_stats:
            return "no running statistics (track_running_stats=False)"
    elif isinstance(m, nn.MaxPool2d):
        if m.return_indices:
            return "return_indices=True"
    elif isinstance(m, nn.AvgPool2d):
        if m.divisor_override:
            return "divisor_override"
    elif isinstance(m, (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)):
        if _adaptive_size(m) is None:
            return f"output_size {m.output_size} is not 2-D"
        if isinstance(m, nn.AdaptiveMaxPool2d) and m.return_indices:
            return "return_indices=True"
    elif isinstance(m, nn.MultiheadAttention):
        return attention.mha_why_not(m)
    elif isinstance(m, (nn.Softmax, nn.LogSoftmax)) and m.dim is None:
        return "dim=None (implicit softmax dimension)"
    return None


MAKERS: list[tuple[type, str, Callable[[Any, int], Callable[..., Any]]]] = [
    (nn.Conv2d, "conv2d", _conv),
    (nn.Conv1d, "conv2d", _conv1d),  # as conv2d over an (N, C, 1, L) view
    (nn.ConvTranspose2d, "conv2d", _conv_t),  # the conv2d data gradient (pass dgrad)
    (nn.Linear, "matmul", _linear),
    (nn.BatchNorm2d, "batch_norm", _bn),
    (nn.BatchNorm1d, "batch_norm", _bn1d),
    (nn.InstanceNorm2d, "group_norm", _instance_norm),  # one channel per group
    (nn.InstanceNorm1d, "group_norm", _instance_norm),
    (nn.LayerNorm, "layer_norm", _layer_norm),
    *([(nn.RMSNorm, "rms_norm", _rms_norm)] if hasattr(nn, "RMSNorm") else []),
    (nn.GroupNorm, "group_norm", _group_norm),
    (nn.MaxPool2d, "pool2d", _max_pool),
    (nn.AvgPool2d, "pool2d", _avg_pool),
    (nn.AdaptiveAvgPool2d, "pool2d", _adaptive),  # global average / uniform windows
    (nn.AdaptiveMaxPool2d, "pool2d", _adaptive),
    (nn.MultiheadAttention, "attention", _mha),  # self-attention in_proj / SDPA / out_proj
    (nn.Softmax, "softmax", _softmax(False)),
    (nn.LogSoftmax, "softmax", _softmax(True)),
]


def base_type(m: nn.Module) -> type:
    """The module's class, a parametrized one's (weight_norm, spectral_norm: torch makes a
    subclass that only computes the parameter) as the class it was."""
    return type_before_parametrizations(m)


def forward_for(m: nn.Module, handle: int) -> tuple[Callable[..., Any] | None, str, str]:
    """(dnnctl forward, dnnctl op, note) for a covered module; (None, op, reason) otherwise;
    (None, "", "") for a module type dnnctl has no op for."""
    fn = act_call(m, handle, inplace=getattr(m, "inplace", False))
    if fn is not None:
        return fn, "activation", act_of(m)[0]  # type: ignore[index]
    kind = base_type(m)
    for cls, op, make in MAKERS:
        if kind is cls:  # subclasses may change forward: leave them alone
            reason = why_not(m)
            if reason is not None:
                return None, op, reason
            return make(m, handle), op, ""
    named = _by_code(kind)
    if named is not None:
        return named[1](m, handle), named[0], ""
    if type(m) is nn.TransformerEncoderLayer:  # its parts are covered: say when they run
        return None, "(container)", ("in inference without gradients torch runs the whole "
                                     "layer as one fused op (its fast path); the Linear / "
                                     "LayerNorm / attention inside run on dnnctl in training "
                                     "or with gradients")
    for cls, op, _ in MAKERS:  # said, so a model's own Conv2d / Linear classes are not
        # silently left out of the coverage (MultiheadAttention's out_proj class is a
        # Linear in all but name, read by the attention's own forward)
        if isinstance(m, cls) and type(m) is not NonDynamicallyQuantizableLinear:
            return None, op, (f"a subclass of {cls.__name__}, whose forward may differ "
                              "from it")
    if isinstance(m, nn.SyncBatchNorm):
        return None, "batch_norm", "SyncBatchNorm (statistics across processes)"
    return None, "", ""
