"""Run-time dispatch: array interop, plan lookup, kernel build cache.

A call of ``dnnctl.ops.<op>`` goes: convert the arguments to backend arrays (NumPy, CuPy, or
any DLPack tensor such as a torch CUDA tensor, zero-copy) -> make the problem key -> ask the
active plan (a dict lookup) -> else the op's default heuristic -> fetch the built kernel from
a cache -> launch -> hand the outputs back in the caller's array kind.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from dnnctl.backends.base import Backend, DeviceInfo, get_backend
from dnnctl.errors import ShapeError
from dnnctl.ops import _call_checks as checks
from dnnctl.ops.base import Choice, Kernel, Op, Problem, np_dtype
from dnnctl.ops.registry import get_op, get_variant


class PlanLike(Protocol):
    """What the dispatcher needs of a loaded plan (dnnctl.plan.LoadedPlan implements it)."""

    def lookup(self, problem: Problem, backend: str, device: DeviceInfo) -> Choice | None: ...


_ACTIVE_PLAN: ContextVar[PlanLike | None] = ContextVar("dnnctl_active_plan", default=None)


def active_plan() -> PlanLike | None:
    return _ACTIVE_PLAN.get()


@contextlib.contextmanager
def use_plan(plan: PlanLike | None) -> Iterator[PlanLike | None]:
    """Make ``plan`` the plan of every ``dnnctl.ops`` call inside the block."""
    token = _ACTIVE_PLAN.set(plan)
    try:
        yield plan
    finally:
        _ACTIVE_PLAN.reset(token)


# ----------------------------------------------------------------------------- interop


@dataclass
class Bound:
    """The arguments of one call, converted to one backend's arrays."""

    backend: Backend
    device: DeviceInfo
    arrays: list[Any]
    wrap: Callable[[Any], Any]  # backend array -> the caller's array kind
    foreign: bool = False  # converted from DLPack tensors (wrap hands results back)


def _is_cupy(x: Any) -> bool:
    return type(x).__module__.startswith("cupy")


def bind(*arrays: Any, names: tuple[str, ...] | None = None) -> Bound:
    """Convert call arguments (None allowed) to one backend; all must live on one device.
    ``names`` (optional) names the arguments in errors."""
    kinds = set()
    for i, a in enumerate(arrays):
        if a is None:
            continue
        if isinstance(a, np.ndarray):
            if type(a) is not np.ndarray:
                checks.check_array_kind(a, checks.array_name(names, i))
            if not a.flags.c_contiguous:  # ops may copy it: a copy must fit too
                checks.check_fits(checks.array_name(names, i) + " (a contiguous copy)",
                                  [("x", a.shape, a.dtype)], get_backend("numpy"), None)
            kinds.add("numpy")
        elif _is_cupy(a):
            kinds.add("cupy")
        elif hasattr(a, "__dlpack__"):
            kinds.add("dlpack")
        else:
            raise ShapeError(
                f"{checks.array_name(names, i)}: expected an array (NumPy, CuPy or a DLPack "
                f"tensor), got {type(a).__name__}",
                hint="pass numpy.ndarray, cupy.ndarray or e.g. a torch tensor "
                     "(np.asarray(...) for lists and scalars)")
    if len(kinds) > 1:
        raise ShapeError(f"arguments mix array kinds {sorted(kinds)}",
                         hint="pass all arrays of one call on one device and of one kind")
    kind = kinds.pop() if kinds else "numpy"
    if kind == "numpy":
        backend = get_backend("numpy")
        return Bound(backend, backend.device(0), list(arrays), lambda y: y)
    if kind == "cupy":
        backend = get_backend("cupy")
        dev = _cupy_device_of(arrays)
        return Bound(backend, backend.device(dev), list(arrays), lambda y: y)
    return _bind_dlpack(arrays)


def _cupy_device_of(arrays: tuple[Any, ...]) -> int:
    ids = {a.data.device_id for a in arrays if a is not None}
    if len(ids) > 1:
        raise ShapeError(f"arrays live on different GPUs {sorted(ids)}",
                         hint="move them to one device first")
    dev = ids.pop()
    import cupy

    if cupy.cuda.runtime.getDevice() != dev:
        cupy.cuda.runtime.setDevice(dev)
    return dev


def _bind_dlpack(arrays: tuple[Any, ...]) -> Bound:
    first = next(a for a in arrays if a is not None)
    dev_type, _ = first.__dlpack_device__()
    producer = importlib.import_module(type(first).__module__.split(".")[0])
    back = getattr(producer, "from_dlpack", None)
    if int(dev_type) == 1:  # kDLCPU
        conv = [None if a is None else np.from_dlpack(a) for a in arrays]
        backend = get_backend("numpy")
        return Bound(backend, backend.device(0), conv, back or (lambda y: y), True)
    if int(dev_type) not in (2, 13):  # kDLCUDA, kDLCUDAManaged
        raise ShapeError(f"DLPack device type {dev_type} is not supported",
                         hint="pass a CUDA or CPU tensor")
    import cupy

    conv = [None if a is None else cupy.from_dlpack(a) for a in arrays]
    backend = get_backend("cupy")
    dev = _cupy_device_of(tuple(conv))
    return Bound(backend, backend.device(dev), conv, back or (lambda y: y), True)


# ----------------------------------------------------------------------------- dispatch
#
# A planned call must cost a dict lookup, so everything that depends only on the call's
# key is computed once per distinct key and kept in a _Site: the validated problem (the
# same object every time, so the plan's dict lookup short-circuits on identity), the
# output specs, the default heuristic's choice per device, and the built kernels.

_VALID: dict[Problem, Problem] = {}
_KERNELS: dict[tuple[Problem, str, int, Choice], Kernel] = {}


@dataclass
class _Site:
    """Everything a call with one raw key needs, computed once."""

    op: Op
    problem: Problem
    outputs: tuple[tuple[str, tuple[int, ...], Any], ...]  # (name, shape, numpy dtype)
    defaults: dict[tuple[str, int], Choice]
    kernels: dict[tuple[str, int, Choice], Kernel]


_SITES: dict[tuple[str, tuple[tuple[str, Any], ...]], _Site] = {}


def intern(problem: Problem) -> Problem:
    """The one shared object equal to ``problem`` (plans key their tables with it)."""
    return _VALID.setdefault(problem, problem)


def problem_of(op: Op, key: Mapping[str, Any]) -> Problem:
    """The validated problem for a call's key; validation is memoized per key."""
    raw = Problem(op.name, tuple(sorted(key.items())))
    hit = _VALID.get(raw)
    if hit is None:
        hit = op.problem(key)
        hit = _VALID.setdefault(hit, hit)  # one object per distinct problem
        _VALID[raw] = hit
    return hit


def resolve(op: Op, problem: Problem, backend: Backend, device: DeviceInfo,
            plan: PlanLike | None = None) -> Choice:
    """The choice a call runs: the plan's, else the op's default heuristic."""
    plan = plan if plan is not None else _ACTIVE_PLAN.get()
    if plan is not None:
        choice = plan.lookup(problem, backend.name, device)
        if choice is not None:
            return choice
    return op.default_choice(problem, backend.name, device)


def kernel_for(problem: Problem, backend: Backend, device: DeviceInfo, choice: Choice) -> Kernel:
    """Build (once) and return the kernel of ``choice`` for ``problem``."""
    ck = (problem, backend.name, device.index, choice)
    kern = _KERNELS.get(ck)
    if kern is None:
        variant = get_variant(problem.op, backend.name, choice.variant)
        kern = variant.build(problem, choice.param_dict, device)
        _KERNELS[ck] = kern
    return kern


def _site(op_name: str, key: Mapping[str, Any]) -> _Site:
    op = get_op(op_name)
    problem = problem_of(op, key)
    outs = tuple((name, tuple(spec.shape), np_dtype(spec.dtype))
                 for name, spec in op.output_specs(problem).items())
    return _Site(op, problem, outs, {}, {})


def run(op_name: str, key: Mapping[str, Any], bound: Bound, names: tuple[str, ...],
        attrs: Mapping[str, Any], *, plan: PlanLike | None = None,
        out: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run one op call; ``names`` label ``bound.arrays`` (None entries are skipped)."""
    try:
        raw: Any = (op_name, tuple(key.items()))
        site = _SITES.get(raw)
    except TypeError:  # an unhashable key value (a list): take the slow path
        raw, site = None, None
    if site is None:
        site = _site(op_name, key)
        if raw is not None:
            _SITES[raw] = site
    backend, device = bound.backend, bound.device
    problem = site.problem
    checks.check_plan(plan)
    checks.check_fits(op_name, site.outputs, backend, device)
    active = plan if plan is not None else _ACTIVE_PLAN.get()
    choice = None if active is None else active.lookup(problem, backend.name, device)
    if choice is None:
        dk = (backend.name, device.index)
        choice = site.defaults.get(dk)
        if choice is None:
            choice = site.op.default_choice(problem, backend.name, device)
            site.defaults[dk] = choice
    kk = (backend.name, device.index, choice)
    kern = site.kernels.get(kk)
    if kern is None:
        kern = kernel_for(problem, backend, device, choice)
        site.kernels[kk] = kern
    inputs = {n: a for n, a in zip(names, bound.arrays) if a is not None}
    if out:
        outputs = dict(out)
        for oname, shape, dtype in site.outputs:
            given = outputs.get(oname)
            if given is None:
                outputs[oname] = backend.xp.empty(shape, dtype=dtype)
            elif tuple(given.shape) != shape or given.dtype != dtype:
                raise ShapeError(
                    f"{op_name}: out '{oname}' has shape {tuple(given.shape)} {given.dtype}, "
                    f"expected {shape} {dtype}")
    else:
        empty = backend.xp.empty
        outputs = {oname: empty(shape, dtype=dtype) for oname, shape, dtype in site.outputs}
    kern(inputs, outputs, attrs)
    return outputs


# ----------------------------------------------------------------------------- fast path
#
# The op functions validate a call once per signature: a cheap tuple of the array kinds,
# shapes, strides, dtypes and devices plus the scalar arguments (see ``signature``). A
# signature that passed is mapped to a Prepared, so a repeated call skips validation, key
# building and views: a plan lookup, the output allocations and the launch.


def signature(a: Any) -> Any:
    """Hashable description of an array argument: type, shape, strides, dtype (and GPU).

    Raises AttributeError for objects that are not NumPy / CuPy arrays (callers then take
    the validating path). Two arrays with one signature pass the same checks.
    """
    if a is None:
        return None
    t = type(a)
    if t is np.ndarray:
        return (t, a.shape, a.strides, a.dtype)
    return (t, a.shape, a.strides, a.dtype, a.data.device_id)  # CuPy


class SiteCache(dict):  # type: ignore[type-arg]
    """Signature -> Prepared of one op function; bounded (emptied when full)."""

    limit = 4096

    def put(self, sig: Any, prepared: Prepared) -> None:
        if len(self) >= self.limit:
            self.clear()
        self[sig] = prepared


class _Respec:
    """Hands a kernel its arrays in the op's spec shapes (the call site passes others)."""

    __slots__ = ("kern", "ins", "outs")

    def __init__(self, kern: Kernel, ins: dict[str, tuple[int, ...]],
                 outs: dict[str, tuple[int, ...]]) -> None:
        self.kern, self.ins, self.outs = kern, ins, outs

    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> None:
        ins, outs = self.ins, self.outs
        self.kern({k: v if k not in ins else v.reshape(ins[k]) for k, v in inputs.items()},
                  {k: v if k not in outs else v.reshape(outs[k]) for k, v in outputs.items()},
                  attrs)


class Prepared:
    """One validated call signature of an op on one device: everything but the arrays.

    ``shapes`` gives the shapes the call site passes / wants back when they differ from the
    op's specs (e.g. softmax of a (B, T, C) tensor is the (B*T, C) problem): kernels whose
    class sets ``flat_io = True`` (they read only data pointers) take such arrays as they
    are, others get reshaped views. ``given`` names outputs the caller passes in.
    """

    __slots__ = ("op", "problem", "backend", "device", "bname", "dev", "attrs", "outs",
                 "respec", "default", "last", "kernels", "empty", "getdev", "setdev")

    def __init__(self, op_name: str, key: Mapping[str, Any], bound: Bound,
                 attrs: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]] | None = None,
                 given: tuple[str, ...] = ()) -> None:
        self.op = get_op(op_name)
        self.problem = problem_of(self.op, key)
        self.backend, self.device = bound.backend, bound.device
        self.bname = bound.backend.name
        self.attrs = dict(attrs)
        shapes = dict(shapes or {})
        specs = {**self.op.input_specs(self.problem), **self.op.output_specs(self.problem)}
        out_specs = self.op.output_specs(self.problem)
        self.outs = tuple((name, shapes.get(name, tuple(spec.shape)), np_dtype(spec.dtype))
                          for name, spec in out_specs.items() if name not in given)
        ins = {n: tuple(specs[n].shape) for n, s in shapes.items()
               if n in specs and n not in out_specs and tuple(s) != tuple(specs[n].shape)}
        outs = {n: tuple(specs[n].shape) for n, s in shapes.items()
                if n in out_specs and tuple(s) != tuple(specs[n].shape)}
        self.respec = (ins, outs) if ins or outs else None
        checks.check_fits(op_name, self.outs, bound.backend, bound.device)
        self.default: Kernel | None = None
        self.last: tuple[Any, Kernel | None] = (None, None)
        self.kernels: dict[Choice, Kernel] = {}
        xp = bound.backend.xp
        self.empty = xp.empty
        self.dev, self.getdev, self.setdev = -1, None, None
        if xp is not np:  # CuPy: a call runs on its arrays' GPU
            import cupy

            self.dev = bound.device.index
            self.getdev, self.setdev = cupy.cuda.runtime.getDevice, cupy.cuda.runtime.setDevice

    def _adapt(self, kern: Kernel) -> Kernel:
        if self.respec is None or getattr(kern, "flat_io", False):
            return kern
        return _Respec(kern, *self.respec)

    def kernel(self, plan: PlanLike | None = None) -> Kernel:
        """The kernel this call runs: the plan's choice (counted by the plan), else the
        op's default heuristic."""
        active = plan if plan is not None else _ACTIVE_PLAN.get()
        if active is not None:
            try:
                choice = active.lookup(self.problem, self.bname, self.device)
            except AttributeError:
                checks.check_plan(active)  # names a wrong plan= argument
                raise
            if choice is not None:
                last = self.last
                if last[0] is choice:
                    return last[1]  # type: ignore[return-value]
                kern = self.kernels.get(choice)
                if kern is None:
                    kern = self._adapt(kernel_for(self.problem, self.backend, self.device,
                                                  choice))
                    self.kernels[choice] = kern
                self.last = (choice, kern)
                return kern
        kern = self.default
        if kern is None:
            choice = self.op.default_choice(self.problem, self.bname, self.device)
            kern = self.default = self._adapt(kernel_for(self.problem, self.backend,
                                                         self.device, choice))
        return kern

    def run(self, inputs: dict[str, Any], plan: PlanLike | None = None,
            given: dict[str, Any] | None = None) -> dict[str, Any]:
        """Launch on ``inputs`` (None entries left out); the outputs by name."""
        if self.dev >= 0 and self.getdev() != self.dev:  # type: ignore[misc]
            self.setdev(self.dev)  # type: ignore[misc]
        kern = self.kernel(plan)
        empty = self.empty
        outputs = {name: empty(shape, dtype=dtype) for name, shape, dtype in self.outs}
        if given:
            outputs.update(given)
        kern(inputs, outputs, self.attrs)
        return outputs
