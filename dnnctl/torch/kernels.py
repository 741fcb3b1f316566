"""The eager kernels of the ``torch.ops.dnnctl`` ops: torch tensors -> ``dnnctl.ops`` -> torch.

Every op takes and returns tensors the way ``torch.nn.functional`` does (logical NCHW; a
channels-last input runs dnnctl's NHWC kernels with no copy and gives a channels-last
output). A problem dnnctl does not take (another dtype, a key no kernel supports) runs in
plain torch (:mod:`dnnctl.torch.reference`) and is counted in :data:`FALLBACKS`.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F

import dnnctl.ops as dops
from dnnctl.errors import DnnctlError, ShapeError, UsageError
from dnnctl.ops.batch_norm.function import _BN as _BN_SPEC
from dnnctl.ops.batch_norm.function import batch_norm as _batch_norm_op
from dnnctl.ops.conv2d.function import conv2d as _conv2d_op
from dnnctl.ops.conv2d.function import conv2d_channels_last
from dnnctl.ops.dispatch import active_plan, arrays_key, bind, problem_of, resolve
from dnnctl.ops.group_norm.function import group_norm as _group_norm_op
from dnnctl.ops.matmul.function import matmul as _matmul_op
from dnnctl.ops.registry import get_op, get_variant
from dnnctl.ops.softmax.function import log_softmax as _log_softmax_op
from dnnctl.ops.softmax.function import softmax as _softmax_op
from dnnctl.torch import keys
from dnnctl.torch import reference as ref
from dnnctl.torch._tensors import (
    DNN_DTYPES,
    as_4d,
    call,
    call_spec,
    fp32,
    in_layout,
    ints,
    is_nhwc,
    nchw_of,
    nhwc_view,
    storage_view,
    to_numpy,
)

FALLBACKS: Counter[tuple[str, str]] = Counter()  # (op, reason) -> calls run in torch
# op -> calls whose chosen variant is the vendor library torch itself calls, with nothing
# fused, run as torch's own call (see linear)
VENDOR_VIA_TORCH: Counter[str] = Counter()
PLANS: dict[int, Any] = {}  # plan handle (an int the op schemas carry) -> loaded plan
RECORDERS: list[Callable[[str, dict[str, Any]], None]] = []  # active record() sessions


MODES = ("plan", "dnnctl", "torch")
# handle -> backward mode other than "plan": one mode, or {"op" / "op/pass" / "*": mode}
BACKWARD_MODES: dict[int, Any] = {}
_MODE_HANDLES: dict[tuple[int, Any], int] = {}  # (id(plan) or 0, mode) -> its handle (< 0)


def _check_mode(backward: Any) -> Any:
    """A mode string, or a hashable tuple of (selector, mode) items for a mapping."""
    if isinstance(backward, str):
        modes = [backward]
    elif isinstance(backward, Mapping):
        modes = list(backward.values())
    else:
        modes = [backward]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise UsageError(f"backward={backward!r}: {bad[0]!r} is not a backward mode",
                         hint="use 'plan', 'dnnctl' or 'torch', or a mapping such as "
                              "{'*': 'dnnctl', 'conv2d/wgrad': 'torch'}")
    return backward if isinstance(backward, str) else tuple(sorted(backward.items()))


def plan_handle(plan: Any, backward: str | Mapping[str, str] = "plan") -> int:
    """The int naming ``plan`` in the ops' ``plan`` argument (0: the active plan).

    ``backward`` picks how the ops' gradients run (see :mod:`dnnctl.torch.grad_plan`):
    ``"plan"`` (dnnctl's backward kernel where the plan has an entry for the backward
    problem), ``"dnnctl"`` (always dnnctl where it takes the problem) or ``"torch"``; or a
    mapping from ``"op"``, ``"op/pass"`` (e.g. ``"conv2d/wgrad"``) or ``"*"`` to a mode
    (the most specific wins; unnamed ones use ``"plan"``)."""
    mode = _check_mode(backward)
    if mode != "plan":
        ck = (0 if plan is None else id(plan), mode)
        handle = _MODE_HANDLES.get(ck)
        if handle is None:  # negative: never an id(), so never a plan-only handle
            handle = _MODE_HANDLES[ck] = -1 - len(_MODE_HANDLES)
        PLANS[handle] = plan
        BACKWARD_MODES[handle] = mode if isinstance(mode, str) else dict(mode)
        return handle
    if plan is None:
        return 0
    handle = id(plan)
    PLANS[handle] = plan
    return handle


def plan_of(handle: int) -> Any:
    """The plan a handle names (None: the active plan)."""
    return PLANS.get(handle) if handle else None


_plan = plan_of


def _fallback(op: str, exc: Exception | None = None) -> None:
    reason = "dtype not float32/float16/bfloat16" if exc is None else (
        exc.message if isinstance(exc, DnnctlError) else str(exc))
    FALLBACKS[(op, reason.split("(hint")[0].strip()[:160])] += 1


def _note(op: str, key: dict[str, Any]) -> None:
    for rec in RECORDERS:
        rec(op, key)


def backward_passes(fields: dict[str, Any], passes: list[str]) -> list[str]:
    """The ``pass`` values to record for a backward that computed ``passes`` (dgrad /
    wgrad, or backward): those the op's key offers, else its ``backward``; none for an op
    without a ``pass`` field."""
    field = fields.get("pass")
    if field is None:
        return []
    choices = field.choices or ()
    return [p for p in passes if p in choices] or (["backward"] if "backward" in choices else [])


@contextlib.contextmanager
def recording_paused() -> Iterator[None]:
    """No record() session sees the problems noted in the block (a decision taken ahead of
    the call that will note them itself)."""
    saved = RECORDERS[:]
    RECORDERS.clear()
    try:
        yield
    finally:
        RECORDERS[:] = saved


def note_problem(op: str, key: dict[str, Any]) -> None:
    """Record one problem (a backward key, already with its ``pass``) for active recorders."""
    if RECORDERS:
        _note(op, key)


def note_backward(op: str, key: dict[str, Any], passes: list[str]) -> None:
    """Record the backward problems of a forward ``key`` (see :func:`backward_passes`)."""
    if RECORDERS:
        for p in backward_passes(get_op(op).fields, passes):
            _note(op, {**key, "pass": p})


# the dtypes a call runs on dnnctl: DNN_DTYPES, or none inside torch_forms()
_RUNS: frozenset[torch.dtype] = DNN_DTYPES


@contextlib.contextmanager
def torch_forms() -> Iterator[None]:
    """The ops called in the block compute their meaning in torch's own ops (what a call
    dnnctl refuses runs), uncounted: what ``torch.onnx.export`` records in place of a
    dnnctl op, which no ONNX runtime has. Process-wide while it lasts (an export's trace)."""
    global _RUNS
    saved, _RUNS = _RUNS, frozenset()
    try:
        yield
    finally:
        _RUNS = saved


def _dnn(op: str, x: torch.Tensor, run: Callable[[], Any], key: Callable[[], dict],
         fallback: Callable[[], Any]) -> Any:
    """run() on dnnctl when x's dtype is one of its dtypes, else / on refusal fallback()."""
    if x.dtype in _RUNS:
        try:
            out = run()
        except DnnctlError as exc:
            _fallback(op, exc)
        else:
            if RECORDERS:
                _note(op, key())
            return out
    elif _RUNS:
        _fallback(op)
    return fallback()


# the op functions themselves, not dnnctl.ops' callable modules of the same names (one
# Python call less a call)

# ----------------------------------------------------------------------------- conv / gemm


def conv2d(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
           stride: Any = (1, 1), padding: Any = (0, 0), dilation: Any = (1, 1), groups: int = 1,
           activation: str = "none", residual: torch.Tensor | None = None, plan: int = 0,
           residual_before_act: bool = False) -> torch.Tensor:
    st, dil, pad = ints(stride, 2), ints(dilation, 2), ints(padding, 2)
    nhwc = is_nhwc(x)

    def plain_key() -> dict[str, Any]:
        return keys.conv2d(x, w, bias is not None, st, pad, dil, groups, "none", False, nhwc)

    if (activation == "none" and residual is None and x.is_cuda and x.dtype in DNN_DTYPES
            and x.numel() and w.numel()
            and torch_runs("conv2d", plain_key, x, plan,
                           (tensors_key(x, w, bias), st, pad, dil, groups))):
        # cuDNN chosen for a convolution with nothing fused (a bias is what torch adds too):
        # torch's own call runs it (see torch_runs), with torch's own settings (a float32
        # conv as the unpatched model's: TF32 where torch.backends.cudnn.allow_tf32 says);
        # its backward problems are noted by the op's autograd formula, as every call's
        VENDOR_VIA_TORCH["conv2d"] += 1
        if RECORDERS:
            _note("conv2d", plain_key())
        return F.conv2d(x, w, bias, st, pad, dil, groups)
    act = None if activation == "none" else activation
    before = residual_before_act

    def run() -> torch.Tensor:
        if nhwc:  # the tensors as they are (no per-call views): channels-last memory
            y = call(conv2d_channels_last, (x, w, bias), stride=st, padding=pad,
                     dilation=dil, groups=groups, activation=act, residual=residual,
                     residual_before_act=before, plan=_plan(plan))
            return nchw_of(y)
        res = None if residual is None else residual.contiguous()
        return call(_conv2d_op, (x.contiguous(), w.contiguous(), bias), stride=st,
                    padding=pad, dilation=dil, groups=groups, activation=act, residual=res,
                    layout="NCHW", residual_before_act=before, plan=_plan(plan))

    return _dnn("conv2d", x, run,
                lambda: keys.conv2d(x, w, bias is not None, st, pad, dil, groups, activation,
                                    residual is not None, nhwc, before),
                lambda: ref.conv2d(x, w, bias, st, pad, dil, groups, activation, residual,
                                   before))


def transposed_size(x: torch.Tensor, w: torch.Tensor, stride: tuple[int, ...],
                    padding: tuple[int, ...], output_padding: tuple[int, ...],
                    dilation: tuple[int, ...]) -> tuple[int, int]:
    """(H, W) of conv_transpose2d(x, w): (in - 1) * stride - 2 * pad + dil * (k - 1) + out_pad
    + 1 per axis."""
    return tuple((int(x.shape[2 + i]) - 1) * stride[i] - 2 * padding[i]
                 + dilation[i] * (int(w.shape[2 + i]) - 1) + output_padding[i] + 1
                 for i in range(2))  # type: ignore[return-value]


def conv_transpose2d(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                     stride: Any = (1, 1), padding: Any = (0, 0), output_padding: Any = (0, 0),
                     dilation: Any = (1, 1), groups: int = 1, plan: int = 0) -> torch.Tensor:
    """F.conv_transpose2d as dnnctl's conv2d data gradient: the transposed convolution of x
    is the dgrad of the forward convolution whose output x is (the same weight, stored
    (C_in, C_out / groups, R, S) as that convolution's (K, C / groups, R, S)); the bias is
    added after."""
    st, pad, dil, opad = ints(stride, 2), ints(padding, 2), ints(dilation, 2), \
        ints(output_padding, 2)
    nhwc = is_nhwc(x)
    hw = transposed_size(x, w, st, pad, opad, dil)

    def run() -> torch.Tensor:
        if x.dim() != 4:
            raise ShapeError("conv_transpose2d: x must be 4-D (N, C, H, W)")
        cout = int(w.shape[1]) * groups
        if nhwc:
            y = nchw_of(call(dops.conv2d_backward_data, (nhwc_view(x), nhwc_view(w)),
                             x_shape=(x.shape[0], hw[0], hw[1], cout), stride=st, padding=pad,
                             dilation=dil, groups=groups, layout="NHWC", plan=_plan(plan)))
        else:
            y = call(dops.conv2d_backward_data, (x.contiguous(), w.contiguous()),
                     x_shape=(x.shape[0], cout, hw[0], hw[1]), stride=st, padding=pad,
                     dilation=dil, groups=groups, layout="NCHW", plan=_plan(plan))
        return y if bias is None else y + bias.view(1, -1, 1, 1).to(y.dtype)

    return _dnn("conv2d", x, run,
                lambda: keys.conv_transpose2d(x, w, hw, st, pad, dil, groups, nhwc),
                lambda: ref.conv_transpose2d(x, w, bias, st, pad, opad, dil, groups))


_DEVICES: dict[Any, tuple[Any, Any]] = {}


def device_of(t: torch.Tensor) -> tuple[Any, Any]:
    """(Backend, DeviceInfo) a tensor's calls run on (cached per torch device)."""
    hit = _DEVICES.get(t.device)
    if hit is None:
        probe = t.detach().reshape(-1)[:1]
        bound = bind(to_numpy(probe) if probe.is_cpu else probe)
        hit = _DEVICES[t.device] = (bound.backend, bound.device)
    return hit


def vendor_picked(op: Any, problem: Any, x: torch.Tensor, plan: Any) -> bool:
    """The choice dnnctl runs for ``problem`` on x's device (``plan``'s entry, else the op's
    default heuristic) is a vendor variant. Raises DnnctlError for a problem dnnctl
    refuses."""
    backend, device = device_of(x)
    choice = resolve(op, problem, backend, device, plan)
    return bool(get_variant(op.name, backend.name, choice.variant).vendor)


_VENDOR_ROUTES: dict[tuple, tuple[Any, bool]] = {}  # call key -> (plan seen, torch runs it)


def tensors_key(*tensors: torch.Tensor | None) -> Any:
    """The tensors' signatures as one hashable value (:func:`dispatch.arrays_key`), also for
    a tensor subclass dispatch does not sign (a quantized weight of another library)."""
    try:
        return arrays_key(tensors)
    except TypeError:
        return tuple(None if t is None else (type(t), t.shape, t.stride(), t.dtype, t.device)
                     for t in tensors)


def torch_runs(op_name: str, make_key: Callable[[], dict[str, Any]], x: torch.Tensor,
               plan: int, call_key: tuple) -> bool:
    """Whether a call with nothing fused runs as torch's own op: its planned or default
    choice is a vendor variant that calls the library torch's own op calls (cuBLAS /
    cuBLASLt for a linear, cuDNN for a convolution), on the same stream, through torch's C++
    path, ~15 us less host time a call than dnnctl's Python pipeline (benchmarks/RESULTS.md)
    for the same GPU time. Decided once per ``call_key`` (the call's shapes and arguments)
    and plan; a plan entry naming one of dnnctl's own kernels runs that kernel."""
    p = _plan(plan) if plan else None
    if p is None:
        p = active_plan()
    key = (op_name, call_key, plan, id(p))
    hit = _VENDOR_ROUTES.get(key)
    if hit is not None and hit[0] is p:
        return hit[1]
    try:
        op = get_op(op_name)
        vendor = vendor_picked(op, problem_of(op, keys.hashable(make_key())), x, p)
    except DnnctlError:  # a problem dnnctl refuses: its own path says so (and falls back)
        vendor = False
    if len(_VENDOR_ROUTES) > 4096:
        _VENDOR_ROUTES.clear()
    _VENDOR_ROUTES[key] = (p, vendor)
    return vendor


def torch_runs_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                      plan: int) -> bool:
    """A CUDA linear with no activation: :func:`torch_runs` (torch's ``F.linear`` calls
    cuBLAS / cuBLASLt, the bias in cuBLASLt's epilogue)."""
    return torch_runs("matmul", lambda: keys.linear(x, w, bias is not None, "none"), x, plan,
                      tensors_key(x, w, bias))


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
           activation: str = "none", plan: int = 0) -> torch.Tensor:
    if (activation == "none" and x.is_cuda and x.dtype in DNN_DTYPES and x.numel()
            and torch_runs_linear(x, w, bias, plan)):
        VENDOR_VIA_TORCH["matmul"] += 1
        if RECORDERS:
            _note("matmul", keys.linear(x, w, bias is not None, activation))
        return F.linear(x, w, bias)
    act = None if activation == "none" else activation

    def run() -> torch.Tensor:
        if x.numel() == 0 or w.numel() == 0:
            raise ShapeError("linear: an empty operand")  # torch's result (bias, or empty)
        # a 2-D x as it is (two reshapes are ~1 us a call, and give views of the result)
        x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        y = call(_matmul_op, (x2.contiguous(), w.t(), bias), activation=act, plan=_plan(plan))
        return y if x2 is x else y.reshape(*x.shape[:-1], w.shape[0])

    return _dnn("matmul", x, run, lambda: keys.linear(x, w, bias is not None, activation),
                lambda: ref.linear(x, w, bias, activation))


def matmul(a: torch.Tensor, b: torch.Tensor, plan: int = 0) -> torch.Tensor:
    a, b = a.contiguous(), b.contiguous()

    def run() -> torch.Tensor:
        if a.dim() not in (2, 3) or b.dim() not in (2, 3):
            raise ShapeError("matmul: operands must be 2-D or 3-D")
        return call(_matmul_op, (a, b), plan=_plan(plan))

    return _dnn("matmul", a, run, lambda: keys.matmul(a, b), lambda: torch.matmul(a, b))


# ----------------------------------------------------------------------------- norms


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5, plan: int = 0) -> torch.Tensor:
    cols = x.shape[-1]

    def run() -> torch.Tensor:
        rows = x if x.dim() == 2 else x.reshape(-1, cols)
        y = call(dops.layer_norm, (rows.contiguous(), weight, bias), eps=eps, plan=_plan(plan))
        return y if rows is x else y.reshape(x.shape)

    return _dnn("layer_norm", x, run,
                lambda: keys.rownorm("layer_norm", x, weight is not None, bias is not None),
                lambda: F.layer_norm(x, (cols,), weight, bias, eps))


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6,
             plan: int = 0) -> torch.Tensor:
    cols = x.shape[-1]

    def run() -> torch.Tensor:
        rows = x if x.dim() == 2 else x.reshape(-1, cols)
        y = call(dops.rms_norm, (rows.contiguous(), weight), eps=eps, plan=_plan(plan))
        return y if rows is x else y.reshape(x.shape)

    return _dnn("rms_norm", x, run,
                lambda: keys.rownorm("rms_norm", x, weight is not None, False),
                lambda: ref.rms_norm(x, weight, eps))


def _spatial(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(the tensor the NCHW / NHWC kernels read, is NHWC) of a 4-D input."""
    nhwc = is_nhwc(x)
    return in_layout(x, nhwc), nhwc


def batch_norm(x: torch.Tensor, running_mean: torch.Tensor, running_var: torch.Tensor,
               weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               eps: float = 1e-5, plan: int = 0, activation: str = "none",
               residual: torch.Tensor | None = None) -> torch.Tensor:
    """Inference: normalize with the running statistics (+ ``residual``, then the fused ReLU
    of ``activation="relu"``)."""
    xs, nhwc = _spatial(x)

    def run() -> torch.Tensor:
        y = call(_batch_norm_op, (xs, fp32(running_mean), fp32(running_var), fp32(weight),
                                   fp32(bias)), training=False, eps=eps,
                 layout="NHWC" if nhwc else "NCHW", plan=_plan(plan), activation=activation,
                 residual=None if residual is None else in_layout(residual, nhwc))
        return nchw_of(y) if nhwc else y

    def reference() -> torch.Tensor:
        y = F.batch_norm(x, running_mean, running_var, weight, bias, False, 0.0, eps)
        return _finish_bn(y, activation, residual)

    return _dnn("batch_norm", x, run,
                lambda: keys.batch_norm(x, nhwc, False, weight is not None, activation,
                                        residual is not None),
                reference)


def _finish_bn(y: torch.Tensor, activation: str, residual: torch.Tensor | None) -> torch.Tensor:
    """torch's batch_norm output with the fused op's residual and ReLU (the fallback)."""
    if residual is not None:
        y = y + residual
    return torch.relu(y) if activation == "relu" else y


def batch_norm_train(x: torch.Tensor, running_mean: torch.Tensor, running_var: torch.Tensor,
                     weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                     momentum: float = 0.1, eps: float = 1e-5, plan: int = 0,
                     activation: str = "none",
                     residual: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Training: (y, new_running_mean, new_running_var, save_mean, save_invstd); y is
    relu(batch_norm(x) [+ residual]) with ``activation="relu"``. The running statistics
    stay as they were (a functional op: :func:`batch_norm_train_` updates them in place)."""
    return _bn_train(x, running_mean, running_var, weight, bias, momentum, eps, plan,
                     activation, residual)


def batch_norm_train_(x: torch.Tensor, running_mean: torch.Tensor, running_var: torch.Tensor,
                      weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                      momentum: float = 0.1, eps: float = 1e-5, plan: int = 0,
                      activation: str = "none", residual: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`batch_norm_train` updating ``running_mean`` / ``running_var`` (float32,
    contiguous) in place, as torch's own batch_norm does, from the same pass: (y, save_mean,
    save_invstd), with no new statistics to allocate and copy back. y is a tensor of its
    own in x's memory format (the kernel writes it through its NHWC view), not a view: an
    autograd Function may return it as it is."""
    if x.dtype in _RUNS:
        try:
            nhwc = is_nhwc(x)
            if nhwc:
                y = torch.empty_like(x, memory_format=_CL)
                xs, out = nhwc_view(x), y.permute(0, 2, 3, 1)
                z = None if residual is None else nhwc_view(residual)
            else:
                y = out = torch.empty_like(x, memory_format=_NCHW)
                xs, z = x.contiguous(), None if residual is None else residual.contiguous()
            # the kernels read each channel's old statistics, then write the new; the
            # op's call pipeline entered as dnnctl.ops.batch_norm(xs, running_mean,
            # running_var, weight, bias, training=True, momentum, eps, layout, plan,
            # out=out, return_stats=True, activation, residual=z) enters it
            _, mean, invstd = call_spec(
                _BN_SPEC, (xs, running_mean, running_var, fp32(weight), fp32(bias), out, z,
                           None, None),
                (True, momentum, eps, "NHWC" if nhwc else "NCHW", True, activation),
                _plan(plan))
        except DnnctlError as exc:
            _fallback("batch_norm", exc)
        else:
            if RECORDERS:
                _note("batch_norm", keys.batch_norm(x, nhwc, True, weight is not None,
                                                    activation, residual is not None))
            return y, mean, invstd
    elif _RUNS:
        _fallback("batch_norm")
    y, nm, nv, mean, invstd = ref.batch_norm_train(x, running_mean, running_var, weight, bias,
                                                   momentum, eps)
    with torch.no_grad():
        torch._foreach_copy_([running_mean, running_var], [nm, nv])
    return _finish_bn(y, activation, residual), mean, invstd


_CL, _NCHW = torch.channels_last, torch.contiguous_format


def _bn_train(x: torch.Tensor, running_mean: torch.Tensor, running_var: torch.Tensor,
              weight: torch.Tensor | None, bias: torch.Tensor | None, momentum: float,
              eps: float, plan: int, activation: str, residual: torch.Tensor | None
              ) -> tuple[torch.Tensor, ...]:
    xs, nhwc = _spatial(x)

    def run() -> tuple[torch.Tensor, ...]:
        z = None if residual is None else in_layout(residual, nhwc)
        layout = "NHWC" if nhwc else "NCHW"
        # the updated running statistics into fresh arrays: the inputs stay as they were
        # (a functional op), with no copy of them first
        rm, rv = fp32(running_mean).contiguous(), fp32(running_var).contiguous()
        nm, nv = torch.empty_like(rm), torch.empty_like(rv)
        y, mean, invstd = call(_batch_norm_op, (xs, rm, rv, fp32(weight), fp32(bias)),
                               training=True, momentum=momentum, eps=eps, layout=layout,
                               return_stats=True, plan=_plan(plan), activation=activation,
                               residual=z, new_running=(nm, nv))
        if running_mean.dtype is not torch.float32:  # a no-op .to is a C call too
            nm, nv = nm.to(running_mean.dtype), nv.to(running_var.dtype)
        return nchw_of(y) if nhwc else y, nm, nv, mean, invstd

    def reference() -> tuple[torch.Tensor, ...]:
        y, nm, nv, mean, invstd = ref.batch_norm_train(x, running_mean, running_var, weight,
                                                       bias, momentum, eps)
        return _finish_bn(y, activation, residual), nm, nv, mean, invstd

    return _dnn("batch_norm", x, run,
                lambda: keys.batch_norm(x, nhwc, True, weight is not None, activation,
                                        residual is not None),
                reference)


def group_norm(x: torch.Tensor, groups: int, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5, plan: int = 0) -> torch.Tensor:
    if groups <= 0 or x.dim() < 2 or x.shape[1] % groups:
        raise RuntimeError("group_norm: expected the input's channels to be divisible by "
                           f"num_groups, got input of shape {tuple(x.shape)} and num_groups="
                           f"{groups}")
    x4 = as_4d(x)
    xs, nhwc = _spatial(x4)

    def run() -> torch.Tensor:
        y = call(_group_norm_op, (xs,), groups=groups, weight=fp32(weight), bias=fp32(bias),
                 eps=eps, layout="NHWC" if nhwc else "NCHW", plan=_plan(plan))
        return (nchw_of(y) if nhwc else y).reshape(x.shape)

    return _dnn("group_norm", x, run,
                lambda: keys.group_norm(x4, nhwc, groups, weight is not None),
                lambda: F.group_norm(x, groups, weight, bias, eps))


# ----------------------------------------------------------------------------- softmax / pools


def softmax(x: torch.Tensor, dim: int, log: bool = False, plan: int = 0) -> torch.Tensor:
    fn = _log_softmax_op if log else _softmax_op

    def run() -> torch.Tensor:
        return call(fn, (x.contiguous(),), axis=dim, plan=_plan(plan))

    return _dnn("softmax", x, run, lambda: keys.softmax(x, dim, log),
                lambda: (F.log_softmax if log else F.softmax)(x, dim))


def max_pool2d(x: torch.Tensor, kernel: Any, stride: Any = (), padding: Any = (0, 0),
               dilation: Any = (1, 1), ceil_mode: bool = False, plan: int = 0) -> torch.Tensor:
    k = ints(kernel, 2)
    st, pad, dil = ints(stride, 2) if len(stride) else k, ints(padding, 2), ints(dilation, 2)
    xs, nhwc = _spatial(x)

    def run() -> torch.Tensor:
        y = call(dops.max_pool2d, (xs,), kernel=k, stride=st, padding=pad, dilation=dil,
                 ceil_mode=ceil_mode, layout="NHWC" if nhwc else "NCHW", plan=_plan(plan))
        return nchw_of(y) if nhwc else y

    return _dnn("pool2d", x, run,
                lambda: keys.pool2d(x, nhwc, "max", k, st, pad, dil, ceil_mode, True),
                lambda: F.max_pool2d(x, k, st, pad, dil, ceil_mode))


def avg_pool2d(x: torch.Tensor, kernel: Any, stride: Any = (), padding: Any = (0, 0),
               ceil_mode: bool = False, count_include_pad: bool = True, plan: int = 0) -> torch.Tensor:
    k = ints(kernel, 2)
    st, pad = ints(stride, 2) if len(stride) else k, ints(padding, 2)
    xs, nhwc = _spatial(x)

    def run() -> torch.Tensor:
        y = call(dops.avg_pool2d, (xs,), kernel=k, stride=st, padding=pad, ceil_mode=ceil_mode,
                 count_include_pad=count_include_pad, layout="NHWC" if nhwc else "NCHW",
                 plan=_plan(plan))
        return nchw_of(y) if nhwc else y

    return _dnn("pool2d", x, run,
                lambda: keys.pool2d(x, nhwc, "avg", k, st, pad, (1, 1), ceil_mode,
                                    count_include_pad),
                lambda: F.avg_pool2d(x, k, st, pad, ceil_mode, count_include_pad))


def global_avg_pool2d(x: torch.Tensor, plan: int = 0) -> torch.Tensor:
    if x.dim() != 4:
        raise RuntimeError(f"global_avg_pool2d: expected a 4-D (N, C, H, W) input, got shape "
                           f"{tuple(x.shape)}")
    xs, nhwc = _spatial(x)

    def run() -> torch.Tensor:
        y = call(dops.global_avg_pool2d, (xs,), layout="NHWC" if nhwc else "NCHW",
                 plan=_plan(plan))
        return nchw_of(y) if nhwc else y

    return _dnn("global_avg_pool2d", x, run, lambda: keys.global_avg_pool2d(x, nhwc),
                lambda: x.mean((2, 3), keepdim=True))


# ----------------------------------------------------------------------------- activations


def activation(fn: str, x: torch.Tensor, negative_slope: float = 0.01,
               approximate: str = "none", plan: int = 0) -> torch.Tensor:
    xs, cl = storage_view(x)

    def run() -> torch.Tensor:
        p = _plan(plan)
        if fn == "leaky_relu":
            y = call(dops.leaky_relu, (xs,), negative_slope=negative_slope, plan=p)
        elif fn == "gelu":
            y = call(dops.gelu, (xs,), approximate=approximate, plan=p)
        else:
            y = call(getattr(dops, fn), (xs,), plan=p)
        return nchw_of(y) if cl else y

    name = "gelu_tanh" if fn == "gelu" and approximate == "tanh" else fn
    return _dnn("activation", x, run, lambda: keys.activation(name, xs),
                lambda: ref.activation(fn, x, negative_slope, approximate))


# ----------------------------------------------------------------------------- attention


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
              scale: float | None = None, enable_gqa: bool = False, plan: int = 0
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of F.scaled_dot_product_attention(q, k, v, is_causal=, scale=,
    enable_gqa=) on (B, H, S, D) tensors: dnnctl.ops.attention where it takes the call
    (16-bit, grouped key heads with enable_gqa), torch otherwise."""

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        if q.dim() != 4 or (not enable_gqa and k.shape[1] != q.shape[1]):
            raise ShapeError("attention: (B, H, S, D) tensors with equal heads, or "
                             "enable_gqa=True")
        # as they are: torch's SDPA (a vendor candidate) reads strides, so the views of a
        # packed qkv cost no copy there; dnnctl's kernels get dense copies from the pipeline
        out, lse = call(dops.attention, (q, k, v), causal=bool(is_causal), scale=scale,
                        return_lse=True, plan=_plan(plan))
        return out, lse

    out, lse = _dnn("attention", q, run, lambda: keys.attention(q, k, v, is_causal, scale),
                    lambda: ref.attention(q, k, v, is_causal, scale, enable_gqa))
    return sdpa_layout(out), lse


def sdpa_layout(out: torch.Tensor) -> torch.Tensor:
    """out (B, H, S, D) in (B, S, H, D) memory: the layout torch's fused SDPA kernels give,
    and the one the op's fake kernel declares, whichever kernel ran (torch.compile's code
    checks the strides it was promised). A result in another layout (dnnctl's own kernels
    write (B, H, S, D) memory) is copied into it."""
    b, h, s, d = out.shape
    want = (s * h * d, d, h * d, 1)
    if out.stride() == want:
        return out
    fixed = out.new_empty((b, s, h, d)).transpose(1, 2)
    fixed.copy_(out)
    return fixed
