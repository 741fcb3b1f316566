"""Run-time dispatch: one call pipeline for every op.

An op's public function declares a :class:`CallSpec` (its name and a *parse* function that
turns the call's arrays and scalars into a :class:`Parsed`: the problem key, which call
argument feeds which kernel input, the outputs to allocate, attributes, what to return) and
hands its arguments to :func:`call`. The pipeline does the rest for every op:

1. **signature** — a cheap tuple of each array's kind, shape, strides, dtype and device plus
   the scalar arguments. A signature seen before maps to a :class:`Site`; only a new one is
   parsed and validated.
2. **arrays** — an adapter per array kind: NumPy and torch CPU tensors run on the numpy
   backend; CuPy arrays and torch CUDA tensors on the GPU, the latter used by their pointer
   (no DLPack exchange) with outputs from torch's caching allocator and kernels launched on
   ``torch.cuda.current_stream()``; any other DLPack tensor is converted.
3. **plan** — the active plan's choice (a dict lookup, counted by the plan), else the op's
   default heuristic; the built kernel is cached per choice.
4. **launch** — the call's stream and scratch allocator are set in the CUDA seam
   (``backends.cuda.STATE``) for the duration of the kernel.
5. **outputs** — allocated in the caller's kind before the launch, except for a kernel that
   *adopts* them (``kernel.adopts = True``, e.g. a vendor library that allocates its own
   results): it is called without them and returns what it made (:func:`adopting`), so
   its results are not copied into ours.
6. **replay** — for torch CUDA tensors, a site whose kernel only launches kernels and
   calls the library steps a recording holds (``kernel.replayable``: cuDNN's convolution
   through ATen) records its second call per kernel; later calls run the recording from
   C++ (:mod:`dnnctl.backends.replay`): steps 2-5 without Python.

No op has a private fast path. :func:`run` remains for callers that already hold backend
arrays (tests, benchmarks): it validates every call.
"""

from __future__ import annotations

import contextlib
import importlib
import operator
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from dnnctl.backends import cuda, replay
from dnnctl.backends.base import Backend, DeviceInfo
from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops import _call_checks as checks
from dnnctl.ops.adapters import SIGNATURES, Adapter, adapter_for, signature
from dnnctl.ops.base import Choice, Kernel, Op, Problem, np_dtype
from dnnctl.ops.registry import (
    deterministic_only,
    generation,
    get_op,
    get_variant,
    use_deterministic,
)


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


# ----------------------------------------------------------------------------- problems

_VALID: dict[Problem, Problem] = {}
_KERNELS: dict[tuple[Problem, str, int, Choice], Kernel] = {}


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
            plan: PlanLike | None = None, deterministic: bool = False) -> Choice:
    """The choice a call runs: the plan's, else the op's default heuristic. With
    ``deterministic`` (or inside :func:`dnnctl.use_deterministic`) a plan entry naming a
    non-deterministic variant is passed over and the default chooses among deterministic
    variants only."""
    det = deterministic or deterministic_only()
    plan = plan if plan is not None else _ACTIVE_PLAN.get()
    if plan is not None:
        choice = plan.lookup(problem, backend.name, device)
        if choice is not None and (not det or is_deterministic(op.name, backend.name, choice)):
            return choice
    return default_choice(op, problem, backend.name, device, det)


_DEFAULTS: dict[tuple, Choice] = {}


def default_choice(op: Op, problem: Problem, backend: str, device: DeviceInfo,
                   deterministic: bool) -> Choice:
    """The op's default heuristic; among deterministic variants only if asked. Memoized
    per (problem, backend, device, determinism, registered variants): a call on the
    validating path (``run``) asks on every call, and a heuristic may rank dozens of
    candidates."""
    key = (problem, backend, device, deterministic, generation())
    try:
        hit = _DEFAULTS.get(key)
    except TypeError:  # an unhashable device description: no memo
        key, hit = None, None
    if hit is not None:
        return hit
    if not deterministic:
        choice = op.default_choice(problem, backend, device)
    else:
        with use_deterministic(True):
            choice = op.default_choice(problem, backend, device)
    if key is not None:
        _DEFAULTS[key] = choice
    return choice


_SPECS: dict[Problem, Mapping[str, Any]] = {}


def output_specs(op: Op, problem: Problem) -> Mapping[str, Any]:
    """``op.output_specs(problem)``, made once per problem (problems are immutable)."""
    specs = _SPECS.get(problem)
    if specs is None:
        specs = _SPECS[problem] = op.output_specs(problem)
    return specs


def is_deterministic(op: str, backend: str, choice: Choice) -> bool:
    """Whether ``choice``'s variant gives the same result on every run."""
    return get_variant(op, backend, choice.variant).deterministic


def _wants_determinism(adapter: Adapter | None) -> bool:
    """dnnctl.use_deterministic, or the caller's framework asks for it (torch's
    ``use_deterministic_algorithms``)."""
    if deterministic_only():
        return True
    probe = None if adapter is None else adapter.det_probe
    return probe is not None and bool(probe())


def adopting(kern: Kernel) -> bool:
    """Whether ``kern`` adopts outputs: it may be called with an ``outputs`` mapping that
    lacks some of the op's outputs, writes those present as usual and returns a dict of
    the missing ones it made -- C-contiguous, of the output specs' shapes and dtypes, and
    of the kind of the arrays it was given (the caller's with ``flat_io``, else backend
    arrays). A library that allocates its own results then needs no copy into ours.

    A ``strided_io`` kernel (also ``flat_io``) takes the caller's arrays as they are, of
    any strides (a library that reads strides itself: torch's SDPA), where the parse would
    copy them for the others; it may return a torch caller strided outputs (a library's
    own layout, as torch's op returns it), of the specs' shapes and dtypes."""
    return bool(getattr(kern, "adopts", False))


def adoption_error(specs: Mapping[str, Any], made: Any) -> str | None:
    """What is wrong with an adopting kernel's returned outputs against the op's output
    specs (every one, C-contiguous, of the spec's shape and dtype), or None."""
    if not isinstance(made, dict):
        return f"an adopting kernel returned {type(made).__name__}, not a dict of outputs"
    for name, spec in specs.items():
        a = made.get(name)
        if a is None:
            return f"an adopting kernel did not return output '{name}'"
        shape, dtype = tuple(int(d) for d in a.shape), np_dtype(spec.dtype)
        if shape != tuple(spec.shape) or np_dtype(a.dtype) != dtype:
            return (f"adopted output '{name}' is {shape} {a.dtype}, expected "
                    f"{tuple(spec.shape)} {dtype}")
        contiguous = a.is_contiguous() if hasattr(a, "is_contiguous") else a.flags.c_contiguous
        if not contiguous:
            return f"adopted output '{name}' is not C-contiguous"
    return None


def kernel_for(problem: Problem, backend: Backend, device: DeviceInfo, choice: Choice) -> Kernel:
    """Build (once) and return the kernel of ``choice`` for ``problem``."""
    ck = (problem, backend.name, device.index, choice)
    kern = _KERNELS.get(ck)
    if kern is None:
        variant = get_variant(problem.op, backend.name, choice.variant)
        kern = variant.build(problem, choice.param_dict, device)
        _KERNELS[ck] = kern
    return kern


# ----------------------------------------------------------------------------- the pipeline


@dataclass
class Parsed:
    """What an op's parse function makes of one call signature.

    ``inputs``: (kernel input name, index into the call's arrays, view) — ``view`` turns the
    backend array into the shape the kernel's specs name (a view: same data pointer), or
    None. ``consts``: kernel inputs made once per signature (backend arrays). ``outputs``:
    (name, shape, numpy dtype) allocated per call in the caller's kind and shape.
    ``given``: (kernel output name, index into the call's arrays, or the name of a const)
    for outputs the caller passes (``out=``, in-place, running statistics). ``result``: the
    output name returned, a tuple of names (None: a None in the returned tuple, e.g. the
    gradient of an absent weight), or an int (that call argument is returned).

    ``prepare`` (rare: copies or re-layouts a pointer mapping cannot express, statistics an
    op function recomputes) is called with the backend arrays on every call and returns the
    kernel inputs; ``finish`` then turns the kernel outputs into the value returned (backend
    arrays, or a tuple of them and None). Both run on the caller's device, stream and
    allocator (the adapter's ``enter_all``), as the kernel does.
    """

    op: str
    key: Mapping[str, Any]
    inputs: tuple[tuple[str, int, Callable[[Any], Any] | None], ...] = ()
    outputs: tuple[tuple[str, tuple[int, ...], Any], ...] = ()
    given: tuple[tuple[str, int | str], ...] = ()
    attrs: Mapping[str, Any] = field(default_factory=dict)
    consts: Mapping[str, Any] = field(default_factory=dict)
    result: str | tuple[str | None, ...] | int = "y"
    kernel_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    like: Mapping[str, int] = field(default_factory=dict)
    prepare: Callable[[tuple[Any, ...]], dict[str, Any]] | None = None
    finish: Callable[[dict[str, Any], tuple[Any, ...]], Any] | None = None


def spec_outputs(op_name: str, key: Mapping[str, Any], skip: tuple[str, ...] = ()
                 ) -> tuple[tuple[str, tuple[int, ...], Any], ...]:
    """The op's outputs for ``key`` as :attr:`Parsed.outputs` (in the specs' shapes)."""
    op = get_op(op_name)
    specs = op.output_specs(problem_of(op, key))
    return tuple((n, tuple(s.shape), np_dtype(s.dtype)) for n, s in specs.items()
                 if n not in skip)


Parser = Callable[[tuple[Any, ...], tuple[Any, ...], Any], Parsed]


@dataclass(frozen=True, eq=False)
class CallSpec:
    """An op function's declaration: the op and how to parse a call (see :class:`Parsed`).

    ``parse(arrays, scalars, xp)`` gets the backend arrays (NumPy or CuPy, None where the
    caller passed None), the scalar arguments and the array module, and raises a
    :class:`~dnnctl.errors.ShapeError` / UsageError for bad input. ``required`` names the
    leading arrays that may not be None (checked once per new call signature, before the
    parse)."""

    name: str
    parse: Parser
    required: tuple[str, ...] = ()


# a built kernel as a site keeps it: (kernel, takes the caller's arrays as they are,
# adopts its outputs); the middle one is STRIDED for a ``strided_io`` kernel, which takes
# them as they are even where the parse copies them for the others
Built = tuple[Kernel, Any, bool]
STRIDED = 2


class Site:
    """Everything a call with one signature needs, made once (see the module doc)."""

    __slots__ = ("adapter", "op", "problem", "bname", "device", "attrs", "inputs", "outputs",
                 "given", "consts", "result", "pointer", "kernels", "default", "last", "planned",
                 "prepare", "finish", "enter", "leave", "empty", "empty_like", "views",
                 "given_at", "flat_inputs", "free_default", "det_default", "autograd",
                 "as_is", "made_result", "programs", "seen")

    def __init__(self, adapter: Adapter, parsed: Parsed, arrays: tuple[Any, ...] = ()) -> None:
        """``arrays``: the call the site is made for (a torch tensor's signature holds its
        ``requires_grad``: every call of the site has the same)."""
        self.adapter = adapter
        self.op = get_op(parsed.op)
        self.problem = problem_of(self.op, parsed.key)
        self.bname, self.device = adapter.backend.name, adapter.device
        self.attrs = dict(parsed.attrs)
        self.inputs = parsed.inputs
        like = parsed.like
        self.outputs = tuple((n, tuple(s), np.dtype(d), like.get(n, -1))
                             for n, s, d in parsed.outputs)
        self.given = parsed.given
        self.consts = dict(parsed.consts)
        self.result = parsed.result
        self.views = dict(parsed.kernel_shapes)
        self.prepare, self.finish = parsed.prepare, parsed.finish
        self.kernels: dict[Choice, Built] = {}
        # the default heuristic's kernel: ``default`` when its variant is deterministic (the
        # fast path of __call__ takes it whatever is asked), else ``free_default`` (runs
        # unless determinism is asked) and ``det_default`` (the deterministic variants' pick)
        self.default: Built | None = None
        self.free_default: Built | None = None
        self.det_default: Built | None = None
        self.last: tuple[Any, Built | None] = (None, None)
        # (plan, its generation, the exact entry's hit, the kernel it picks): see _pick
        self.planned: tuple[Any, int, Any, Built | None] = (None, -1, None, None)
        self.given_at = dict(parsed.given)
        cpu = adapter.kind in ("numpy", "torch-cpu")
        # a copy / re-layout of our own (prepare, finish) allocates in the backend library:
        # from the caller's allocator too
        full = parsed.prepare is not None or parsed.finish is not None
        self.enter = None if cpu else (adapter.enter_all if full else adapter.enter)
        self.leave = adapter.leave_all if full else adapter.leave
        self.empty, self.empty_like = adapter.empty, adapter.empty_like
        self.pointer = adapter.pointer_ok()
        self.flat_inputs = tuple((name, i) for name, i, _ in parsed.inputs)
        self.autograd = (_autograd_guard(parsed, arrays) if adapter.kind.startswith("torch")
                         else None)
        # the caller's arrays are the backend's (NumPy on the numpy backend): no conversion
        self.as_is = type(adapter).to_backend is Adapter.to_backend
        made = {n for n, *_ in self.outputs}
        self.made_result = (isinstance(self.result, tuple)
                            and all(n is not None and n in made for n in self.result))
        # id(kernel) -> its recorded Program (False: the recording was refused, or the
        # kernel's call goes through the site's own prepare / finish); None: this site never
        # replays (not torch CUDA tensors, turned off)
        self.programs: dict[Any, Any] | None = (
            {} if adapter.kind == "torch-cuda" and replay.enabled() else None)
        self.seen: set[int] = set()

    # -- kernel choice
    def _built(self, choice: Choice) -> Built:
        kern = kernel_for(self.problem, self.adapter.backend, self.device, choice)
        flat = self.pointer and bool(getattr(kern, "flat_io", False))
        if flat and self.flat_inputs and getattr(kern, "strided_io", False):
            flat = STRIDED  # the caller's arrays as they are, even where parse made copies
        return kern, flat, adopting(kern)

    def kernel(self, plan: PlanLike | None, build: bool = True) -> Built | None:
        """(kernel, takes the caller's arrays as they are, adopts its outputs): the plan's
        choice (counted by the plan), else the op's default heuristic. ``build=False``:
        None where that kernel is not built yet."""
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
                free = is_deterministic(self.op.name, self.bname, choice)
                if free or not _wants_determinism(self.adapter):
                    built = self.kernels.get(choice)
                    if built is None:
                        if not build:
                            return None
                        built = self.kernels[choice] = self._built(choice)
                    if free:  # a non-deterministic entry is looked at again on every call
                        self.last = (choice, built)
                        exact = getattr(active, "exact_hit", None)
                        hit = None if exact is None else exact(self.problem, self.bname,
                                                               self.device)
                        if hit is not None and hit.choice is choice:
                            # the next calls of this plan take it straight (_pick)
                            self.planned = (active, active.generation, hit, built)
                    return built
        built = self.default
        if built is not None:
            return built
        det = _wants_determinism(self.adapter)
        built = self.det_default if det else self.free_default
        if built is None:
            if not build:
                return None
            choice = default_choice(self.op, self.problem, self.bname, self.device, det)
            built = self._built(choice)
            if det:
                self.det_default = built
            elif is_deterministic(self.op.name, self.bname, choice):
                self.default = built
            else:
                self.free_default = built
        return built

    def _pick(self, plan: PlanLike | None, build: bool = True) -> Built | None:
        """:meth:`kernel`, with the unplanned default taken straight (no plan lookup), and
        a non-deterministic one where nothing asks for determinism, and a plan's exact
        entry seen before taken straight (its call still counted)."""
        active = plan if plan is not None else _ACTIVE_PLAN.get()
        if active is None:
            if self.default is not None:
                return self.default
            free = self.free_default
            if free is not None and not _wants_determinism(self.adapter):
                return free
            return self.kernel(plan, build)
        seen = self.planned
        if seen[0] is active and seen[1] == active.generation:
            seen[2].calls += 1
            return seen[3]
        return self.kernel(plan, build)

    def program(self, plan: PlanLike | None) -> tuple[Built | None, Any]:
        """(the kernel a call would take now, built already, else None; its recorded replay
        Program, else None or False) for a site with Programs."""
        built = self._pick(plan, build=False)
        programs: dict[Any, Any] = self.programs  # type: ignore[assignment]
        return built, None if built is None else programs.get(id(built[0]))

    # -- the call
    def __call__(self, arrays: tuple[Any, ...], plan: PlanLike | None) -> Any:
        # everything from the kernel's build to the result runs on the caller's device,
        # stream and allocator: a build's workspace set-up, ``prepare``'s copies and
        # ``finish``'s re-layouts too (on CuPy's own stream they escape a torch side stream's
        # order and a CUDA-graph capture); no enter on the CPU
        guard = self.autograd
        if guard is not None:
            guard(arrays)
        programs = self.programs
        built = None
        if programs:  # a recorded program of the kernel this call takes: run it from C++
            built = self._pick(plan, False)
            prog = None if built is None else programs.get(id(built[0]))
            if prog:
                done = prog(arrays)
                if done is not None:
                    if done.__class__ is int:
                        raise replay.failed(done, f"call of {prog.launches} launch(es)")
                    return done
        enter = self.enter
        token = None if enter is None else enter()
        rec = None
        try:
            # (the pick made for the replay above, if any: a plan's lookup counted once)
            kern, flat, adopt = built if built is not None else self._pick(plan)
            if programs is not None and id(kern) not in programs:
                rec = self._recorder(kern, flat)
            outs = {}
            if not adopt:
                empty, empty_like = self.empty, self.empty_like
                for name, shape, dtype, like in self.outputs:
                    outs[name] = empty(shape, dtype) if like < 0 else empty_like(arrays[like])
            if flat == STRIDED or (flat and self.prepare is None):
                ins = {}
                for name, i in self.flat_inputs:
                    a = arrays[i]
                    if a is not None:
                        ins[name] = a
                kouts = outs
                if self.given:
                    kouts = dict(outs)
                    for name, i in self.given:
                        kouts[name] = arrays[i] if i.__class__ is int else self.consts[i]
            else:
                ins, kouts = self._backend_args(arrays, outs)
            if self.consts:
                ins.update(self.consts)
            if rec is None:
                made = kern(ins, kouts, self.attrs)
            else:
                with cuda.recording(rec):
                    made = kern(ins, kouts, self.attrs)
            if adopt:
                self._adopt(made, outs, kouts, flat)
            if rec is not None:
                self._keep(kern, rec, arrays, outs, bool(adopt))
            if self.finish is not None and flat != STRIDED:
                done = self.finish(kouts, self._backend(arrays))
                conv = self.adapter.from_backend
                if done.__class__ is tuple:
                    return tuple(None if d is None else conv(d) for d in done)
                return conv(done)
        finally:
            if token is not None:
                self.leave(token)
        res = self.result
        if res.__class__ is str:
            return outs[res] if res in outs else arrays[self.given_at[res]]
        if res.__class__ is int:
            return arrays[res]
        if self.made_result:  # every name one of the outputs (all made by now)
            return tuple(map(outs.__getitem__, res))
        return tuple(None if n is None else outs[n] if n in outs else arrays[self.given_at[n]]
                     for n in res)

    # -- replay
    def _recorder(self, kern: Kernel, flat: Any) -> cuda.Recorder | None:
        """A recorder for this call of ``kern``: its second call, where it is replayable,
        takes the call's arrays as they are (no prepare, no finish: copies a recording
        would not see) and the extension is loaded (the first call may build and warm up)."""
        if not getattr(kern, "replayable", False) or not (
                flat == STRIDED or (flat and self.prepare is None and self.finish is None)):
            self.programs[id(kern)] = False  # type: ignore[index]
            return None
        if id(kern) not in self.seen:
            self.seen.add(id(kern))
            return None
        if replay.module() is None:
            return None  # not built yet (or off): asked again on a later call
        return cuda.Recorder()

    def _keep(self, kern: Kernel, rec: cuda.Recorder, arrays: tuple[Any, ...],
              outs: dict[str, Any], adopted: bool = False) -> None:
        """Make the recorded call ``kern``'s Program (False where it cannot be one);
        ``adopted``: ``outs`` are the kernel's own results (made by recorded torch steps)."""
        mod = replay.module()
        names = [n for n, *_ in self.outputs]
        n_in = len(arrays)

        def slot(name: str | None) -> int:
            if name is None:
                return -1
            if name in outs:
                return n_in + names.index(name)
            at = self.given_at.get(name)
            if at.__class__ is not int:
                raise replay.Unreplayable(f"the result {name!r} is a constant of the site")
            return at  # type: ignore[return-value]

        res = self.result
        try:
            if mod is None:
                raise replay.Unreplayable("no extension")
            if res.__class__ is int:
                result, many = [res], False
            elif res.__class__ is str:
                result, many = [slot(res)], False  # type: ignore[arg-type]
            else:
                result, many = [slot(n) for n in res], True  # type: ignore[union-attr]
            if any(n not in outs for n in names):
                raise replay.Unreplayable("an output the kernel did not return")
            prog = replay.program(mod, arrays, [outs[n] for n in names],
                                  list(self.consts.values()), rec,
                                  result, many, adopted)
        except replay.Unreplayable as why:
            self.programs[id(kern)] = False  # type: ignore[index]
            REFUSED[self.op.name] = str(why)
            return
        self.programs[id(kern)] = prog  # type: ignore[index]

    def _adopt(self, made: Any, outs: dict[str, Any], kouts: dict[str, Any],
               flat: bool) -> None:
        """Take an adopting kernel's results as the call's outputs (see :func:`adopting`):
        backend arrays go to ``finish`` as they are and to the caller in its kind."""
        if not isinstance(made, dict) or any(n not in made for n, *_ in self.outputs):
            raise RuntimeError(f"{self.op.name}: a kernel that adopts its outputs returned "
                               f"{sorted(made) if isinstance(made, dict) else type(made)}, "
                               f"not the outputs {[n for n, *_ in self.outputs]}")
        if kouts is not outs:
            kouts.update(made)
        if flat:
            outs.update(made)
        elif self.finish is None:
            conv = self.adapter.from_backend
            for name, a in made.items():
                outs[name] = conv(a)

    def _backend(self, arrays: tuple[Any, ...]) -> tuple[Any, ...]:
        if self.as_is:
            return arrays
        conv = self.adapter.to_backend
        return tuple(None if a is None else conv(a) for a in arrays)

    def _backend_args(self, arrays: tuple[Any, ...], outs: dict[str, Any]
                      ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Kernel arguments as backend arrays in the kernel's spec shapes."""
        conv = self.adapter.to_backend
        views = self.views
        back = self._backend(arrays)
        if self.prepare is not None:
            ins = self.prepare(back)
        else:
            ins = {}
            for name, i, view in self.inputs:
                a = back[i]
                if a is None:
                    continue
                if view is not None:
                    a = view(a)
                ins[name] = a.reshape(views[name]) if name in views else a
        kouts = {}
        as_is = self.as_is
        for name, a in outs.items():
            b = a if as_is else conv(a)
            kouts[name] = b.reshape(views[name]) if name in views else b
        for name, i in self.given:
            b = back[i] if i.__class__ is int else self.consts[i]
            kouts[name] = b.reshape(views[name]) if name in views else b
        return ins, kouts


REFUSED: dict[str, str] = {}  # op -> why its last recording was not replayable


_WARNED: set[str] = set()
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _caller_level() -> int:
    """warnings.warn's stacklevel of the first frame outside dnnctl (the user's call)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


def _autograd_guard(parsed: Parsed, arrays: tuple[Any, ...]
                    ) -> Callable[[tuple[Any, ...]], None] | None:
    """What a torch caller's call checks first (None: nothing). ``dnnctl.ops`` functions do
    not record autograd (``torch.ops.dnnctl`` and ``dnnctl.torch.patch`` do): with grad
    mode on, a result written into a tensor that requires grad (``out=``, in place) would
    leave torch a wrong gradient, so it is refused; inputs that require grad get a warning
    (once per op) that the result has none. A tensor written into has its version bumped,
    as torch's in-place ops do, so a backward that saved it refuses to run.

    Which of ``arrays`` require grad is part of the site's signature: worked out here once,
    not on every call."""
    import torch

    grad_on = torch.is_grad_enabled
    written = tuple(i for _, i in parsed.given if i.__class__ is int)
    op = parsed.op
    wants = any(a is not None and a.requires_grad for a in arrays)
    bump_written = _bumper(written)
    if not wants:
        return bump_written

    def guard(arrays: tuple[Any, ...]) -> None:
        if grad_on():
            for i in written:
                if arrays[i].requires_grad:
                    raise UsageError(
                        f"{op}: the result would be written into a tensor that requires "
                        "grad, and dnnctl.ops functions do not record autograd",
                        hint="use torch.ops.dnnctl (or dnnctl.torch.patch) for autograd, "
                             "or call under torch.no_grad()")
            if op not in _WARNED:
                _WARNED.add(op)
                warnings.warn(f"dnnctl.ops {op}: inputs require grad, but dnnctl.ops "
                              "functions do not record autograd: the result has no gradient "
                              "(use torch.ops.dnnctl or dnnctl.torch.patch for training)",
                              UserWarning, stacklevel=_caller_level())
        if bump_written is not None:
            bump_written(arrays)

    return guard


def _bumper(written: tuple[int, ...]) -> Callable[[tuple[Any, ...]], None] | None:
    """What bumps the versions of the ``written`` arrays of a call: torch's one C call for
    the tuple where this torch takes one, else one ``bump`` per array; None if none."""
    if not written:
        return None
    bump_all = _bump_many()
    if bump_all is None:
        import torch

        bump = torch.autograd.graph.increment_version

        def bump_each(arrays: tuple[Any, ...]) -> None:
            for i in written:
                bump(arrays[i])

        return bump_each
    # the written arrays as one tuple, by one C call (itemgetter of one index gives the item)
    pick = (operator.itemgetter(*written) if len(written) > 1
            else lambda arrays: (arrays[written[0]],))
    return lambda arrays: bump_all(pick(arrays))


_BUMP_MANY: list[Any] = []


def _bump_many() -> Callable[[tuple[Any, ...]], None] | None:
    """torch's C call that bumps the version of every tensor of a tuple (one call, not one
    Python-level ``increment_version`` per tensor), where this torch takes a tuple."""
    if not _BUMP_MANY:
        import torch

        fn = getattr(torch._C, "_increment_version", None)
        try:
            probe = torch.zeros(1)
            before = probe._version
            fn((probe,))  # type: ignore[misc]
            ok = probe._version == before + 1
        except (TypeError, RuntimeError):
            ok = False
        _BUMP_MANY.append(fn if ok else None)
    return _BUMP_MANY[0]


class _Sites(dict):  # type: ignore[type-arg]
    """signature -> Site; bounded (emptied when full)."""

    limit = 8192

    def put(self, sig: Any, site: Site) -> None:
        if len(self) >= self.limit:
            self.clear()
        self[sig] = site


_SITES = _Sites()


def call(spec: CallSpec, arrays: tuple[Any, ...], scalars: tuple[Any, ...],
         plan: PlanLike | None = None) -> Any:
    """Run one call of ``spec``'s op (see the module doc)."""
    packed = replay.SIGNATURE
    if packed is not None:  # torch tensors' signatures packed by the replay extension
        try:
            arrays_key = packed(arrays)
            if arrays_key is not None:
                site = _SITES[(spec, scalars, arrays_key)]
                return site(arrays, plan)
        except (KeyError, TypeError):  # a new signature or scalar: the slow path
            return _call_slow(spec, arrays, scalars, plan)
    sig = SIGNATURES
    try:
        # the key _call_slow makes, (spec, scalars, *signatures), spelled out for the usual
        # numbers of arrays: a list comprehension is a call of its own in Python 3.11, and
        # so is a None's signature function (~0.3 us a call together)
        n = len(arrays)
        if n == 2:
            a, b = arrays
            key = (spec, scalars, sig[a.__class__](a),
                   None if b is None else sig[b.__class__](b))
        elif n == 3:
            a, b, c = arrays
            key = (spec, scalars, sig[a.__class__](a),
                   None if b is None else sig[b.__class__](b),
                   None if c is None else sig[c.__class__](c))
        elif n == 4:
            a, b, c, d = arrays
            key = (spec, scalars, sig[a.__class__](a),
                   None if b is None else sig[b.__class__](b),
                   None if c is None else sig[c.__class__](c),
                   None if d is None else sig[d.__class__](d))
        else:  # (a None's signature is None: no call for it)
            key = (spec, scalars, *[None if a is None else sig[a.__class__](a)
                                    for a in arrays])
        site = _SITES[key]
    except (KeyError, TypeError):  # a new signature, kind or scalar: the slow path
        return _call_slow(spec, arrays, scalars, plan)
    return site(arrays, plan)


def site_for(spec: CallSpec, arrays: tuple[Any, ...], scalars: tuple[Any, ...]
             ) -> Site | None:
    """The site a call of ``spec`` with arrays of these signatures and these scalars goes
    to, if one has been made (None otherwise)."""
    try:
        return _SITES.get(_key(spec, arrays, scalars))
    except TypeError:
        return None


def arrays_key(arrays: tuple[Any, ...]) -> Any:
    """The arrays' signatures as one hashable value: packed into bytes by the replay
    extension where it is loaded and every array is a torch tensor or None (~0.07 us for
    three), else a tuple of their :func:`signature`; TypeError for an array of no known kind."""
    packed = replay.SIGNATURE
    if packed is not None:
        got = packed(arrays)
        if got is not None:
            return got
    return tuple(None if a is None else signature(a) for a in arrays)


def _key(spec: CallSpec, arrays: tuple[Any, ...], scalars: tuple[Any, ...]) -> tuple:
    """A site's key: (spec, scalars, the packed signatures) -- what :func:`call` looks up
    first -- or (spec, scalars, *the signatures) where they are not packed."""
    got = arrays_key(arrays)
    return (spec, scalars, got) if got.__class__ is bytes else (spec, scalars, *got)


def replayed(site: Site, arrays: tuple[Any, ...], plan: PlanLike | None) -> Any | None:
    """``site``'s call of ``arrays`` from its replay Program, for a caller that has
    checked the arrays are of the site's signatures: the result, or None where the kernel
    the call would take now (``plan``, else the active plan, else the default) has no
    Program or the recording does not fit the call (the caller runs its Python path)."""
    if not site.programs:
        return None
    prog = site.program(plan)[1]
    if not prog:
        return None
    done = prog(arrays)
    if done.__class__ is int:
        raise replay.failed(done, f"call of {prog.launches} launch(es)")
    return done


def program_for(spec: CallSpec, arrays: tuple[Any, ...], scalars: tuple[Any, ...],
                plan: PlanLike | None = None) -> Any | None:
    """The replay Program (:mod:`dnnctl.backends.replay`) a call of ``spec`` with arrays of
    these signatures would run now, under ``plan`` (None: the active plan, else the
    default); None where the site has recorded none."""
    site = site_for(spec, arrays, scalars)
    if site is None or not site.programs:
        return None
    return site.program(plan)[1] or None


def _call_slow(spec: CallSpec, arrays: tuple[Any, ...], scalars: tuple[Any, ...],
               plan: PlanLike | None) -> Any:
    checks.require(spec.name, spec.required, arrays)
    try:
        sig: Any = _key(spec, arrays, scalars)
        hash(sig)
    except TypeError:  # an unhashable scalar or an array kind without a signature
        sig = None
        adapter, conv = adapter_for(arrays)
        if conv is not arrays:  # another producer's DLPack tensors: run on the converted
            return _wrap_foreign(call(spec, conv, scalars, plan), arrays)
    site = _SITES.get(sig) if sig is not None else None
    if site is None:
        site = _new_site(spec, arrays, scalars)
        if sig is not None:
            _SITES.put(sig, site)
    return site(arrays, plan)


def _new_site(spec: CallSpec, arrays: tuple[Any, ...], scalars: tuple[Any, ...]) -> Site:
    adapter, conv = adapter_for(arrays)
    back = tuple(None if a is None else adapter.to_backend(a) for a in conv)
    copies = [(f"a contiguous copy of argument {i + 1}", tuple(a.shape), a.dtype)
              for i, a in enumerate(back) if a is not None and not a.flags.c_contiguous]
    if copies:  # a broadcast view of 10^12 elements must not be copied
        checks.check_fits(spec.name, copies, adapter.backend, adapter.device)
    token = adapter.enter_all()  # parse's copies on the caller's stream and allocator
    try:
        parsed = spec.parse(back, scalars, adapter.backend.xp)
    finally:
        adapter.leave_all(token)
    site = Site(adapter, parsed, conv)
    checks.check_fits(parsed.op, [(n, s, d) for n, s, d, _ in site.outputs], adapter.backend,
                      adapter.device)  # absurd sizes are refused before any allocation
    return site


def _wrap_foreign(result: Any, arrays: tuple[Any, ...]) -> Any:
    first = next(a for a in arrays if a is not None)
    producer = importlib.import_module(type(first).__module__.split(".")[0])
    back = getattr(producer, "from_dlpack", None)
    if back is None:
        return result
    if isinstance(result, tuple):
        return tuple(None if r is None else back(r) for r in result)
    return back(result)


# ----------------------------------------------------------------------------- validating path


@dataclass
class Bound:
    """The arguments of one call, converted to one backend's arrays."""

    backend: Backend
    device: DeviceInfo
    arrays: list[Any]
    wrap: Callable[[Any], Any]  # backend array -> the caller's array kind
    foreign: bool = False  # converted from another array kind (wrap hands results back)
    adapter: Adapter | None = None  # sets the call's device, stream and scratch allocator

    def with_arrays(self, arrays: Sequence[Any]) -> Bound:
        """The same call (backend, device, caller's kind and adapter) over other arrays
        (views or copies of these): what an op function hands :func:`run`."""
        return replace(self, arrays=list(arrays))

    def on_caller_stream(self) -> contextlib.AbstractContextManager[None]:
        """Work an op function does on the backend arrays itself (copies, statistics) on
        the caller's device, stream and allocator, as :func:`run` does its kernels."""
        return _on_caller_stream(self)

    def recurse(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*self.arrays, *args, **kwargs)`` -- a foreign call made again on the backend
        arrays -- on the caller's stream and allocator (:func:`_on_caller_stream`), its
        result (each item of a tuple, None kept) handed back in the caller's kind."""
        with _on_caller_stream(self):
            out = fn(*self.arrays, *args, **kwargs)
        if isinstance(out, tuple):
            return tuple(None if o is None else self.wrap(o) for o in out)
        return self.wrap(out)


def bind(*arrays: Any) -> Bound:
    """Convert call arguments (None allowed) to one backend; all must live on one device."""
    adapter, conv = adapter_for(arrays)
    back = [None if a is None else adapter.to_backend(a) for a in conv]
    foreign = conv is not arrays or adapter.kind.startswith("torch")
    if adapter.kind.startswith("torch"):
        wrap = adapter.from_backend
    elif conv is not arrays:
        def wrap(y: Any) -> Any:
            return _wrap_foreign(y, arrays)
    else:
        def wrap(y: Any) -> Any:
            return y
    if adapter.kind == "cupy" and cuda.get_device() != adapter.index:
        cuda.set_device(adapter.index)
    return Bound(adapter.backend, adapter.device, back, wrap, foreign, adapter)


@contextlib.contextmanager
def _on_caller_stream(bound: Bound) -> Iterator[None]:
    """The caller's device, stream and allocator current for the block (backends.cuda.STATE
    and CuPy's current stream): kernels launched there, and calls made there on the bound
    backend arrays, run on a torch caller's stream and take their buffers from torch's
    allocator (a side stream and a graph capture included). Nothing on the CPU (the numpy
    adapters' enter / leave do nothing)."""
    adapter = bound.adapter
    token = adapter.enter_all() if adapter is not None else None
    try:
        yield
    finally:
        if adapter is not None:
            adapter.leave_all(token)


def run(op_name: str, key: Mapping[str, Any], bound: Bound, names: tuple[str, ...],
        attrs: Mapping[str, Any], *, plan: PlanLike | None = None,
        out: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run one op call on backend arrays; ``names`` label ``bound.arrays`` (None entries are
    skipped). Validates every call."""
    checks.check_plan(plan)
    op = get_op(op_name)
    problem = problem_of(op, key)
    backend, device = bound.backend, bound.device
    specs = output_specs(op, problem)
    checks.check_fits(op_name, [(n, tuple(s.shape), np_dtype(s.dtype)) for n, s in
                                specs.items()], backend, device)
    choice = resolve(op, problem, backend, device, plan, _wants_determinism(bound.adapter))
    inputs = {n: a for n, a in zip(names, bound.arrays) if a is not None}
    outputs = dict(out or {})
    with _on_caller_stream(bound):  # build, outputs and launch on the call's stream
        kern = kernel_for(problem, backend, device, choice)
        if adopting(kern):  # it makes its outputs: only those the caller gave are passed
            made = kern(inputs, outputs, attrs)
            outputs.update(made)
            bad = adoption_error(specs, outputs)
            if bad:
                raise RuntimeError(f"{op_name} ({choice.label()}): {bad}")
            return outputs
        for oname, spec in specs.items():
            shape, dtype = tuple(spec.shape), np_dtype(spec.dtype)
            given = outputs.get(oname)
            if given is None:  # a torch caller's from torch's allocator (capture's pool too)
                outputs[oname] = cuda.scratch(shape, dtype, backend.xp)
            elif tuple(given.shape) != shape or given.dtype != dtype:
                raise ShapeError(f"{op_name}: out '{oname}' has shape {tuple(given.shape)} "
                                 f"{given.dtype}, expected {shape} {dtype}")
        kern(inputs, outputs, attrs)
    return outputs
