"""torch.fx tracing of a model for :func:`dnnctl.torch.patch`: ``fx.symbolic_trace`` with
in-place augmented assignments kept in place, activation checkpointing kept as one graph
node (not inlined), and grad-mode / autocast blocks kept as nodes that enter and leave them,
so the traced graph computes what the model computes."""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.checkpoint
from torch import fx, nn
from torch.amp.autocast_mode import _enter_autocast, _exit_autocast
from torch.autograd.grad_mode import _enter_inference_mode, _exit_inference_mode


class _InplaceProxy(fx.Proxy):
    """fx's Proxy without ``__iadd__`` traces ``h += y`` as ``h = h + y``: eager mutates h,
    and any other name for it (``skip = h`` before) sees the sum, while the traced graph
    would not. This Proxy records the augmented assignments as the in-place operators they
    are (fx generates ``h += y`` for them)."""


def _inplace_dunder(op: Any) -> Any:
    def method(self: fx.Proxy, other: Any) -> fx.Proxy:
        return self.tracer.create_proxy("call_function", op, (self, other), {})
    return method


for _name in ("iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "imatmul",
              "iand", "ior", "ixor", "ilshift", "irshift"):
    setattr(_InplaceProxy, f"__{_name}__", _inplace_dunder(getattr(operator, _name)))


class _Tracer(fx.Tracer):
    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _InplaceProxy(node, self)


class ChangesItsAttributes(Exception):
    """The forward changes its modules' attributes (a call counter, a cached size): a traced
    graph would have the value of the trace baked in."""


def symbolic_trace(model: nn.Module, defaults: dict[str, Any]) -> fx.GraphModule:
    """``fx.symbolic_trace`` with in-place augmented assignments kept in place, and
    activation checkpointing kept (:func:`_checkpoint_leaf`). The modules' public
    attributes are as before the trace afterwards (fx runs the forward's Python once, on
    proxies); :class:`ChangesItsAttributes` where the forward changed one."""
    tracer = _Tracer()
    attrs = _attributes(model)
    try:
        with _checkpoint_leaf(model, tracer), _mode_blocks(tracer):
            graph = tracer.trace(model, concrete_args=defaults or None)
    finally:
        changed = _restore(attrs)
    if changed:
        raise ChangesItsAttributes(f"the forward changes attribute {changed!r}, which a "
                                   "traced graph would not")
    return fx.GraphModule(tracer.root, graph, type(model).__name__)


_MISSING = object()


def _attributes(model: nn.Module) -> list[tuple[dict, dict]]:
    """(module __dict__, a copy of its public entries) for each module of ``model``."""
    return [(d, {k: v for k, v in d.items() if k[0] != "_"})
            for d in (m.__dict__ for m in model.modules())]


def _restore(attrs: list[tuple[dict, dict]]) -> str:
    """Put back the public attributes a trace's run of the forward changed, added or removed
    (the forward's own Python ran on proxies); the first one's name, "" where none."""
    first = ""
    for d, before in attrs:
        for k, v in before.items():
            if d.get(k, _MISSING) is not v:
                first = first or k
                d[k] = v
        for k in [k for k in d if k[0] != "_" and k not in before]:
            first = first or k
            del d[k]
    return first


_CHECKPOINTS = (torch.utils.checkpoint.checkpoint, torch.utils.checkpoint.checkpoint_sequential)


@contextlib.contextmanager
def _checkpoint_leaf(model: nn.Module, tracer: fx.Tracer) -> Iterator[None]:
    """While ``model`` is traced, a ``torch.utils.checkpoint`` call (``checkpoint`` /
    ``checkpoint_sequential``, by module attribute or by a name the model's forwards import)
    becomes one graph node that calls it, its function (a module, patched module by module)
    run by checkpoint as in eager. Traced through, it would be inlined and the checkpointing
    silently gone: every activation kept (the memory it was there to save), and BatchNorm
    statistics updated once where eager's recomputation updates them again. (fx's own
    ``autowrap_modules`` wraps every callable of the module, some of which are not
    functions: the trace then fails on Python 3.12.)"""
    spaces = {id(torch.utils.checkpoint.__dict__): torch.utils.checkpoint.__dict__}
    for m in model.modules():
        fwd = getattr(type(m).forward, "__globals__", None)
        if isinstance(fwd, dict):
            spaces.setdefault(id(fwd), fwd)
    saved: list[tuple[dict[str, Any], str, Any]] = []
    for space in spaces.values():
        for name, value in list(space.items()):
            if any(value is fn for fn in _CHECKPOINTS):
                saved.append((space, name, value))
                space[name] = _leaf(value, tracer)
    # checkpoint reached some other way (a functools.partial made before the trace, as
    # Hugging Face's gradient checkpointing holds it) would be traced through: its inner
    # entry points refuse traced values, so the model is patched module by module, where
    # its own forward runs checkpoint as in eager
    inner = torch.utils.checkpoint.__dict__
    for name in ("CheckpointFunction", "_checkpoint_without_reentrant_generator"):
        if name in inner:
            saved.append((inner, name, inner[name]))
            inner[name] = _Untraceable(inner[name])
    try:
        yield
    finally:
        for space, name, value in reversed(saved):
            space[name] = value


class _Untraceable:
    """An entry point of torch.utils.checkpoint that refuses fx's traced values (see
    :func:`_checkpoint_leaf`) and passes everything else through."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def _check(self, args: tuple, kwargs: dict) -> None:
        if any(isinstance(a, fx.Proxy) for a in (*args, *kwargs.values())):
            raise TypeError("activation checkpointing reached through a reference made "
                            "before the trace (a functools.partial of checkpoint): "
                            "patched module by module, so it stays checkpointing")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._check(args, kwargs)
        return self.real(*args, **kwargs)

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        self._check(args, kwargs)
        return self.real.apply(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _leaf(fn: Any, tracer: fx.Tracer) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        if any(isinstance(a, fx.Proxy) for a in (*args, *kwargs.values())):
            return tracer.create_proxy("call_function", fn, args, kwargs)
        return fn(*args, **kwargs)
    return call


# ----------------------------------------------------------------------------- mode blocks


def _grad_enter(mode: bool) -> bool:
    """A traced ``torch.no_grad()`` / ``enable_grad()`` / ``set_grad_enabled(mode)`` block
    entered: grad mode set to ``mode``; the mode before, for :func:`_grad_exit`."""
    prev = torch.is_grad_enabled()
    torch._C._set_grad_enabled(mode)
    return prev


def _grad_exit(prev: bool) -> None:
    torch._C._set_grad_enabled(prev)


# the functions of the nodes that enter and leave a mode block in a traced graph
MODE_CHANGES = frozenset({_grad_enter, _grad_exit, _enter_inference_mode, _exit_inference_mode,
                          _enter_autocast, _exit_autocast})

_NODE = "_dnnctl_mode_node"  # on the context object: its enter node, for the exit's


def _enter_args(ctx: Any, args: tuple) -> tuple[Any, tuple] | None:
    """(enter function, its arguments) for a context manager entered (or, for
    set_grad_enabled, made: it switches on construction, as a plain call too)."""
    g = torch.autograd.grad_mode
    if isinstance(ctx, g.no_grad):
        return _grad_enter, (False,)
    if isinstance(ctx, g.enable_grad):
        return _grad_enter, (True,)
    if isinstance(ctx, g.set_grad_enabled):
        return _grad_enter, (bool(args[0]),)
    if isinstance(ctx, g.inference_mode):
        return _enter_inference_mode, (bool(ctx.mode),)
    if isinstance(ctx, torch.amp.autocast_mode.autocast):
        return _enter_autocast, (ctx.device, ctx.fast_dtype, bool(ctx._enabled),
                                 bool(ctx._cache_enabled))
    return None


_EXITS = {_grad_enter: _grad_exit, _enter_inference_mode: _exit_inference_mode,
          _enter_autocast: _exit_autocast}


@contextlib.contextmanager
def _mode_blocks(tracer: fx.Tracer) -> Iterator[None]:
    """While the model is traced, entering and leaving a ``torch.no_grad()``,
    ``enable_grad()``, ``set_grad_enabled()``, ``inference_mode()`` or ``autocast()``
    block (a ``with``, or a decorator such as ``@torch.no_grad()``) also records graph
    nodes that do so. fx runs the model's Python once: the switch alone would happen at
    trace time only, and the graph compute the block in the caller's modes (a teacher
    network under ``no_grad`` getting gradients, a rotary embedding under
    ``autocast(enabled=False)`` computed in bfloat16). Only the outermost switch of a
    nest records (no_grad switches through set_grad_enabled)."""
    g = torch.autograd.grad_mode
    depth = [0]

    def record(real: Any, enter: bool) -> Any:
        def method(self: Any, *args: Any) -> Any:
            depth[0] += 1
            try:
                out = real(self, *args)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                if enter:
                    found = _enter_args(self, args)
                    if found is not None:
                        self.__dict__[_NODE] = (found[0], tracer.create_proxy(
                            "call_function", found[0], found[1], {}))
                elif _NODE in self.__dict__:
                    fn, node = self.__dict__.pop(_NODE)
                    tracer.create_proxy("call_function", _EXITS[fn], (node,), {})
            return out
        return method

    targets = [(g.no_grad, "__enter__", True), (g.no_grad, "__exit__", False),
               (g.enable_grad, "__enter__", True), (g.enable_grad, "__exit__", False),
               (g.set_grad_enabled, "__init__", True), (g.set_grad_enabled, "__exit__", False),
               (g.inference_mode, "__enter__", True), (g.inference_mode, "__exit__", False),
               (torch.amp.autocast_mode.autocast, "__enter__", True),
               (torch.amp.autocast_mode.autocast, "__exit__", False)]
    saved = [(cls, name, cls.__dict__[name]) for cls, name, _ in targets]
    for (cls, name, enter), (_, _, real) in zip(targets, saved):
        setattr(cls, name, record(real, enter))
    try:
        yield
    finally:
        for cls, name, real in saved:
            setattr(cls, name, real)
