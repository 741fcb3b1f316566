"""The ``torch.ops.dnnctl`` operators: schema, CPU / CUDA kernels, fake kernels, autograd.

Registered through ``torch.library.Library("dnnctl", "DEF")`` (``define`` + ``impl``): the
lowest dispatcher cost of torch's custom-op paths (benchmarks/bench_torch_dispatch.py
measures it against ``@torch.library.custom_op``). Fake kernels let
``torch.compile(fullgraph=True)`` trace the ops; autograd formulas come from
:mod:`dnnctl.torch.backward`. Every op takes ``plan``, an int handle from
:func:`dnnctl.torch.kernels.plan_handle` (0: the active plan).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from dnnctl.backends import replay
from dnnctl.errors import UsageError
from dnnctl.ops.conv2d.op import output_size
from dnnctl.ops.pool.pool2d import out_size
from dnnctl.torch import autocast, native
from dnnctl.torch import backward as bw
from dnnctl.torch import grad_plan as gp
from dnnctl.torch import kernels as K
from dnnctl.torch import own_grads as og
from dnnctl.torch._tensors import ints, is_nhwc
from dnnctl.torch.reference import activation as ref_activation
from dnnctl.torch.reference import stat_dtype

NS = "dnnctl"
LIB = torch.library.Library(NS, "DEF")
ACTIVATIONS = ("relu", "silu", "sigmoid", "tanh", "relu6", "hardswish", "hardsigmoid")

SCHEMAS: dict[str, str] = {
    "conv2d": "(Tensor x, Tensor w, Tensor? bias=None, int[2] stride=[1, 1], "
              "int[] padding=[0, 0], int[2] dilation=[1, 1], int groups=1, "
              "str activation=\"none\", Tensor? residual=None, int plan=0, "
              "bool residual_before_act=False) -> Tensor",
    "linear": "(Tensor x, Tensor w, Tensor? bias=None, str activation=\"none\", int plan=0)"
              " -> Tensor",
    "conv_transpose2d": "(Tensor x, Tensor w, Tensor? bias=None, int[2] stride=[1, 1], "
                        "int[2] padding=[0, 0], int[2] output_padding=[0, 0], "
                        "int[2] dilation=[1, 1], int groups=1, int plan=0) -> Tensor",
    "matmul": "(Tensor a, Tensor b, int plan=0) -> Tensor",
    "layer_norm": "(Tensor x, Tensor? weight=None, Tensor? bias=None, float eps=1e-05, "
                  "int plan=0) -> Tensor",
    "rms_norm": "(Tensor x, Tensor? weight=None, float eps=1e-06, int plan=0) -> Tensor",
    "batch_norm": "(Tensor x, Tensor running_mean, Tensor running_var, Tensor? weight=None, "
                  "Tensor? bias=None, float eps=1e-05, int plan=0, "
                  "str activation=\"none\", Tensor? residual=None) -> Tensor",
    "batch_norm_train": "(Tensor x, Tensor running_mean, Tensor running_var, "
                        "Tensor? weight=None, Tensor? bias=None, float momentum=0.1, "
                        "float eps=1e-05, int plan=0, str activation=\"none\", "
                        "Tensor? residual=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    "group_norm": "(Tensor x, int groups, Tensor? weight=None, Tensor? bias=None, "
                  "float eps=1e-05, int plan=0) -> Tensor",
    "softmax": "(Tensor x, int dim=-1, int plan=0) -> Tensor",
    "log_softmax": "(Tensor x, int dim=-1, int plan=0) -> Tensor",
    "max_pool2d": "(Tensor x, int[2] kernel, int[] stride=[], int[2] padding=[0, 0], "
                  "int[2] dilation=[1, 1], bool ceil_mode=False, int plan=0) -> Tensor",
    "avg_pool2d": "(Tensor x, int[2] kernel, int[] stride=[], int[2] padding=[0, 0], "
                  "bool ceil_mode=False, bool count_include_pad=True, int plan=0) -> Tensor",
    "global_avg_pool2d": "(Tensor x, int plan=0) -> Tensor",
    **{fn: "(Tensor x, int plan=0) -> Tensor" for fn in ACTIVATIONS},
    "gelu": "(Tensor x, str approximate=\"none\", int plan=0) -> Tensor",
    "leaky_relu": "(Tensor x, float negative_slope=0.01, int plan=0) -> Tensor",
    # F.scaled_dot_product_attention on (B, H, S, D) tensors -> (out, lse)
    "attention": "(Tensor q, Tensor k, Tensor v, bool is_causal=False, float? scale=None, "
                 "bool enable_gqa=False, int plan=0) -> (Tensor, Tensor)",
}


def _fmt(x: torch.Tensor) -> torch.memory_format:
    return torch.channels_last if is_nhwc(x) else torch.contiguous_format


def _like(x: torch.Tensor, shape: Any = None) -> torch.Tensor:
    """The fake result: x's dtype and device, x's memory format for 4-D outputs."""
    shape = tuple(x.shape) if shape is None else tuple(shape)
    fmt = _fmt(x) if len(shape) == 4 else torch.contiguous_format
    return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=fmt)


# ----------------------------------------------------------------------------- fake kernels


def _conv2d_fake(x, w, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
                 activation="none", residual=None, plan=0, residual_before_act=False):
    p, q = output_size(x.shape[2], x.shape[3], w.shape[2], w.shape[3], ints(stride, 2),
                       ints(padding, 2), ints(dilation, 2))
    return _like(x, (x.shape[0], w.shape[0], p, q))


def _conv_transpose2d_fake(x, w, bias=None, stride=(1, 1), padding=(0, 0),
                           output_padding=(0, 0), dilation=(1, 1), groups=1, plan=0):
    hw = K.transposed_size(x, w, ints(stride, 2), ints(padding, 2), ints(output_padding, 2),
                           ints(dilation, 2))
    return _like(x, (x.shape[0], w.shape[1] * groups, *hw))


def _pool_fake(x, kernel, stride, padding, dilation, ceil_mode):
    k = ints(kernel, 2)
    st, pad, dil = (ints(stride, 2) if len(stride) else k), ints(padding, 2), ints(dilation, 2)
    return _like(x, (x.shape[0], x.shape[1],
                     *(out_size(x.shape[2 + i], k[i], st[i], pad[i], dil[i], ceil_mode)
                       for i in range(2))))


def _matmul_fake(a, b, plan=0):
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.new_empty((*batch, a.shape[-2], b.shape[-1]))


def _bn_train_fake(x, running_mean, running_var, weight=None, bias=None, momentum=0.1,
                   eps=1e-5, plan=0, activation="none", residual=None):
    c = x.shape[1]
    stat = [running_mean.new_empty(c), running_var.new_empty(c)]
    return (_like(x), *stat, x.new_empty(c, dtype=stat_dtype(x)),
            x.new_empty(c, dtype=stat_dtype(x)))


def _plain(x, *args, **kwargs):
    return x.new_empty(x.shape)


def _attention_fake(q, k, v, is_causal=False, scale=None, enable_gqa=False, plan=0):
    lse = torch.float64 if q.dtype == torch.float64 else torch.float32
    b, h, s = q.shape[:-1]  # out in (B, S, H, D) memory: kernels.sdpa_layout
    return (q.new_empty((b, s, h, v.shape[-1])).transpose(1, 2),
            q.new_empty(q.shape[:-1], dtype=lse))


FAKES: dict[str, Callable[..., Any]] = {
    "conv2d": _conv2d_fake,
    "conv_transpose2d": _conv_transpose2d_fake,
    "linear": lambda x, w, bias=None, activation="none", plan=0: x.new_empty(
        (*x.shape[:-1], w.shape[0])),
    "matmul": _matmul_fake,
    "layer_norm": _plain, "rms_norm": _plain, "softmax": _plain, "log_softmax": _plain,
    "batch_norm": lambda x, *a, **k: _like(x),
    "batch_norm_train": _bn_train_fake,
    "group_norm": lambda x, *a, **k: _like(x),
    "max_pool2d": lambda x, kernel, stride=(), padding=(0, 0), dilation=(1, 1),
    ceil_mode=False, plan=0: _pool_fake(x, kernel, stride, padding, dilation, ceil_mode),
    "avg_pool2d": lambda x, kernel, stride=(), padding=(0, 0), ceil_mode=False,
    count_include_pad=True, plan=0: _pool_fake(x, kernel, stride, padding, (1, 1), ceil_mode),
    "global_avg_pool2d": lambda x, plan=0: _like(x, (x.shape[0], x.shape[1], 1, 1)),
    **{fn: (lambda x, *a, **k: _like(x)) for fn in (*ACTIVATIONS, "gelu", "leaky_relu")},
    "attention": _attention_fake,
}

# ----------------------------------------------------------------------------- eager kernels

KERNELS: dict[str, Callable[..., Any]] = {
    "conv2d": K.conv2d, "conv_transpose2d": K.conv_transpose2d, "linear": K.linear, "matmul": K.matmul, "layer_norm": K.layer_norm,
    "rms_norm": K.rms_norm, "batch_norm": K.batch_norm, "batch_norm_train": K.batch_norm_train,
    "group_norm": K.group_norm,
    "softmax": lambda x, dim=-1, plan=0: K.softmax(x, dim, False, plan),
    "log_softmax": lambda x, dim=-1, plan=0: K.softmax(x, dim, True, plan),
    "max_pool2d": K.max_pool2d, "avg_pool2d": K.avg_pool2d,
    "global_avg_pool2d": K.global_avg_pool2d,
    **{fn: (lambda f: lambda x, plan=0: K.activation(f, x, plan=plan))(fn) for fn in ACTIVATIONS},
    "gelu": lambda x, approximate="none", plan=0: K.activation("gelu", x, approximate=approximate,
                                                               plan=plan),
    "leaky_relu": lambda x, negative_slope=0.01, plan=0: K.activation(
        "leaky_relu", x, negative_slope=negative_slope, plan=plan),
    "attention": K.attention,
}

# ----------------------------------------------------------------------------- autograd


def _save(ctx: Any, inputs: tuple, output: Any, extra: Callable[[Any], tuple] | None,
          skip: tuple[int, ...] = ()) -> None:
    """Save the tensor inputs but ``skip`` (and extra(output)) with save_for_backward, the
    rest on ctx (skipped tensors come back as None)."""
    slots, saved, rest = [], [], list(inputs)  # one pass (a training call's host time)
    for i, a in enumerate(inputs):
        if i in skip:
            rest[i] = None
        elif a is None or isinstance(a, _Tensor):
            slots.append(i)
            saved.append(a)
            rest[i] = None
    ctx.slots, ctx.rest = slots, tuple(rest)
    if extra:
        saved.extend(extra(output))
    ctx.save_for_backward(*saved)


_Tensor = torch.Tensor


def _needs(ctx: Any) -> tuple[bool, ...]:
    """needs_input_grad padded with False: the dispatcher drops trailing default arguments."""
    return tuple(ctx.needs_input_grad) + (False,) * 12


def _unpacked(ctx: Any) -> tuple[list[Any], tuple[Any, ...]]:
    """The forward's inputs (tensors back from the saved ones) and the tensors saved after
    them (``_save``'s ``extra``), from one read of ``ctx.saved_tensors``: each read unpacks
    every saved tensor again, which a saved-tensor hook may allow only once (non-reentrant
    ``torch.utils.checkpoint`` raises on a second unpack of a recomputed tensor)."""
    saved = ctx.saved_tensors
    args = list(ctx.rest)
    for i, t in zip(ctx.slots, saved):
        args[i] = t
    return args, saved[len(ctx.slots):]


def _args(ctx: Any) -> list[Any]:
    """The forward's inputs, tensors back from the saved ones."""
    return _unpacked(ctx)[0]


def _conv2d_bwd(ctx, grad):
    x, w, bias, stride, padding, dilation, groups, act, residual, plan, before = _args(ctx)
    st, pad, dil = ints(stride, 2), ints(padding, 2), ints(dilation, 2)
    gx, gw, gb, gr = bw.conv2d(grad, x, w, bias, residual, st, pad, dil, groups, act,
                               _needs(ctx)[:3] + (_needs(ctx)[8],), plan, before)
    return gx, gw, gb, None, None, None, None, None, gr, None, None


def _conv_transpose2d_bwd(ctx, grad):
    """torch's own transposed-convolution backward (aten.convolution_backward)."""
    x, w, bias, stride, padding, opad, dilation, groups, _ = _args(ctx)
    n = _needs(ctx)
    gx, gw, gb = torch.ops.aten.convolution_backward.default(
        grad, x, w, None if bias is None else [int(bias.shape[0])], list(ints(stride, 2)),
        list(ints(padding, 2)), list(ints(dilation, 2)), True, list(ints(opad, 2)), groups,
        [n[0], n[1], bias is not None and n[2]])
    return gx, gw, gb, None, None, None, None, None, None


def _linear_bwd(ctx, grad):
    x, w, bias, act, plan = _args(ctx)
    return (*bw.linear(grad, x, w, bias, act, _needs(ctx)[:3], plan), None, None)


def _matmul_bwd(ctx, grad):
    a, b, plan = _args(ctx)
    return (*bw.matmul(grad, a, b, _needs(ctx)[:2], plan), None)


def _rownorm_bwd(rms: bool) -> Callable[..., Any]:
    def backward(ctx, grad):
        if rms:
            x, weight, eps, plan = _args(ctx)
            bias = None
        else:
            x, weight, bias, eps, plan = _args(ctx)
        needs = _needs(ctx)
        gx, gw, gb = bw.layer_norm(grad, x, weight, bias, eps, rms,
                                   (needs[0], needs[1], False if rms else needs[2]), plan)
        return (gx, gw, None, None) if rms else (gx, gw, gb, None, None)
    return backward


def _softmax_bwd(log: bool) -> Callable[..., Any]:
    def backward(ctx, grad):
        (x, dim, plan), (y,) = _unpacked(ctx)
        return bw.softmax(grad, y, dim, log, plan), None, None
    return backward


def _bn_bwd(ctx, grad):
    x, rm, rv, weight, bias, eps, _, act, z = _args(ctx)  # inference: torch's formula
    invstd = torch.rsqrt(rv.double() + eps).to(torch.promote_types(rv.dtype, torch.float32))
    n = _needs(ctx)
    gx, gw, gb, gz = bw.batch_norm(grad, x, weight, bias, rm, invstd, False,
                                   (n[0], n[3], n[4], n[8]), activation=act, residual=z)
    return gx, None, None, gw, gb, None, None, None, gz


def _bn_train_bwd(ctx, grad, *_unused):
    args, extra = _unpacked(ctx)
    x, _, _, weight, bias, momentum, eps, plan, act, z = args  # running stats: unused
    mean, invstd = extra[-2:]
    y = extra[-3] if act == "relu" else None
    n = _needs(ctx)
    gx, gw, gb, gz = bw.batch_norm(grad, x, weight, bias, mean, invstd, True,
                                   (n[0], n[3], n[4], n[9]), plan, act, z, y, eps)
    return gx, None, None, gw, gb, None, None, None, None, gz


def _bn_train_setup(ctx, inputs, output):
    """The batch statistics, and with the fused ReLU its output too (what the ReLU's own
    autograd node keeps), after the inputs; the running statistics are not kept (the
    forward's caller updates them in place)."""
    relu = inputs[8] == "relu"
    _save(ctx, inputs, output,
          (lambda out: (out[0], out[3], out[4])) if relu else (lambda out: (out[3], out[4])),
          skip=(1, 2))
    # new running statistics and the batch's: no gradient flows through them (as torch's
    # batch_norm); a backward with create_graph=True would otherwise ask for derivatives
    # through the saved statistics, which torch's batch_norm backward does not have
    ctx.mark_non_differentiable(*output[1:])


def _gn_bwd(ctx, grad):
    x, groups, weight, bias, eps, plan = _args(ctx)
    n = _needs(ctx)
    gx, gw, gb = bw.group_norm(grad, x, groups, weight, bias, eps, (n[0], n[2], n[3]), plan)
    return gx, None, gw, gb, None, None


def _pool_bwd(mode: str) -> Callable[..., Any]:
    def backward(ctx, grad):
        if mode == "max":
            x, kernel, stride, padding, dilation, ceil, plan = _args(ctx)
            k = ints(kernel, 2)
            st = ints(stride, 2) if len(stride) else k
            gx = bw.max_pool2d(grad, x, k, st, ints(padding, 2), ints(dilation, 2), ceil,
                               plan)
        else:
            x, kernel, stride, padding, ceil, cip, plan = _args(ctx)
            k = ints(kernel, 2)
            st = ints(stride, 2) if len(stride) else k
            gx = bw.avg_pool2d(grad, x, k, st, ints(padding, 2), ceil, cip, plan)
        return (gx, *(None,) * 6)
    return backward


def _gap_bwd(ctx, grad):
    x, plan = _args(ctx)
    return bw.global_avg_pool2d(grad, x, plan), None


def _act_bwd(fn: str) -> Callable[..., Any]:
    def backward(ctx, grad):
        args = _args(ctx)
        x, plan = args[0], args[-1]
        slope = args[1] if fn == "leaky_relu" else 0.01
        approx = args[1] if fn == "gelu" else "none"
        gx = bw.activation(grad, x, fn, slope, approx, plan)
        return (gx, None) if fn in ACTIVATIONS else (gx, None, None)
    return backward


def _attention_bwd(ctx, grad, _grad_lse=None):
    (q, k, v, is_causal, scale, enable_gqa, plan), (out, lse) = _unpacked(ctx)
    gq, gk, gv = bw.attention(grad, q, k, v, out, lse, is_causal, scale, enable_gqa,
                              _needs(ctx)[:3], plan)
    return gq, gk, gv, None, None, None, None


def _attention_setup(ctx, inputs, output):
    _save(ctx, inputs, output, lambda out: (out[0], out[1]))
    ctx.mark_non_differentiable(output[1])  # the lse: statistics, not a result to train on


def _setup(extra: Callable[[Any], tuple] | None = None, skip: tuple[int, ...] = ()
           ) -> Callable[..., None]:
    def setup_context(ctx, inputs, output):
        _save(ctx, inputs, output, extra, skip)
    return setup_context


AUTOGRAD: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "conv2d": (_conv2d_bwd, _setup()),
    "linear": (_linear_bwd, _setup()),
    "conv_transpose2d": (_conv_transpose2d_bwd, _setup()),
    "matmul": (_matmul_bwd, _setup()),
    "layer_norm": (_rownorm_bwd(False), _setup()),
    "rms_norm": (_rownorm_bwd(True), _setup()),
    "softmax": (_softmax_bwd(False), _setup(lambda y: (y,))),
    "log_softmax": (_softmax_bwd(True), _setup(lambda y: (y,))),
    "batch_norm": (_bn_bwd, _setup()),
    "batch_norm_train": (_bn_train_bwd, _bn_train_setup),
    "group_norm": (_gn_bwd, _setup()),
    "max_pool2d": (_pool_bwd("max"), _setup()),
    "avg_pool2d": (_pool_bwd("avg"), _setup()),
    "global_avg_pool2d": (_gap_bwd, _setup()),
    **{fn: (_act_bwd(fn), _setup()) for fn in (*ACTIVATIONS, "gelu", "leaky_relu")},
    "attention": (_attention_bwd, _attention_setup),
}


def _unview(t: Any) -> Any:
    """A result that is a view (a channels-last result is the (N, C, H, W) permutation of
    the kernel's (N, H, W, C) tensor) as a tensor of its own over the same memory: autograd
    forbids in-place ops on a view a Function returns (``F.relu(conv(x), inplace=True)``)."""
    if t.__class__ is not torch.Tensor or not t._is_view():
        return t
    return t.new_empty(0).set_(t.untyped_storage(), t.storage_offset(), t.size(), t.stride())


def _autograd_kernel(name: str) -> Callable[..., Any]:
    """The op's Autograd-key kernel (what ``torch.library.register_autograd`` makes, less
    its per-call cost): an autograd.Function when a gradient is wanted; otherwise, for plain
    eager tensors with no dispatch mode active, the eager kernel called directly; else the
    redispatch below autograd (fake / functional tensors under torch.compile, modes)."""
    backward, setup = AUTOGRAD[name]
    op = getattr(torch.ops.dnnctl, name).default
    defaults = [a.default_value for a in op._schema.arguments]
    eager = KERNELS[name]
    below, after = torch._C._AutoDispatchBelowAutograd, torch._C._after_autograd_keyset
    grad_on, any_grad = torch._C.is_grad_enabled, torch._C._any_requires_grad
    modes = torch._C._len_torch_dispatch_stack
    plain = torch.Tensor

    def run(keyset: Any, args: tuple) -> Any:
        """Below autograd: plain eager tensors with no mode run the eager kernel directly,
        anything else (fake / functional tensors, modes, torch.func's wrapped tensors) the
        redispatch."""
        if args[0].__class__ is plain and not modes() and not _functorch():
            return eager(*args)
        with below():
            return op.redispatch(keyset & after, *args)

    def forward(ctx: Any, keyset: Any, *args: Any) -> Any:
        # an autograd.Function's forward runs with grad off; no keyset: from ``direct``,
        # whose caller (run_op) found plain eager tensors with no mode watching
        out = eager(*args) if keyset is None else run(keyset, args)
        out = tuple(map(_unview, out)) if isinstance(out, tuple) else _unview(out)
        # the dispatcher drops trailing arguments equal to their defaults: put them back
        setup(ctx, (*args, *defaults[len(args):]), out)
        return out

    def backward_fn(ctx: Any, *grads: Any) -> Any:
        needs = ctx.needs_input_grad
        try:
            ctx.needs_input_grad = needs[1:]  # without the keyset
            result = backward(ctx, *grads)
        finally:
            ctx.needs_input_grad = needs
        return (None, *result) if isinstance(result, tuple) else (None, result)

    fn = type(f"DnnctlBackward_{name}", (torch.autograd.Function,),
              {"forward": staticmethod(forward), "backward": staticmethod(backward_fn)})

    def func_forward(*args: Any) -> Any:
        return op(*args)  # grad is off in a Function's forward: the op runs below autograd

    def func_setup(ctx: Any, inputs: tuple, output: Any) -> None:
        setup(ctx, (*inputs, *defaults[len(inputs):]), output)

    # the same gradients in the form torch.func's transforms take (forward without ctx,
    # then setup_context; vmap's rule generated), applied above the dispatcher (run_op):
    # torch.func.grad / jacrev / per-sample gradients of a patched model
    FUNC[name] = type(f"DnnctlFunc_{name}", (torch.autograd.Function,),
                      {"forward": staticmethod(func_forward),
                       "setup_context": staticmethod(func_setup),
                       "backward": staticmethod(backward), "generate_vmap_rule": True})

    def kernel(keyset: Any, *args: Any) -> Any:
        if grad_on() and any_grad(*args):
            if _functorch():
                raise UsageError(
                    f"torch.ops.dnnctl.{name} called directly under a torch.func transform "
                    "that takes its gradient",
                    hint="call it through dnnctl.torch.library.run_op (a patched model "
                         "does), which applies the op's gradients in the form torch.func "
                         "takes")
            return fn.apply(keyset, *args)
        return run(keyset, args)

    def direct(*args: Any) -> Any:
        """This kernel's work without the dispatcher's round trip (boxing every argument
        into the C++ dispatcher and back into Python): only for plain eager tensors with no
        dispatch mode active (``run`` then never reads the keyset)."""
        if grad_on() and any_grad(*args):
            return fn.apply(None, *args)
        return eager(*args)

    DIRECT[name] = direct
    APPLY[name] = _eager_apply(fn)
    return kernel


def _eager_apply(fn: Any) -> Callable[..., Any]:
    """``fn.apply`` for callers that found plain eager tensors and no torch.func transform
    active (run_op, batch_norm_train_): torch's C apply with the dead-wrapper unwrapping
    that ``Function.apply`` does then, less its Python wrapper's other checks (a
    ``setup_context`` these Functions do not define, transforms the caller ruled out)."""
    try:
        capply = super(torch.autograd.Function, fn).apply
        from torch._C._functorch import unwrap_if_dead
    except (AttributeError, ImportError):  # another torch: its own apply
        return fn.apply
    tensor = torch.Tensor

    def apply(*args: Any) -> Any:
        return capply(*[unwrap_if_dead(a) if isinstance(a, tensor) else a for a in args])

    return apply


# op -> its Autograd kernel's work called directly (see run_op); filled by _autograd_kernel
DIRECT: dict[str, Callable[..., Any]] = {}
# op -> the apply of DIRECT's autograd.Function (keyset None: plain eager tensors)
APPLY: dict[str, Callable[..., Any]] = {}
# op -> its autograd.Function in torch.func's form (see run_op); filled by _autograd_kernel
FUNC: dict[str, Any] = {}


class _BatchNormTrainInPlace(torch.autograd.Function):
    """An eager module's training batch_norm (plain tensors, no compiler or mode watching):
    the kernel updates the running statistics in place, as torch's own batch_norm does, so
    nothing is allocated for new ones or copied back; gradients as batch_norm_train's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: Any, bias: Any, residual: Any,
                running_mean: torch.Tensor, running_var: torch.Tensor, momentum: float,
                eps: float, plan: int, activation: str) -> torch.Tensor:
        y, mean, invstd = K.batch_norm_train_(x, running_mean, running_var, weight, bias,
                                              momentum, eps, plan, activation, residual)
        y = _unview(y)
        # the fused ReLU's output gates the gradient (what the ReLU's own node keeps)
        ctx.save_for_backward(x, weight, bias, residual, mean, invstd,
                              y if activation == "relu" else None)
        ctx.hyper = (eps, plan, activation)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, weight, bias, z, mean, invstd, y = ctx.saved_tensors
        eps, plan, act = ctx.hyper
        n = ctx.needs_input_grad
        gx, gw, gb, gz = bw.batch_norm(grad, x, weight, bias, mean, invstd, True,
                                       (n[0], n[1], n[2], n[3]), plan, act, z, y, eps)
        return gx, gw, gb, gz, None, None, None, None, None, None


_BatchNormTrainInPlace.__name__ = "DnnctlBackward_batch_norm_train_"


def batch_norm_train_(x: torch.Tensor, running_mean: torch.Tensor, running_var: torch.Tensor,
                      weight: torch.Tensor | None, bias: torch.Tensor | None, momentum: float,
                      eps: float, plan: int, activation: str = "none",
                      residual: torch.Tensor | None = None) -> torch.Tensor:
    """relu(batch_norm(x) [+ residual]) (``activation="relu"``) in training, the running
    statistics (float32, contiguous) updated in place; autograd records it when a gradient
    is wanted. For plain eager tensors with no compiler or dispatch mode watching (the
    ``torch.ops.dnnctl.batch_norm_train`` op is the functional form everything else
    takes)."""
    if _grad_on() and _any_grad(x, weight, bias, residual):
        k = native.key(x, weight, bias, residual, momentum, eps, plan, activation)
        fused = native.fused_bn(k)
        if fused is not None:  # both passes recorded: one C++ call, a C++ autograd node
            y = fused(x, weight, bias, residual, running_mean, running_var)
            if y is not None:
                if y.__class__ is int:
                    raise replay.failed(y, "batch_norm")
                if y.requires_grad and fused.own_backward:  # runs in C++: counted here
                    _BN_PATHS[_BN_OWN] += 1
                _written(running_mean, running_var)
                return y
        y = _bn_train_apply(x, weight, bias, residual, running_mean, running_var,
                            momentum, eps, plan, activation)
        native.learn(k, x, weight, bias, residual, running_mean, running_var, momentum, eps,
                     plan, activation)
        _written(running_mean, running_var)
        return y
    y = K.batch_norm_train_(x, running_mean, running_var, weight, bias, momentum, eps, plan,
                            activation, residual)[0]
    _written(running_mean, running_var)
    return y


def _written(running_mean: torch.Tensor, running_var: torch.Tensor) -> None:
    """Bump the version counters of running statistics a kernel wrote through their
    memory, as torch's own in-place batch_norm does: what keys on a tensor's version (an
    inference fold of this BatchNorm into its convolution, a captured CUDA graph's check)
    then sees the new statistics (a model validated, trained a step, validated again)."""
    _bump(running_mean)
    _bump(running_var)


_bump = torch.autograd.graph.increment_version


_any_grad = torch._C._any_requires_grad
_BN_PATHS, _BN_OWN = gp.BACKWARD_PATHS, ("batch_norm", "backward", "dnnctl")


def _bn_train_applier() -> Callable[..., Any]:
    """``_BatchNormTrainInPlace.apply`` for plain eager tensors (see :func:`_eager_apply`),
    its tensor arguments unwrapped by position: x, weight, bias, residual (or None), the
    running statistics."""
    fn = _BatchNormTrainInPlace
    try:
        capply = super(torch.autograd.Function, fn).apply
        from torch._C._functorch import unwrap_if_dead as uw
    except (AttributeError, ImportError):  # another torch: its own apply
        return fn.apply

    def apply(x: Any, weight: Any, bias: Any, residual: Any, running_mean: Any,
              running_var: Any, momentum: float, eps: float, plan: int,
              activation: str) -> Any:
        return capply(uw(x), None if weight is None else uw(weight),
                      None if bias is None else uw(bias),
                      None if residual is None else uw(residual), uw(running_mean),
                      uw(running_var), momentum, eps, plan, activation)

    return apply


_bn_train_apply = _bn_train_applier()


_INDUCTOR_FALLBACKS: list[bool] = []  # [True] once inductor knows the ops


def inductor_fallbacks() -> None:
    """Tell inductor, once, that every dnnctl op runs as itself (an extern kernel call),
    before it lowers a graph holding one.

    Left to find that out, inductor's "implicit fallback" path formats each op's arguments
    for a log line; torch 2.11 does so eagerly, and an argument's text holds its whole
    producer graph, written out as a tree: a residual network's last op (its ``linear``)
    took minutes, so ``torch.compile`` of a patched ResNet-50 never finished. Registered here
    the same way that path does it (the op's layout-constraint tag), with no text made."""
    if _INDUCTOR_FALLBACKS:
        return
    _INDUCTOR_FALLBACKS.append(True)
    try:
        from torch._inductor import lowering
        from torch._library.utils import get_layout_constraint_tag
    except Exception:  # noqa: BLE001 - no inductor in this torch: nothing to tell it
        return
    for name in SCHEMAS:
        op = getattr(torch.ops.dnnctl, name).default
        if op not in lowering.lowerings:
            tag = get_layout_constraint_tag(op, with_default=True)
            lowering.make_fallback(op, layout_constraint=lowering.tag_to_layout_constraint(tag),
                                   warn=False)


def _traced(fake: Callable[..., Any]) -> Callable[..., Any]:
    """The fake kernel, first making sure inductor will lower the op (fake kernels run only
    while a graph is traced: torch.compile, export, meta tensors)."""
    def run(*args: Any, **kwargs: Any) -> Any:
        inductor_fallbacks()  # returns at once after the first time
        return fake(*args, **kwargs)
    return run


def _register() -> None:
    for name, schema in SCHEMAS.items():
        LIB.define(name + schema)
        LIB.impl(name, KERNELS[name], "CPU")
        LIB.impl(name, KERNELS[name], "CUDA")
        torch.library.register_fake(f"{NS}::{name}", _traced(FAKES[name]), lib=LIB)
        LIB.impl(name, _autograd_kernel(name), "Autograd", with_keyset=True)
    AUTOCAST_DIRECT.update(autocast.register(LIB, DIRECT))


# (device type, op) -> its autocast casts around DIRECT[op], for the ops autocast casts
AUTOCAST_DIRECT: dict[tuple[str, str], Callable[..., Any]] = {}
_register()
OPS = tuple(SCHEMAS)
_OPS = torch.ops.dnnctl


def autocast_active(device_type: str) -> bool:
    """An autocast region is active for the device (its dispatcher kernel casts inputs)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except (TypeError, RuntimeError):  # a device type autocast does not know
        return False


def run_op(name: str, *args: Any) -> Any:
    """torch.ops.dnnctl.<name>(*args), skipping the dispatcher where nothing needs it.

    Plain eager tensors (:func:`plain_eager`) do what the dispatcher would route them to,
    called from here: under an autocast region for their device the op's casts (ops
    autocast casts), with gradients the op's autograd Function, else its eager kernel.
    Anything else (tensor subclasses, fake tensors under torch.compile, dispatch modes,
    torch.jit.trace) takes the dispatcher."""
    x = args[0]
    if not plain_eager(x):
        if _functorch():  # torch.func: gradients through the Function above the dispatcher
            return FUNC[name].apply(*args)
        if _onnx_exporting():
            # an ONNX file holds standard operators only, and no runtime has dnnctl's: the
            # op's meaning in torch's own ops is what gets exported (the model as it was
            # before the patch, numerically)
            with K.torch_forms():
                return KERNELS[name](*args)
        return getattr(_OPS, name)(*args)
    if _grad_on() and x.is_cuda and name in TORCH_TRAINS and _any_grad(*args) \
            and torch_trains(name, args):
        return TORCH_TRAINS[name][1](*args)
    if any_autocast():
        cast = AUTOCAST_DIRECT.get((x.device.type, name))
        if cast is not None and autocast_active(x.device.type):
            return cast(*args)
    if _grad_on() and _any_grad(*args):  # DIRECT[name], less its own call
        return APPLY[name](None, *args)
    return KERNELS[name](*args)


def _torch_rownorm(op: str) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    rms = op == "rms_norm"

    def keys(x: Any, w: Any, *rest: Any) -> Any:
        return og.rownorm_keys(op, x, w is not None, not rms and rest[0] is not None)

    def call_key(x: Any, w: Any, *rest: Any) -> tuple:
        return (x.shape, x.stride(), x.dtype, x.device, w is None,
                rms or rest[0] is None)

    def run(x: Any, w: Any = None, *rest: Any) -> Any:
        if rms:
            eps = rest[0] if rest else 1e-6
            return F.rms_norm(x, (x.shape[-1],), w, eps)  # (torch >= 2.4: the extra's floor)
        b = rest[0] if rest else None
        eps = rest[1] if len(rest) > 1 else 1e-5
        return F.layer_norm(x, (x.shape[-1],), w, b, eps)

    return keys, run, call_key


def _act_call(fn: str) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    setting = fn in ("gelu", "leaky_relu")

    def keys(x: Any, *rest: Any) -> Any:
        return og.activation_keys(x, fn, rest[0] if fn == "gelu" and rest else "none")

    def call_key(x: Any, *rest: Any) -> tuple:
        return (x.shape, x.stride(), x.dtype, x.device, rest[0] if setting and rest else None)

    def run(x: Any, *rest: Any) -> Any:
        if not (setting and rest):
            return ref_activation(fn, x)
        if fn == "gelu":
            return ref_activation(fn, x, approximate=rest[0])
        return ref_activation(fn, x, negative_slope=rest[0])

    return keys, run, call_key


def _softmax_call(log: bool) -> tuple[Callable[..., Any], Callable[..., Any],
                                      Callable[..., Any]]:
    def keys(x: Any, dim: int = -1, *rest: Any) -> Any:
        return og.softmax_keys(x, dim, log)

    def call_key(x: Any, dim: int = -1, *rest: Any) -> tuple:
        return (x.shape, x.stride(), x.dtype, x.device, dim)

    def run(x: Any, dim: int = -1, *rest: Any) -> Any:
        return torch.log_softmax(x, dim) if log else torch.softmax(x, dim)

    return keys, run, call_key


# op -> (its backward keys, torch's own op, the call's key) of (the op's arguments less the
# plan handle): the memory-bound ops whose training call can be torch's own (torch_trains)
TORCH_TRAINS: dict[str, tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]] = {
    "layer_norm": _torch_rownorm("layer_norm"), "rms_norm": _torch_rownorm("rms_norm"),
    "softmax": _softmax_call(False), "log_softmax": _softmax_call(True),
    **{fn: _act_call(fn) for fn in (*ACTIVATIONS, "gelu", "leaky_relu")},
}


def torch_trains(name: str, args: tuple[Any, ...]) -> bool:
    """A training call (under autograd, eager, CUDA) of a memory-bound op whose backward
    would run torch's formula (:func:`dnnctl.torch.grad_plan.decide`: no plan entry for it
    in the default mode, or the "torch" mode): torch's own op then runs both passes, one C++
    autograd node. dnnctl's forward would have torch's backward recompute what torch's
    forward keeps (layer_norm's row statistics: a second pass over x), and its Python
    autograd Function costs host time in both passes (a training step is host-bound).
    Decided once per call key, plan, determinism and registered variants."""
    if K.RECORDERS:  # a recording session wants the problems the op's own path notes
        return False
    keys, _, call_key = TORCH_TRAINS[name]
    body, handle = args[:-1], args[-1]
    if handle.__class__ is not int:
        return False
    x = body[0]
    if gp.decide(name, handle, x, lambda: keys(*body), in_backward=False,
                 call_key=(name, *call_key(*body))):
        return False
    gp.count(name, "backward", "torch")
    return True


def direct_ok(x: torch.Tensor, *tensors: Any) -> bool:
    """A call :func:`run_op` would hand to the op's eager kernel as it is: plain eager x
    (:func:`plain_eager`), no autocast region, no gradient to record, no record() session,
    x's dtype one dnnctl runs (not inside torch_forms()). A patched module may then take
    its call's replay Program directly (:class:`dnnctl.torch.native.Direct`)."""
    return (plain_eager(x) and not any_autocast()
            and not (_grad_on() and _any_grad(x, *tensors)) and not K.RECORDERS
            and x.dtype in K._RUNS)


def plain_eager(x: torch.Tensor) -> bool:
    """x is a plain tensor in eager mode: no torch.compile tracing, no dispatch mode, no
    torch.jit.trace and no torch.func transform (vmap, grad, jacrev: their wrapped tensors
    look plain) watching, so a call may skip the dispatcher. A trace records only what
    reaches the dispatcher (a direct call would be baked in as a constant), and a transform
    runs its batching / gradient rules there."""
    return (type(x) is torch.Tensor and not _compiling() and not _modes()
            and not _tracing() and not _functorch())


_grad_on, _compiling = torch.is_grad_enabled, torch.compiler.is_compiling
_onnx_exporting = getattr(torch.onnx, "is_in_onnx_export", lambda: False)
_modes, _tracing = torch._C._len_torch_dispatch_stack, torch._C._is_tracing
_functorch = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)
# any device's autocast region (one C call; the per-device check needs x.device, ~0.4 us
# more, and runs only when some region is active)
any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (
    lambda: autocast_active("cuda") or autocast_active("cpu"))
