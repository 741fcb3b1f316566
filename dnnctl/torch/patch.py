"""``patch(model, plan)``: route a model's supported modules to dnnctl; ``unpatch`` undoes it.

Where the model traces with torch.fx, its forward is replaced by the traced graph with
conv -> bn -> act -> add and linear -> act chains fused (:mod:`dnnctl.torch.fuse`); the
graph runs only in the training mode it was traced in (else the model's own forward runs,
with each supported module still on dnnctl). Where it does not trace, modules are swapped
one by one. Modules keep their parameters and buffers: the state_dict is unchanged, and
``unpatch`` restores every forward exactly.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import operator
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.utils.hooks import RemovableHandle

from dnnctl.errors import UsageError
from dnnctl.torch import graphs as graphs_module
from dnnctl.torch import kernels
from dnnctl.torch.fuse import fuse_graph, hooked
from dnnctl.torch.modules import forward_for
from dnnctl.torch.param_linear import route_param_linears
from dnnctl.torch.pointwise import fuse_pointwise
from dnnctl.torch.report import Covered, PatchReport, Skipped
from dnnctl.torch.trace import symbolic_trace

_MISSING = object()
_MARK = "_dnnctl_patch"  # the patched model's _State, an attribute of the model itself


@dataclass
class _State:
    """A patch, kept on the model: a deep copy of the model is a patched model of its own
    (its forwards rebound to the copy's modules, see :class:`_Traced`), which ``unpatch``
    restores like the original."""

    report: PatchReport
    forwards: list[tuple[nn.Module, Any]]  # (module, its instance 'forward' before, or _MISSING)
    plan: Any

    def __reduce__(self) -> Any:  # a pickled patched model comes back unpatched
        return _pickled_as(None)

    def __deepcopy__(self, memo: dict[int, Any]) -> _State:
        forwards = [(memo.get(id(m), m),
                     before if before is _MISSING else copy.deepcopy(before, memo))
                    for m, before in self.forwards]
        return _State(copy.deepcopy(self.report, memo), forwards, self.plan)


def _state(model: nn.Module) -> _State | None:
    return model.__dict__.get(_MARK)


def _routed(fn: Any) -> bool:
    """``fn`` (a module's instance forward) is one a dnnctl patch put there: a partial of
    a dnnctl.torch function, or this module's traced forward."""
    mod = getattr(getattr(fn, "func", fn), "__module__", None) if fn is not None else None
    return bool(mod) and mod.startswith("dnnctl.torch")


def _set_forward(m: nn.Module, fn: Any, saved: list[tuple[nn.Module, Any]],
                 root: nn.Module) -> None:
    before = m.__dict__.get("forward", _MISSING)
    saved.append((m, before))
    if isinstance(fn, functools.partial):
        fn = _PatchForward.of(fn, m, before, root)
    object.__setattr__(m, "forward", fn)


def _root(fn: Any) -> nn.Module | None:
    """The patched model whose patch put ``fn`` (a routed forward) there, while that
    model is still patched; None for a forward no live patch holds (a copy of a part of a
    patched model)."""
    if isinstance(fn, _PatchForward):
        root = fn.root() if fn.root is not None else None
    else:  # the model's own traced / graphed forward
        root = getattr(fn, "model", None)
    return root if isinstance(root, nn.Module) and _state(root) is not None else None


def _holds(outer: nn.Module, inner: nn.Module) -> bool:
    return any(m is inner for m in outer.modules())


def _shared_with(model: nn.Module, fn: Any) -> nn.Module | None:
    """The other patched model that routes a module ``model`` holds, where neither model
    holds the other (they share the module: a backbone two models hold, ultralytics'
    ``Conv.default_act``, one SiLU for every model built in the process); None where the
    patches would nest or no live patch holds the module."""
    root = _root(fn)
    if root is None or root is model or _holds(root, model) or _holds(model, root):
        return None
    return root


# Pickling a patched model (torch.save(model), a checkpoint of the whole model object)
# stores the model as it was before the patch: a patch's forwards name a plan by a handle
# of this process, which means nothing in the one that loads it. Each object a patch puts on
# a model pickles as what was there before (or as nothing that changes the model), through
# the standard library only (the checkpoint loads where dnnctl is not installed), while a
# deep copy stays a patched model of its own.


def _pickled_as(value: Any) -> tuple[Any, tuple]:
    """A ``__reduce__`` value that unpickles as ``value``, naming no dnnctl function."""
    return operator.getitem, ((value,), 0)


def _own_forward(m: nn.Module, before: Any) -> Any:
    """The forward a module had before its patch: the instance one it had, else its
    class's (bound to it)."""
    return type(m).forward.__get__(m) if before is _MISSING else before


class _PatchForward(functools.partial):
    """A module's dnnctl forward (:func:`forward_for`'s partial) as patch installs it:
    pickled as the module's forward before the patch; deep-copied as the partial (bound to
    the copy's module)."""

    @classmethod
    def of(cls, fn: functools.partial, m: nn.Module, before: Any,
           root: nn.Module | None) -> _PatchForward:
        new = cls(fn.func, *fn.args, **fn.keywords)
        new.owner, new.before = m, before
        # the patched model (see _shared_with); a weak reference: a module shared with
        # another model must not keep this one alive
        new.root = None if root is None else weakref.ref(root)
        return new

    def __reduce__(self) -> Any:
        return _pickled_as(_own_forward(self.owner, self.before))

    def __deepcopy__(self, memo: dict[int, Any]) -> _PatchForward:
        plain = functools.partial(self.func, *copy.deepcopy(self.args, memo),
                                  **copy.deepcopy(self.keywords, memo))
        before = self.before if self.before is _MISSING else copy.deepcopy(self.before, memo)
        # the copy of the patched model, where it is copied too (else a copy of a part of it,
        # which no live patch holds)
        root = self.root() if self.root is not None else None
        return _PatchForward.of(plain, copy.deepcopy(self.owner, memo), before,
                                None if root is None else memo.get(id(root)))


def _calls(gm: fx.GraphModule) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in gm.graph.nodes:
        if n.op == "call_module":
            out[n.target] = out.get(n.target, 0) + 1
    return out


def _attention_hook(gm: fx.GraphModule, report: PatchReport, handle: int) -> None:
    """F.scaled_dot_product_attention nodes: routed only when dnnctl.ops.attention exists."""
    nodes = [n for n in gm.graph.nodes
             if n.op == "call_function" and n.target is F.scaled_dot_product_attention]
    if not nodes:
        return
    import dnnctl.ops

    if "attention" not in dir(dnnctl.ops):
        report.skipped.extend(Skipped(n.name, "scaled_dot_product_attention",
                                      "dnnctl.ops.attention is not available in this dnnctl")
                              for n in nodes)
        return
    from dnnctl.torch.attention import route_sdpa

    route_sdpa(gm, nodes, report, handle)


def patch(model: nn.Module, plan: Any = None, *, trace: bool = True,
          backward: str | dict[str, str] = "plan", graphs: bool = False,
          max_graphs: int = graphs_module.MAX_GRAPHS, pointwise: bool = True) -> PatchReport:
    """Route ``model``'s supported modules to dnnctl (in place) and return the report.

    ``plan``: a loaded plan (``dnnctl.load_plan``); None uses the active plan at call time,
    else each op's default. Inference (``model.eval()``) folds BatchNorm into the preceding
    convolution; training mode runs BatchNorm with batch statistics and keeps autograd.
    ``backward``: how gradients run: ``"plan"`` (dnnctl's backward kernel for a backward
    problem the plan has an entry for, torch's formula otherwise), ``"dnnctl"`` (dnnctl's
    backward kernels wherever they take the problem) or ``"torch"`` (torch's formulas); or a
    mapping per op / pass, e.g. ``{"*": "dnnctl", "conv2d/wgrad": "torch"}``.
    ``graphs``: run the model's inference calls (grad off, eval mode, CUDA tensors) as one
    CUDA graph per call signature, captured after two eager calls, at most ``max_graphs``
    kept (see :mod:`dnnctl.torch.graphs`; :func:`dnnctl.torch.graphs.info` says what they did).
    ``pointwise``: in a traced model in eval mode, run each chain of elementwise ops (rotary
    embeddings, scales, casts, gates) as one generated CUDA kernel (see
    :mod:`dnnctl.torch.pointwise`; ``report.pointwise`` lists the chains).
    """
    if not isinstance(model, nn.Module):
        raise UsageError(f"patch: expected a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(graphs, bool):
        raise UsageError(f"patch: graphs must be True or False, got {graphs!r}")
    if not isinstance(pointwise, bool):
        raise UsageError(f"patch: pointwise must be True or False, got {pointwise!r}")
    if type(max_graphs) is not int or max_graphs < 1:
        raise UsageError(f"patch: max_graphs must be a positive integer, got {max_graphs!r}",
                         hint="each graph keeps its own GPU memory pool; 8 is the default")
    if _state(model) is not None:
        raise UsageError("patch: this model is already patched",
                         hint="call dnnctl.torch.unpatch(model) first")
    shared: set[str] = set()  # modules another patched model holds and routes
    for name, m in model.named_modules():
        fwd = m.__dict__.get("forward")
        if _routed(fwd):  # a part of (or around) another patch, or shared with one
            if _shared_with(model, fwd) is not None:
                shared.add(name)
                continue
            raise UsageError(f"patch: module {name!r} is already routed by another "
                             f"dnnctl.torch.patch (of a model that holds it, or that it "
                             f"holds)",
                             hint="unpatch that model (or this copy of a part of one) first, "
                                  "then patch once, at the level you want: patches do not "
                                  "nest")
    handle = kernels.plan_handle(plan, backward)
    report = PatchReport(training=model.training, _fallbacks_at=dict(kernels.FALLBACKS))
    saved: list[tuple[nn.Module, Any]] = []
    covered: set[str] = set()
    for name, m in model.named_modules():
        fn, op, note = forward_for(m, handle)
        if m is model and len(list(model.children())):
            if op == "(container)":  # what runs its covered parts, said once
                report.skipped.append(Skipped(name, type(m).__name__, note))
            continue
        if name in shared:  # left as the other model's patch routes it (with its plan)
            covered.add(name)
            report.covered.append(Covered(name, type(m).__name__, op, "shared with another "
                                          "patched model, whose patch routes it"))
        elif fn is not None:
            _set_forward(m, fn, saved, model)
            covered.add(name)
            report.covered.append(Covered(name, type(m).__name__, op, note))
        elif op:
            report.skipped.append(Skipped(name, type(m).__name__, note))
    if trace and list(model.children()):
        _trace(model, covered, handle, report, saved, pointwise)
    if graphs:
        inner = model.__dict__.get("forward", _MISSING)
        _set_forward(model, graphs_module.GraphedForward(
            model, _own_forward(model, inner), max_graphs), saved, model)
        report.graphs = True
    object.__setattr__(model, _MARK, _State(report, saved, plan))
    _mark_unscriptable(model, saved)
    return report


def _mark_unscriptable(model: nn.Module, saved: list[tuple[nn.Module, Any]]) -> None:
    """The model and every module whose forward patch replaced get a
    ``__prepare_scriptable__`` that raises torch.jit.script's error: script asks it of
    each module it compiles, so a part of a patched model scripted alone (``script(
    model.backbone)``) says so too, instead of failing deep inside TorchScript on the
    forward patch put there."""
    routed = {id(m) for m, _ in saved}
    for name, m in model.named_modules():
        if (m is model or id(m) in routed) and "__prepare_scriptable__" not in m.__dict__:
            object.__setattr__(m, "__prepare_scriptable__", _NotScriptable(m, name))


def _unmark_unscriptable(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m.__dict__.get("__prepare_scriptable__"), _NotScriptable):
            del m.__dict__["__prepare_scriptable__"]


class _NotScriptable:
    """A patched module's ``__prepare_scriptable__``: torch.jit.script's error; pickled as a
    no-op one (the model comes back unpatched, and scriptable)."""

    def __init__(self, model: nn.Module, name: str = "") -> None:
        self.model, self.name = model, name

    def __call__(self) -> Any:
        what = "a patched model" if not self.name else (
            f"module {self.name!r} ({type(self.model).__name__}) of a patched model")
        raise UsageError(f"torch.jit.script cannot compile {what}: TorchScript compiles "
                         "the model's Python source, and dnnctl's kernels are called from "
                         "Python",
                         hint="script the model before dnnctl.torch.patch (or after "
                              "unpatch), or use torch.compile / torch.export, which keep "
                              "the dnnctl ops")

    def __reduce__(self) -> Any:  # a callable that returns the model as it is
        return functools.partial, (operator.getitem, (self.model,), 0)

    def __deepcopy__(self, memo: dict[int, Any]) -> _NotScriptable:
        return _NotScriptable(copy.deepcopy(self.model, memo), self.name)


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _signature(fn: Any) -> tuple[inspect.Signature | None, list[str], dict[str, Any]]:
    """(signature, the required positional parameters, the defaulted ones with their
    defaults) of a forward; (None, [], {}) where it takes *args / **kwargs or has none."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None, [], {}
    params = list(sig.parameters.values())
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return None, [], {}
    required = [p.name for p in params if p.default is p.empty and p.kind in _POSITIONAL]
    if len(required) != sum(p.default is p.empty for p in params):
        return None, [], {}  # a required keyword-only parameter
    return sig, required, {p.name: p.default for p in params if p.default is not p.empty}


def _own_signature(fn: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _is_default(value: Any, default: Any) -> bool:
    """``value`` is what the graph was specialized on: the default object itself, or an
    equal plain scalar (a flag or a factor passed explicitly)."""
    if value is default:
        return True
    plain = (bool, int, float, str)
    return type(value) in plain and type(default) is type(value) and value == default


def _trace(model: nn.Module, covered: set[str], handle: int, report: PatchReport,
           saved: list[tuple[nn.Module, Any]], pointwise: bool) -> None:
    """Trace the model with its optional arguments fixed at their defaults (``forward(x,
    mask=None)``: the graph of the call without a mask); the traced graph runs the calls
    that pass only the required arguments (or the defaults themselves), in the training mode
    it was traced in; any other call runs the model's own forward, whose supported modules
    are still on dnnctl."""
    original = model.__dict__.get("forward", _MISSING)
    own = type(model).forward.__get__(model) if original is _MISSING else original
    try:
        traced = _traced(model, own, covered, handle, report, pointwise)
    except _NotTraceable as exc:  # module-by-module is still sound
        report.trace_error = str(exc)
        return
    report.traced = True
    _set_forward(model, traced, saved, model)


class _NotTraceable(Exception):
    """torch.fx could not trace the model (the message says why)."""


def _traced(model: nn.Module, own: Any, covered: set[str], handle: int,
            report: PatchReport, pointwise: bool) -> _Traced:
    """Trace ``model`` at its optional arguments' defaults, fuse the traced graph's chains
    and route its attention calls (noted in ``report``); _NotTraceable where fx cannot
    trace it."""
    sig, required, defaults = _signature(own)
    try:
        gm = symbolic_trace(model, defaults)
    except Exception as exc:  # any trace failure
        raise _NotTraceable(f"not traceable: {type(exc).__name__}: {str(exc)[:120]}") from exc
    reads = _reads(model, gm)
    report.fusions = fuse_graph(gm, covered, not model.training, handle, _calls(gm))
    _attention_hook(gm, report, handle)
    if not model.training:
        route_param_linears(gm, report, handle)
    if pointwise and not model.training:
        report.pointwise = fuse_pointwise(gm)
    members = tuple(model.get_submodule(n) for f in report.fusions for n in (f.head, *f.folded))
    # a fused GELU's form is baked into its chain's epilogue: changed, the graph is traced
    # again (the modules a fused chain holds read their own settings at each call)
    reads += tuple((m.__dict__, "approximate", m.approximate) for m in members
                   if type(m) is nn.GELU)
    return _Traced(model, gm, own, sig, required, defaults, covered, handle, reads, members,
                   pointwise)


def _hook_count() -> int:
    """How many hook handles torch has ever made (module and tensor hooks alike): one
    integer that moves whenever a hook is registered anywhere."""
    return getattr(RemovableHandle, "next_id", 0)


_PLAIN = (int, float, bool, str, type(None))


def _plain(v: Any) -> bool:
    return type(v) in _PLAIN or (type(v) is tuple and all(type(e) in _PLAIN for e in v))


def _reads(model: nn.Module, gm: fx.GraphModule) -> tuple[tuple[dict, str, Any], ...]:
    """(dict, key, value) for each step of the path to every module and tensor the graph
    reads (``layer1`` in model._modules, ``0`` in layer1._modules, ...): the graph holds
    those objects themselves, so replacing one afterwards (a new head, LoRA, a buffer
    reassigned, a buffer converted by ``.to()`` / ``.half()``) needs a new trace. The
    same for the plain attributes (numbers, strings, flags) of the modules whose forward the
    trace ran through: the graph has their values baked in (a temperature, a flag)."""
    steps: dict[tuple[int, str], tuple[dict, str, Any]] = {}
    leaves = [n.target for n in gm.graph.nodes if n.op == "call_module"]
    for name, m in model.named_modules():
        if any(name == leaf or name.startswith(leaf + ".") for leaf in leaves):
            continue  # a leaf's own forward runs at call time and reads its attributes then
        d = m.__dict__
        for key, value in d.items():
            if key[0] != "_" and key != "training" and _plain(value):
                steps[(id(d), key)] = (d, key, value)
    for node in gm.graph.nodes:
        if node.op not in ("call_module", "get_attr"):
            continue
        obj: Any = model
        for part in node.target.split("."):
            where = next((d for d in (obj.__dict__.get("_modules"),
                                      obj.__dict__.get("_parameters"),
                                      obj.__dict__.get("_buffers"), obj.__dict__)
                          if isinstance(d, dict) and part in d), None)
            if where is None:
                break
            obj = where[part]
            steps[(id(where), part)] = (where, part, obj)
    return tuple(steps.values())


_MAX_RETRACES = 8


class _Traced:
    """The patched model's forward: the traced graph for calls it was traced for (see
    :func:`_trace`), the model's own forward otherwise. A required argument given as None
    (CLIP's ``layer(h, None, causal_mask)``) is a call of the latter: the trace gave each
    required argument a traced value, which ``mask is not None`` took for a tensor.
    Deep-copied with its model it becomes a :class:`_Retrace` of the copy: the graph's fused
    chains hold the original's modules."""

    def __init__(self, model: nn.Module, gm: fx.GraphModule, own: Any,
                 sig: inspect.Signature | None, required: list[str], defaults: dict[str, Any],
                 covered: set[str], handle: int,
                 reads: tuple[tuple[dict, str, Any], ...] = (),
                 members: tuple[nn.Module, ...] = (), pointwise: bool = True) -> None:
        self.model, self.gm, self.own, self.sig = model, gm, own, sig
        self.pointwise = pointwise
        self.required, self.defaults, self.n_req = required, defaults, len(required)
        self.covered, self.handle, self.reads = covered, handle, reads
        self.mode, self.retraces = model.training, 0
        # the modules fused chains run without calling them, and the hook count when they
        # were last seen without hooks (patch leaves a hooked module out of every fusion)
        self.members, self.hooks_seen = members, _hook_count()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.model.training != self.mode:
            return self.own(*args, **kwargs)
        if not torch.compiler.is_compiling():  # (a compiled graph has dynamo's own guards)
            for where, key, value in self.reads:  # ~50-80 ns a step
                if where.get(key) is not value:
                    return self._retrace()(*args, **kwargs)
            hooks = _hook_count()
            if hooks != self.hooks_seen:  # a hook was registered somewhere since
                self.hooks_seen = hooks
                if any(hooked(m) for m in self.members):  # on a fused module: unfuse it
                    return self._retrace()(*args, **kwargs)
        if not kwargs and len(args) == self.n_req:
            for a in args:
                if a is None:  # (see the class docstring)
                    return self.own(*args)
            return self.gm(*args)
        if self.sig is None:
            return self.gm(*args, **kwargs)
        try:
            bound = self.sig.bind(*args, **kwargs)
        except TypeError:
            return self.own(*args, **kwargs)  # the model's own error for a wrong call
        given = bound.arguments
        if all(_is_default(given[n], self.defaults[n]) for n in given if n in self.defaults) \
                and all(n in given and given[n] is not None for n in self.required):
            return self.gm(*(given[n] for n in self.required))
        return self.own(*args, **kwargs)

    @property
    def __code__(self) -> Any:
        """The model's own forward's code object: what tools that read a module's forward
        as a function take from it (torch.export names its trace after it)."""
        own = self.own
        return getattr(getattr(own, "__func__", own), "__code__", None)

    @property
    def __signature__(self) -> inspect.Signature | None:
        """The model's own forward's signature (inspect.signature reads it): torch.export
        binds the inputs and ``dynamic_shapes`` to its parameter names, not to this
        object's ``*args, **kwargs``."""
        return _own_signature(self.own)

    def __reduce__(self) -> Any:  # pickled as the model's own forward
        return _pickled_as(self.own)

    def _retrace(self) -> Any:
        """A module or tensor the graph holds was replaced: trace the model as it is now."""
        return _trace_again(self.model, self.own, self.covered, self.handle,
                            self.retraces + 1, self.pointwise)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        new = memo.get(id(self.model))
        if new is None:  # copied without its model: the same forward
            return self
        return _Retrace(new, self.covered, self.handle, self.pointwise)


def _trace_again(model: nn.Module, own: Any, covered: set[str], handle: int,
                 retraces: int, pointwise: bool) -> Any:
    """Trace ``model`` as it is now and make that its forward (modules dnnctl patched still
    run on dnnctl; a module put in since runs its own forward). Where it no longer traces,
    or after _MAX_RETRACES traces (like torch.compile's recompile limit), the model's own
    forward, module by module, which reads everything live."""
    traced: Any = own
    if retraces <= _MAX_RETRACES:
        patched = {n for n, m in model.named_modules() if "forward" in m.__dict__}
        try:
            traced = _traced(model, own, covered & patched, handle,
                             PatchReport(training=model.training), pointwise)
            traced.retraces = retraces
        except _NotTraceable:
            pass
    graphed = model.__dict__.get("forward")
    if isinstance(graphed, graphs_module.GraphedForward):
        graphed.inner = traced  # (its graphs see the change and are captured again)
    else:
        object.__setattr__(model, "forward", traced)
    return traced


class _Retrace:
    """A deep copy's forward: traces the copy (its own modules, already patched) on its first
    call, when the copy is complete, then stands aside for that :class:`_Traced`."""

    def __init__(self, model: nn.Module, covered: set[str], handle: int,
                 pointwise: bool) -> None:
        self.model, self.covered, self.handle = model, covered, handle
        self.pointwise = pointwise

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        model = self.model
        if torch.compiler.is_compiling():  # no tracing inside a compile: the model's own
            return type(model).forward(model, *args, **kwargs)
        traced = _trace_again(model, type(model).forward.__get__(model), self.covered,
                              self.handle, 0, self.pointwise)
        return traced(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature | None:
        """As :attr:`_Traced.__signature__`."""
        return _own_signature(_own_forward(self.model, _MISSING))

    def __reduce__(self) -> Any:  # pickled as the model's own forward
        return _pickled_as(_own_forward(self.model, _MISSING))

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        new = memo.get(id(self.model))
        return self if new is None else _Retrace(new, self.covered, self.handle,
                                                 self.pointwise)


def unpatch(model: nn.Module) -> PatchReport:
    """Restore every forward ``patch`` replaced; returns the patch's report."""
    state = model.__dict__.pop(_MARK, None)
    if state is None:
        # a copy of a part of a patched model (``copy.deepcopy(model.backbone)``) carries
        # dnnctl forwards without a patch of its own: they are taken off
        routed = [m for m in model.modules() if _routed(m.__dict__.get("forward"))
                  and _root(m.__dict__["forward"]) is None]  # (not another model's)
        if not routed:
            raise UsageError("unpatch: this model is not patched",
                             hint="call dnnctl.torch.patch(model) first")
        for m in routed:
            del m.__dict__["forward"]
        _unmark_unscriptable(model)
        return PatchReport(training=model.training)
    for m, before in reversed(state.forwards):
        if before is _MISSING:
            m.__dict__.pop("forward", None)
        else:
            object.__setattr__(m, "forward", before)
    _unmark_unscriptable(model)
    return state.report


def is_patched(model: nn.Module) -> bool:
    return _state(model) is not None



@contextlib.contextmanager
def patched(model: nn.Module, plan: Any = None, **kwargs: Any) -> Iterator[PatchReport]:
    """``with patched(model, plan) as report:`` patch for the block, then unpatch."""
    report = patch(model, plan, **kwargs)
    try:
        yield report
    finally:
        unpatch(model)
