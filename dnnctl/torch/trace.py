"""torch.fx tracing of a model for :func:`dnnctl.torch.patch`: ``fx.symbolic_trace`` with
in-place augmented assignments kept in place and activation checkpointing kept as one graph
node (not inlined), so the traced graph computes what the model computes."""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.checkpoint
from torch import fx, nn


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
        with _checkpoint_leaf(model, tracer):
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
