"""A patched model's inference forward as CUDA graphs: ``patch(model, plan, graphs=True)``.

A model called eagerly pays its host's time for every op: Python, the dispatcher, each
launch. A host-bound model (small batches, a decode step, many small ops) then runs at the
host's speed whatever its kernels do. With ``graphs=True`` the patched model's forward runs
as one CUDA graph per call signature, replayed in one launch:

- **When.** Grad off (``torch.no_grad()`` / ``torch.inference_mode()``), the model in eval
  mode, CUDA tensors, not already inside a capture or a ``torch.compile`` trace. Every
  other call runs the patched forward as it is.
- **A signature** is the tensors' sizes, strides, dtypes and device, the other arguments'
  values (numbers, strings, flags, None), and what steers which kernels run: grad /
  inference mode, autocast, the current device, the active plan and its generation,
  dnnctl's and torch's determinism switches, cuDNN's and TF32's switches, the SDPA backends
  allowed.
- **Captured after two eager calls** of the signature (lazy set-up, cuDNN's autotuning and
  dnnctl's kernel builds happen in the first). The second one is watched: a forward that
  replaces a module, parameter, buffer or attribute of the model, or writes into one of its
  inputs, is never captured (Python state a replay would not update); nor is a model with
  a forward hook (its Python would run only at the capture), nor one whose capture fails
  (a GPU value read on the host: ``.item()``, a data-dependent shape). The reason is in
  :meth:`GraphedForward.info`.
- **A call** copies its tensors into the graph's inputs, replays the graph on the caller's
  current stream and returns copies of its outputs: a later call never overwrites what an
  earlier one returned. Buffers the forward writes in place (a KV cache) are written by
  each replay, as they are by each eager call.
- **Staleness.** Each replay first checks what the graph read: every module, parameter,
  buffer and attribute of the model (identity, data pointer and version counter). One
  replaced, converted (``.half()``, ``.to()``) or changed in place (``load_state_dict``,
  an optimizer step) since the capture drops the model's graphs; the signature then runs
  eagerly (refreshing what the patch derives from it, BatchNorm folded into a convolution)
  and is captured again. State outside the model (a global, a closure) is not watched.
- **Memory.** Each graph keeps its own memory pool; at most ``max_graphs`` signatures are
  kept, the least recently used dropped first. Once ``CAPTURE_LIMIT * max_graphs``
  signatures have been captured (shapes that change from call to call), new ones stay
  eager.

A replay does not pass through dnnctl's per-op Python, so a plan's call counters do not
count replayed calls.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.modules.module as torch_module
from torch import nn
from torch.utils import _pytree as pytree

from dnnctl.backends import replay
from dnnctl.ops.dispatch import active_plan, arrays_key
from dnnctl.ops.registry import deterministic_only, generation

WARM_CALLS = 2  # eager calls of a signature before its capture (the last one watched)
MAX_GRAPHS = 8
CAPTURE_LIMIT = 4  # captures stop at this many times max_graphs (the model's graphs so far)
_MAX_WARM = 4096
_PLAIN = (int, float, bool, str, type(None), torch.dtype)
_TENSOR_TYPES = (torch.Tensor, nn.Parameter)
_SKIP = object()  # a call no graph takes


@dataclass
class _Graph:
    """One captured signature: the graph, its static inputs and outputs, and the state of the
    model it was captured against."""

    graph: Any
    inputs: list[torch.Tensor]
    outputs: list[Any]  # the output's leaves (static tensors, and constants)
    spec: Any  # the output's pytree spec
    pairs: tuple[tuple[dict, Any], ...]
    state: bytes
    held: tuple[Any, ...]  # the watched values, alive so that no identity is reused
    stream: Any = None  # the stream of the last replay

    def run(self, tensors: list[torch.Tensor]) -> Any:
        stream = torch.cuda.current_stream()
        if stream != self.stream:  # a replay on another stream waits for the last one
            if self.stream is not None:
                stream.wait_stream(self.stream)
            self.stream = stream
        for static, t in zip(self.inputs, tensors):
            static.copy_(t)
        self.graph.replay()
        return pytree.tree_unflatten(
            [o.clone() if isinstance(o, torch.Tensor) else o for o in self.outputs], self.spec)


@dataclass
class GraphInfo:
    """What a graphed forward did: calls replayed, captured, run eagerly, graphs dropped as
    stale, and the signatures it refused (reason -> how many)."""

    replays: int = 0
    captures: int = 0
    eager: int = 0
    stale: int = 0
    graphs: int = 0
    refused: dict[str, int] = field(default_factory=dict)


class GraphedForward:
    """The forward :func:`dnnctl.torch.patch` installs with ``graphs=True``: ``inner`` (the
    patched forward) for calls no graph takes, a CUDA graph per signature for the others
    (see the module's doc)."""

    def __init__(self, model: nn.Module, inner: Any, max_graphs: int = MAX_GRAPHS) -> None:
        self.model, self.inner, self.max_graphs = model, inner, max_graphs
        self.graphs: OrderedDict[Any, _Graph] = OrderedDict()
        self.warm: dict[Any, int] = {}
        self.refused: dict[Any, str] = {}
        self.captured: set[Any] = set()  # every signature captured so far (a recapture of
        # one, after its model changed, is not a new one)
        self.stream: Any = None  # the side stream captures run on
        self.counts = GraphInfo()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # a compiled model: dynamo traces the forward
            return self.inner(*args, **kwargs)
        tensors = _tensors(self.model, args, kwargs)
        if tensors is _SKIP:
            return self.inner(*args, **kwargs)
        key = (arrays_key(tuple(tensors)), _scalars(args, kwargs), _settings())
        g = self.graphs.get(key)
        if g is not None:
            if _state(g.pairs, True) == g.state:
                self.counts.replays += 1
                if len(self.graphs) > 1:
                    self.graphs.move_to_end(key)
                return g.run(tensors)
            self.drop()  # the model changed since the capture: every graph is stale
            self.counts.stale += 1
        if key in self.refused:
            return self._eager(args, kwargs)
        n = self.warm.get(key, 0) + 1
        if n < WARM_CALLS:
            if len(self.warm) >= _MAX_WARM:  # (signatures seen once, kept within bounds)
                self.warm.clear()
            self.warm[key] = n
            return self._eager(args, kwargs)
        self.warm.pop(key, None)
        if len(self.captured) >= CAPTURE_LIMIT * self.max_graphs and key not in self.captured:
            # shapes that change from call to call: each capture costs a synchronize and
            # torch's empty_cache, and its graph would be dropped before it is used much
            self._refuse(key, f"{len(self.captured)} signatures captured already (the shapes "
                              f"change from call to call; max_graphs={self.max_graphs})")
            return self._eager(args, kwargs)
        return self._watched(key, tensors, args, kwargs)

    def _eager(self, args: tuple, kwargs: dict) -> Any:
        self.counts.eager += 1
        return self.inner(*args, **kwargs)

    def _watched(self, key: Any, tensors: list[torch.Tensor], args: tuple, kwargs: dict
                 ) -> Any:
        """The last eager call before the capture, checked for state a replay would not
        update; then the capture (its result is this call's)."""
        modules = _modules(self)
        if _hooked(modules):
            self._refuse(key, "a forward hook is registered on the model (its Python would "
                              "not run in a replay)")
            return self._eager(args, kwargs)
        pairs = _watch(self, modules)
        held = tuple(d.get(k) for d, k in pairs if k is not ...)  # (no identity reused)
        before = _state(pairs, False)
        versions = [-1 if t.is_inference() else t._version for t in tensors]
        # an inference tensor has no version counter: its values are compared instead
        copies = [t.clone() if t.is_inference() else None for t in tensors]
        out = self._eager(args, kwargs)
        if _state(pairs, False) != before:
            self._refuse(key, "the forward replaces a module, parameter, buffer or attribute "
                              "of the model")
        elif versions != [-1 if t.is_inference() else t._version for t in tensors] or any(
                c is not None and not torch.equal(c, t) for c, t in zip(copies, tensors)):
            self._refuse(key, "the forward writes into an input tensor")
        else:  # the state read before the call is the one the graph is captured against
            self._capture(key, tensors, args, kwargs, pairs, held)
        return out

    def _refuse(self, key: Any, reason: str) -> None:
        if len(self.refused) >= _MAX_WARM:
            self.refused.clear()
        self.refused[key] = reason
        self.counts.refused[reason] = self.counts.refused.get(reason, 0) + 1

    def _capture(self, key: Any, tensors: list[torch.Tensor], args: tuple, kwargs: dict,
                 pairs: tuple[tuple[dict, Any], ...], held: tuple[Any, ...]) -> None:
        statics = [torch.empty_strided(t.size(), t.stride(), dtype=t.dtype,
                                       device=t.device).copy_(t) for t in tensors]
        it = iter(statics)  # (the order of _tensors)
        s_args = tuple(next(it) if a.__class__ in _TENSOR_TYPES else a for a in args)
        s_kwargs = {k: next(it) if v.__class__ in _TENSOR_TYPES else v
                    for k, v in kwargs.items()}
        if self.stream is None or self.stream.device != tensors[0].device:
            self.stream = torch.cuda.Stream(tensors[0].device)
        graph = torch.cuda.CUDAGraph()
        cache = torch.is_autocast_cache_enabled()
        torch.set_autocast_cache_enabled(False)  # no cast cached across a capture's end
        try:
            with torch.cuda.graph(graph, stream=self.stream, capture_error_mode="thread_local"):
                out = self.inner(*s_args, **s_kwargs)
        except Exception as exc:  # noqa: BLE001 - any capture failure: the signature stays eager
            self._refuse(key, f"its capture failed: {type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:100] if str(exc) else ''}")
            return
        finally:
            torch.set_autocast_cache_enabled(cache)
        leaves, spec = pytree.tree_flatten(out)
        if len(self.graphs) >= self.max_graphs:
            torch.cuda.synchronize()  # (a dropped graph's pool is not freed under a replay)
            while len(self.graphs) >= self.max_graphs:
                self.graphs.popitem(last=False)
        self.graphs[key] = _Graph(graph, statics, leaves, spec, pairs, _state(pairs, True), held)
        self.captured.add(key)
        self.counts.captures += 1

    def drop(self) -> None:
        """Drop every graph (their memory goes back to torch's allocator); signatures are
        captured again after their eager calls."""
        if self.graphs:
            torch.cuda.synchronize()  # (a dropped graph's pool is not freed under a replay)
        self.graphs.clear()
        self.warm.clear()
        self.refused.clear()

    def info(self) -> GraphInfo:
        """The counts so far, with the reasons of the refused signatures."""
        self.counts.graphs = len(self.graphs)
        return self.counts

    @property
    def __code__(self) -> Any:
        """The forward underneath's code object (torch.export names its trace after it)."""
        inner = self.inner
        return getattr(inner, "__code__", None) or getattr(
            getattr(inner, "__func__", None), "__code__", None)

    @property
    def __signature__(self) -> Any:
        """The forward underneath's signature (inspect.signature reads it)."""
        import inspect

        try:
            return inspect.signature(self.inner)
        except (TypeError, ValueError):
            return None

    def __reduce__(self) -> Any:  # pickled as the forward underneath (see patch)
        return operator.getitem, ((self.inner,), 0)  # (as patch._pickled_as: no dnnctl name)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        import copy

        new = memo.get(id(self.model))
        if new is None:  # copied without its model: the same forward
            return self
        return GraphedForward(new, copy.deepcopy(self.inner, memo), self.max_graphs)


def info(model: nn.Module) -> GraphInfo | None:
    """What a model patched with ``graphs=True`` did with CUDA graphs: calls replayed,
    captured and run eagerly, graphs dropped as stale, signatures refused and why (None: not
    patched with ``graphs=True``); ``dnnctl.torch.graph_info``."""
    fn = model.__dict__.get("forward")
    return fn.info() if isinstance(fn, GraphedForward) else None


def _tensors(model: nn.Module, args: tuple, kwargs: dict) -> Any:
    """The call's tensors in pytree order, or _SKIP for a call no graph takes."""
    if model.training or torch.is_grad_enabled() or torch.compiler.is_compiling():
        return _SKIP
    tensors: list[torch.Tensor] = []
    for a in (*args, *kwargs.values()):
        if a.__class__ in _TENSOR_TYPES:
            if a.device.type != "cuda" or a.layout != torch.strided:
                return _SKIP
            tensors.append(a)
        elif a.__class__ not in _PLAIN and not _plain_tuple(a):
            return _SKIP  # (lists, dicts, objects: their contents are not in the signature)
    if not tensors or torch.cuda.is_current_stream_capturing():
        return _SKIP
    return tensors


def _plain_tuple(a: Any) -> bool:
    return a.__class__ is tuple and all(e.__class__ in _PLAIN for e in a)


def _scalars(args: tuple, kwargs: dict) -> tuple:
    """The call's other arguments, by position / name (a tensor stands as a marker)."""
    return (tuple(None.__class__ if isinstance(a, torch.Tensor) else a for a in args),
            tuple((k, None.__class__ if isinstance(v, torch.Tensor) else v)
                  for k, v in kwargs.items()))


def _settings() -> tuple:
    """What steers the kernels a forward runs, outside its arguments."""
    plan = active_plan()
    b = torch.backends
    return (torch.is_inference_mode_enabled(), torch.is_autocast_enabled("cuda"),
            torch.get_autocast_dtype("cuda"), torch.cuda.current_device(), id(plan),
            getattr(plan, "generation", 0), generation(), deterministic_only(),
            torch.are_deterministic_algorithms_enabled(), b.cudnn.enabled, b.cudnn.benchmark,
            b.cudnn.deterministic, b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32,
            b.cuda.flash_sdp_enabled(), b.cuda.mem_efficient_sdp_enabled(),
            b.cuda.math_sdp_enabled(), b.cuda.cudnn_sdp_enabled())


_HOOKS = ("_forward_hooks", "_forward_pre_hooks")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks")


def _modules(graphed: GraphedForward) -> list[nn.Module]:
    """The model's modules and those of the traced graph patch runs (its fused chains)."""
    roots = [graphed.model]
    gm = getattr(graphed.inner, "gm", None)
    if isinstance(gm, nn.Module):
        roots.append(gm)
    seen: dict[int, nn.Module] = {}
    for root in roots:
        for m in root.modules():
            seen.setdefault(id(m), m)
    return list(seen.values())


def _hooked(modules: list[nn.Module]) -> bool:
    """A forward (pre-)hook on one of ``modules``, or a global one."""
    return any(getattr(torch_module, h, None) for h in _GLOBAL_HOOKS) or any(
        m.__dict__.get(h) for m in modules for h in _HOOKS)


def _watch(graphed: GraphedForward, modules: list[nn.Module] | None = None
           ) -> tuple[tuple[dict, Any], ...]:
    """(dict, key) for everything of the model a captured forward read: each module's
    public attributes, parameters, buffers and submodules (and each such dict's size, and
    its forward hooks' count), of the model and of the traced graph patch runs, the global
    forward hooks' counts, and the forward underneath itself."""
    pairs: list[tuple[dict, Any]] = [(graphed.__dict__, "inner")]
    pairs.extend((getattr(torch_module, h), ...) for h in _GLOBAL_HOOKS
                 if isinstance(getattr(torch_module, h, None), dict))
    for m in _modules(graphed) if modules is None else modules:
        d = m.__dict__
        pairs.append((d, ...))
        pairs.extend((d, k) for k in d if k[0] != "_")
        pairs.extend((d[h], ...) for h in _HOOKS if isinstance(d.get(h), dict))
        for name in ("_parameters", "_buffers", "_modules"):
            sub = d.get(name)
            if isinstance(sub, dict):
                pairs.append((sub, ...))
                pairs.extend((sub, k) for k in sub)
    return tuple(pairs)


def _state(pairs: tuple[tuple[dict, Any], ...], versions: bool) -> Any:
    """What ``pairs`` hold now: packed by the replay extension where it is loaded, else a
    tuple made in Python (the same information)."""
    packed = replay.STATE
    if packed is not None:
        return packed(pairs, versions)
    out = []
    for d, k in pairs:
        if k is ...:
            out.append(len(d))
            continue
        v = d.get(k, _SKIP)
        if v is _SKIP:  # (no value there)
            out.append(0)
        elif isinstance(v, torch.Tensor):
            ver = v._version if versions and not v.is_inference() else 0
            out.append((id(v), v.data_ptr() if v.layout == torch.strided else 0, ver))
        else:
            out.append(id(v))
    return tuple(out)
