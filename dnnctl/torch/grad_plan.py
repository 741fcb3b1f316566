"""Which backward computations of the ``torch.ops.dnnctl`` ops run on dnnctl's own kernels.

Every op's backward names its problems (the forward key with ``pass`` set: ``dgrad`` /
``wgrad`` for conv2d, ``backward`` for the memory-bound ops; the two transposed products for
linear / matmul). The op's ``plan`` handle carries a backward mode:

* ``"plan"`` (default): a problem runs on dnnctl when the op's plan (or the active plan)
  has an exact entry for it whose choice is one of dnnctl's own variants; else torch's
  formula runs (no plan, no entry, a vendor variant chosen).
* ``"dnnctl"``: every problem dnnctl takes runs on dnnctl's own kernel the plan's entry or,
  without one, the default heuristic picks. Where that pick is a vendor library torch's own
  formula calls (cuDNN's conv gradients, cuBLAS's products), torch's formula runs: the same
  library call without dnnctl's dispatch and wrapper (as the forward's
  :func:`dnnctl.torch.kernels.torch_runs`). Through dnnctl, the 53 conv gradients of a
  patched ResNet-50 training step took 19 ms of host time a step under cProfile (H100).
* ``"torch"``: torch's formulas only.
* a mapping ``{"op" | "op/pass" | "*": mode}`` (e.g. ``{"*": "dnnctl", "conv2d/wgrad":
  "torch"}``): per problem, the most specific selector's mode (``"plan"`` if none).

A problem dnnctl refuses (dtype, shape) falls back to torch in every mode.
:data:`BACKWARD_PATHS` counts, per ``(op, pass)``, the calls each path ran.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from dnnctl.errors import DnnctlError
from dnnctl.ops.dispatch import active_plan, problem_of
from dnnctl.ops.registry import deterministic_only, generation, get_op, get_variant
from dnnctl.torch import kernels as K
from dnnctl.torch._tensors import DNN_DTYPES
from dnnctl.torch.keys import hashable

# (op, pass) -> calls, per path ("dnnctl" / "torch")
BACKWARD_PATHS: Counter[tuple[str, str, str]] = Counter()

Keys = dict[str, tuple[str, dict[str, Any]]]  # pass label -> (dnnctl op, key)

_DECIDED: weakref.WeakKeyDictionary[Any, dict[tuple, bool]] = weakref.WeakKeyDictionary()


def mode_of(handle: int, op: str = "", label: str = "") -> str:
    """The backward mode the ``plan`` handle carries for ``op`` / ``label``."""
    mode = K.BACKWARD_MODES.get(handle, "plan")
    if isinstance(mode, str):
        return mode
    return mode.get(f"{op}/{label}", mode.get(op, mode.get("*", "plan")))


def _own_entry(plan: Any, op: str, key: dict[str, Any], t: torch.Tensor) -> bool:
    """The plan has an exact entry for (op, key) choosing one of dnnctl's own variants."""
    try:
        problem = problem_of(get_op(op), key)
    except DnnctlError:
        return False
    bound_backend, device = K.device_of(t)
    backend = bound_backend.name
    ck = (problem, backend, device.index)
    try:
        memo = _DECIDED.setdefault(plan, {})
    except TypeError:  # a plan object that cannot be weakly referenced: no memo
        memo = {}
    found = memo.get(ck)
    if found is not None:
        return found
    if hasattr(plan, "select"):  # a LoadedPlan: exact entries only, no nearest-key guess
        hit = plan.select(backend, device).exact.get(problem)
        choice = None if hit is None else hit.choice
    else:
        choice = plan.lookup(problem, backend, device)
    own = False
    if choice is not None:
        try:
            own = not get_variant(op, backend, choice.variant).vendor
        except DnnctlError:
            own = False
    memo[ck] = own
    return own


# (problem, backend, device, plan id, deterministic) -> (plan seen, vendor picked)
_VENDOR: dict[tuple, tuple[Any, bool]] = {}


def _vendor_pick(plan: Any, op: str, key: dict[str, Any], t: torch.Tensor) -> bool:
    """The choice dnnctl would run for (op, key) (the plan's entry, else the default
    heuristic) is a vendor variant; False for a problem dnnctl refuses (its own path says
    so and falls back)."""
    try:
        the_op = get_op(op)
        problem = problem_of(the_op, key)
        backend, device = K.device_of(t)
        ck = (problem, backend.name, device.index, id(plan), deterministic_only())
        hit = _VENDOR.get(ck)
        if hit is not None and hit[0] is plan:
            return hit[1]
        vendor = K.vendor_picked(the_op, problem, t, plan)
        if len(_VENDOR) > 4096:
            _VENDOR.clear()
        _VENDOR[ck] = (plan, vendor)
        return vendor
    except DnnctlError:
        return False


_NONE: frozenset[str] = frozenset()
# (op, handle, call key, plan id, determinism, registry generation) -> (plan seen, labels)
_DECISIONS: dict[tuple, tuple[Any, frozenset[str]]] = {}


def decide(op: str, handle: int, x: torch.Tensor, make_keys: Callable[[], Keys],
           in_backward: bool = True, call_key: tuple | None = None) -> frozenset[str]:
    """The pass labels of ``make_keys()`` to run on dnnctl for this backward call; records
    every backward problem for active :func:`dnnctl.torch.record` sessions.

    ``in_backward``: asked from inside the backward. Grad mode is on there only when the
    gradient must itself be differentiable (``create_graph=True``: a gradient penalty,
    Hessian-vector products, MAML); dnnctl's backward kernels are not, so torch's formulas
    run (else the second-order terms through them would be silently missing).

    Under tracing (:func:`_traced`: torch.compile's backward graph, export) torch's
    formulas run.

    ``call_key``: everything ``make_keys()`` is made of (x's shape, strides, dtype and
    device, the op's flags): the answer is then kept per call key, plan, determinism and
    registered variants, and a later call with the same key builds no keys (a training
    step's backward asks once per layer and step)."""
    mode = K.BACKWARD_MODES.get(handle, "plan")
    keys: Keys | None = None
    if K.RECORDERS:
        keys = _safe_keys(make_keys)
        for kop, key in keys.values():
            K.note_problem(kop, dict(key))
    if (mode == "torch" or x.dtype not in DNN_DTYPES
            or (in_backward and _grad_enabled()) or _traced(x)):
        return _NONE
    plan = K.plan_of(handle)
    if plan is None:
        plan = active_plan()
    if mode == "plan" and plan is None:
        return _NONE
    ck = None
    if call_key is not None:
        ck = (op, handle, call_key, id(plan), deterministic_only(), generation())
        hit = _DECISIONS.get(ck)
        if hit is not None and hit[0] is plan:
            return hit[1]
    keys = _safe_keys(make_keys) if keys is None else keys
    chosen = []
    for label, (kop, key) in keys.items():
        m = mode if isinstance(mode, str) else mode_of(handle, op, label)
        if ((m == "dnnctl" and not _vendor_pick(plan, kop, key, x))
                or (m == "plan" and plan is not None and _own_entry(plan, kop, key, x))):
            chosen.append(label)
    found = frozenset(chosen)
    if ck is not None:
        if len(_DECISIONS) > 4096:
            _DECISIONS.clear()
        _DECISIONS[ck] = (plan, found)
    return found


_grad_enabled = torch.is_grad_enabled
_modes = torch._C._len_torch_dispatch_stack


def _traced(x: torch.Tensor) -> bool:
    """x stands in for data while a graph is traced (a fake or functional tensor: the
    backward torch.compile's AOT autograd or torch.export traces), or a dispatch mode
    watches: dnnctl's own backward kernels compute on real data outside the dispatcher,
    so torch's formulas, which trace, run there."""
    return type(x) is not torch.Tensor or _modes() > 0


_TRAINS: dict[tuple, tuple[Any, bool]] = {}  # call -> (plan seen, torch trains it)


def low_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a product (conv, linear) of x runs in: the autocast region's for x's
    device when one is active (torch casts every floating input but float64), else x's."""
    if not _any_autocast():  # no region at all: no x.device and per-device query (~0.5 us)
        return x.dtype
    dev = x.device.type
    if (x.dtype is not torch.float64 and x.is_floating_point()
            and torch.is_autocast_enabled(dev)):
        return torch.get_autocast_dtype(dev)
    return x.dtype


# any device's autocast region, one C call (an older torch without it: always ask per device)
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


def torch_trains(op: str, handle: int, x: torch.Tensor, w: torch.Tensor, call_key: tuple,
                 make_key: Callable[..., dict[str, Any]], make_keys: Callable[..., Keys],
                 *key_args: Any) -> bool:
    """Whether a product with nothing fused, under autograd, runs torch's own calls in both
    passes: the forward's pick (plan entry, else default) is the vendor library torch's
    own op calls (see :func:`dnnctl.torch.kernels.torch_runs`) and :func:`decide` would give
    every gradient to torch too. The caller then runs torch's function itself and leaves
    the backward to torch's autograd: the same library calls as through the dnnctl op, less
    its dispatcher, autograd Function and backward Python (~0.1-0.3 ms a layer and step on
    a training step's host). ``make_key`` / ``make_keys`` build the forward key and the
    backward keys from (x, w) as the call will see them (meta tensors in the autocast
    dtype; ``key_args`` follow (xm, wm) in both calls: module-level functions need no
    closure made per call); decided once per call signature, autocast dtype, plan and
    backward mode."""
    if K.RECORDERS:  # a recording session wants the problems noted by the op's own path
        return False
    dt = low_dtype(x)
    if dt not in DNN_DTYPES:
        return False
    plan = K.plan_of(handle)
    if plan is None:
        plan = active_plan()
    ck = (op, call_key, dt, handle, id(plan), id(K.BACKWARD_MODES.get(handle)),
          deterministic_only())
    hit = _TRAINS.get(ck)
    if hit is not None and hit[0] is plan:
        return hit[1]
    xm = torch.empty_strided(x.shape, x.stride(), dtype=dt, device="meta")
    wm = torch.empty_strided(w.shape, w.stride(), dtype=dt, device="meta")
    try:
        the_op = get_op(op)
        trains = (K.vendor_picked(the_op, problem_of(the_op,
                                                     hashable(make_key(xm, wm, *key_args))),
                                  x, plan)
                  and not decide(op, handle, x, lambda: make_keys(xm, wm, *key_args),
                                 in_backward=False))
    except DnnctlError:  # a problem dnnctl refuses: the op's own path says so, falls back
        trains = False
    if len(_TRAINS) > 4096:
        _TRAINS.clear()
    _TRAINS[ck] = (plan, trains)
    return trains


def _safe_keys(make_keys: Callable[[], Keys]) -> Keys:
    """The backward keys, leaving out those dnnctl does not define (e.g. inference BN)."""
    out: Keys = {}
    for label, (op, raw) in make_keys().items():
        key = hashable(raw)
        try:
            problem_of(get_op(op), key)
        except DnnctlError:
            continue
        out[label] = (op, key)
    return out


def count(op: str, label: str, path: str) -> None:
    BACKWARD_PATHS[(op, label, path)] += 1


def paths_summary() -> dict[str, dict[str, int]]:
    """{"op/pass": {"dnnctl": calls, "torch": calls}} of :data:`BACKWARD_PATHS`."""
    out: dict[str, dict[str, int]] = {}
    for (op, label, path), n in sorted(BACKWARD_PATHS.items()):
        out.setdefault(f"{op}/{label}", {"dnnctl": 0, "torch": 0})[path] += n
    return out
