"""C++ paths of patched modules: an inference call (a fused convolution, a LayerNorm or
RMSNorm, a linear, a routed SDPA) replayed with no dispatch in between (:class:`Direct`),
and C++ autograd for the fused training batch_norm: eager training with no Python per
layer.

A patched BatchNorm in training runs relu(batch_norm(x) [+ residual]) as a Python autograd
Function whose forward and backward each enter dnnctl's dispatch (measured on a CPU box
with stubbed launches: ~45 us of host time a pass against ~25 for torch's own BatchNorm and
ReLU). Once both passes' dispatch sites have recorded a replay Program
(:mod:`dnnctl.backends.replay`) for a call key, :func:`fused_bn` is a C++ ``BnTrain`` of
the two: its forward runs one Program and records a C++ autograd node whose backward runs
the other, the ReLU's mask recomputed from x as dnnctl's backward kernel does.

The key holds what the recorded calls depend on: x's shape, strides, dtype and device, the
residual's strides, which parameters there are, momentum, eps, the plan (a handle, else the
plan active at the time) and torch's determinism flag. Only float32 parameters and running
statistics take this path (dnnctl's kernels read them as they are; others are converted by
the Python path), and only where both passes ran on dnnctl's own replayable kernels.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from dnnctl.backends import replay
from dnnctl.ops import dispatch
from dnnctl.ops.batch_norm.backward_function import _BACKWARD as _BN_BACKWARD
from dnnctl.ops.batch_norm.backward_function import CALL_ARRAYS as _BWD_ARRAYS
from dnnctl.ops.batch_norm.function import _BN as _BN_SPEC
from dnnctl.ops.batch_norm.function import CALL_ARRAYS as _BN_ARRAYS
from dnnctl.torch._tensors import in_layout, is_nhwc
from dnnctl.torch.kernels import plan_of


class Direct:
    """A patched module's own shortcut to the replay Programs of its calls: per call key
    (what the module's Python path derives the op call from: shapes, strides, dtypes,
    devices), the dispatch site that path called, found after the call
    (:meth:`learn`); later calls of the key go straight to that site's Program
    (:func:`dispatch.replayed`: the kernel the plan, the active plan or the default would
    take now, so a plan switched since is honoured), skipping the Python between the module
    and the site. A key whose site has no Program yet looks again on later calls, up to
    :data:`TRIES` times once the replay extension is loaded (it loads in the background:
    the calls before it spend no look)."""

    __slots__ = ("sites",)

    def __init__(self) -> None:
        self.sites: dict[Any, Any] = {}  # key -> Site, or the number of looks so far

    # a copied or pickled module starts with none (a site is this process's, not data)
    def __deepcopy__(self, memo: dict) -> Direct:
        return Direct()

    def __copy__(self) -> Direct:
        return Direct()

    def __reduce__(self) -> tuple:
        return (Direct, ())

    def run(self, k: Any, arrays: tuple[Any, ...], plan: Any) -> Any:
        """The call's result from the key's Program, or None (no site, no Program, the
        recording does not fit, suspended): the module runs its Python path."""
        site = self.sites.get(k)
        if site is None or site.__class__ is int or _OFF:
            return None
        return dispatch.replayed(site, arrays, plan)

    def learn(self, k: Any, spec: Any, arrays: tuple[Any, ...], scalars: tuple[Any, ...]
              ) -> None:
        """After a Python-path call of ``k``: keep the site ``spec``'s call with these
        arrays and scalars went to, once it has a Program."""
        sites = self.sites
        looks = sites.get(k, 0)
        if looks.__class__ is not int or looks >= TRIES or _OFF:
            return
        if replay.module() is None:  # (not loaded yet: no Program to find, no look spent)
            return
        if len(sites) >= _LIMIT:
            sites.clear()
        site = dispatch.site_for(spec, arrays, scalars)
        if site is not None and site.programs and any(site.programs.values()):
            sites[k] = site
        else:
            sites[k] = looks + 1


TRIES = 8  # Python calls of a key that look for both Programs before giving up
_TABLE: dict[Any, Any] = {}  # key -> BnTrain, or the number of looks so far
_LIMIT = 4096
_F32 = torch.float32
_deterministic = torch.are_deterministic_algorithms_enabled


def key(x: torch.Tensor, weight: Any, bias: Any, residual: Any, momentum: float, eps: float,
        plan: int, activation: str) -> tuple:
    return (x.shape, x.stride(), x.dtype, x.device,
            None if residual is None else residual.stride(), weight is None, bias is None,
            momentum, eps, plan, dispatch.active_plan() if not plan else None, activation,
            _deterministic())


_OFF: list[bool] = []  # non-empty inside suspended()


def fused_bn(k: tuple) -> Any:
    """The C++ BnTrain of a key, or None (not there yet, never, or suspended)."""
    got = _TABLE.get(k)
    return None if got is None or got.__class__ is int or _OFF else got


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """The Python path for every call inside (nothing learnt either): for comparisons."""
    _OFF.append(True)
    try:
        yield
    finally:
        _OFF.pop()


def learn(k: tuple, x: torch.Tensor, weight: Any, bias: Any, residual: Any,
          running_mean: torch.Tensor, running_var: torch.Tensor, momentum: float, eps: float,
          handle: int, activation: str) -> None:
    """After a Python-path call of ``k``: make its BnTrain where both passes' Programs are
    recorded (``handle``: the patch's plan handle the calls used, 0: the active plan)."""
    looks = _TABLE.get(k, 0)
    if looks.__class__ is not int or looks >= TRIES or _OFF:
        return
    if replay.module() is None:  # (not loaded yet: no look spent)
        return
    if len(_TABLE) >= _LIMIT:
        _TABLE.clear()
    _TABLE[k] = looks + 1
    made = _make(x, weight, bias, residual, running_mean, running_var, momentum, eps,
                 plan_of(handle), handle, activation, looks + 1 >= TRIES)
    if made is not None:
        _TABLE[k] = made


def _make(x: torch.Tensor, weight: Any, bias: Any, residual: Any,
          running_mean: torch.Tensor, running_var: torch.Tensor, momentum: float, eps: float,
          plan: Any, handle: int, activation: str, last: bool = False) -> Any:
    mod = replay.module()
    if mod is None or x.dim() != 4:
        return None
    if mod.BN_FORWARD_SLOTS != _BN_ARRAYS or mod.BN_BACKWARD_SLOTS != _BWD_ARRAYS:
        return None  # (an extension of another order: never a node that misreads them)
    if any(t is not None and t.dtype is not _F32 for t in (weight, bias, running_mean,
                                                             running_var)):
        return None
    if not (running_mean.is_contiguous() and running_var.is_contiguous()):
        return None
    nhwc = is_nhwc(x)
    xs = in_layout(x, nhwc)
    if xs.data_ptr() != x.data_ptr():
        return None  # the Python path reads a copy of x: nothing a Program can take
    z = None
    if residual is not None:
        z = in_layout(residual, nhwc)
        if z.data_ptr() != residual.data_ptr():
            return None
    # the arrays the forward's and the backward's op calls were made with (kernels.
    # batch_norm_train_ and own_grads.batch_norm): their signatures name the sites
    out = in_layout(torch.empty_like(x, memory_format=torch.channels_last if nhwc
                                     else torch.contiguous_format), nhwc)
    layout = "NHWC" if nhwc else "NCHW"
    fwd = dispatch.program_for(
        _BN_SPEC, _arrays(_BN_ARRAYS, x=xs, running_mean=running_mean,
                          running_var=running_var, weight=weight, bias=bias, out=out,
                          residual=z),
        (True, momentum, eps, layout, True, activation), plan)
    if fwd is None:
        return None
    stats = torch.empty(x.shape[1], dtype=_F32, device=x.device)
    gs = out  # the gradient as the backward reads it: x's layout
    bias_in = bias if activation == "relu" and weight is not None else None
    bwd = None
    for w, b in ((weight, bias_in), (_plain(weight), _plain(bias_in))):
        # (a saved parameter may come back from autograd as a Parameter or as a tensor)
        bwd = dispatch.program_for(
            _BN_BACKWARD, _arrays(_BWD_ARRAYS, dy=gs, x=xs, weight=w, save_mean=stats,
                                  save_invstd=stats, bias=b, residual=z),
            (layout, activation), plan)
        if bwd is not None:
            break
    if bwd is None and not last:
        return None  # (not recorded yet, perhaps: asked again on a later call)
    # no backward Program by the last look: the plan or the heuristic runs torch's kernels
    # there (a plain BatchNorm's cuDNN backward); the node calls them from Python
    if not _FALLBACK_SET:
        mod.set_bn_fallback(_differentiable_backward)
        _FALLBACK_SET.append(True)
    return mod.BnTrain(fwd, bwd, nhwc, bias_in is not None, float(eps), int(handle),
                       activation)


_FALLBACK_SET: list[bool] = []


def _differentiable_backward(grad: torch.Tensor, x: torch.Tensor, weight: Any, bias: Any,
                             mean: torch.Tensor, invstd: torch.Tensor, residual: Any, y: Any,
                             needs: tuple[bool, ...], eps: float, handle: int,
                             activation: str) -> tuple[Any, ...]:
    """The C++ node's backward where it runs Python: one that must be differentiable
    (``create_graph=True``: torch's formulas), or one with no backward Program (torch's
    kernels, the fused ReLU gated by its saved output ``y``, as the Python path does)."""
    from dnnctl.torch import backward as bw

    return bw.batch_norm(grad, x, weight, bias, mean, invstd, True, needs, handle,
                         activation, residual, y, eps)


def _arrays(names: tuple[str, ...], **given: Any) -> tuple[Any, ...]:
    """An op's call arrays in its order (None for those not given)."""
    return tuple(given.get(n) for n in names)


def _plain(t: Any) -> Any:
    """A plain tensor over a Parameter's data, with its requires_grad (for a signature)."""
    if t is None or type(t) is torch.Tensor:
        return t
    return torch.Tensor._make_subclass(torch.Tensor, t.detach(), t.requires_grad)
