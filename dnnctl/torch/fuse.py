"""Fusion over a torch.fx graph: conv -> [bn] -> [act] -> [+ residual] (or conv -> [bn] ->
+ residual -> act, a ResNet block's end), linear -> act, and a BatchNorm not folded into a
convolution -> ReLU (batch_norm's fused ReLU: training mode, pre-activation blocks).

A chain becomes one ``dnnctl::conv2d`` (BatchNorm folded into the weights and bias in
inference, the activation and the residual add in the epilogue: ``res + act(conv + b)``) or
one ``dnnctl::linear`` with its activation. In training mode activations stay separate ops
(their backward reads the saved pre-activation instead of recomputing the product). Only chains whose intermediate values have no
other user are fused, so the graph computes what the model computes.
"""

from __future__ import annotations

import functools
import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.nn.modules import module as _nn_module

from dnnctl.ops.conv2d.function import _CONV2D_CL
from dnnctl.ops.conv2d.geom import output_size
from dnnctl.torch._tensors import is_nhwc
from dnnctl.torch.geometry import CONV_ATTRS, Geometry, conv1d_geometry, conv_args
from dnnctl.torch.kernels import plan_of
from dnnctl.torch.library import autocast_active, direct_ok, run_op
from dnnctl.torch.modules import act_call, act_of, base_type, bn_fwd, conv1d_as_2d, linear_call
from dnnctl.torch.native import Direct
from dnnctl.torch.reference import ACTS
from dnnctl.torch.report import Fusion
from dnnctl.torch.trace import MODE_CHANGES

# activations the conv / matmul epilogues take (gelu: the erf form); the conv epilogue also
# takes MobileNet's relu6 / hardswish
EPILOGUE_ACTS = {"relu", "gelu", "silu"}
CONV_EPILOGUE_ACTS = EPILOGUE_ACTS | {"relu6", "hardswish"}
_FN_ACTS = {F.relu: "relu", torch.relu: "relu", F.silu: "silu", F.gelu: "gelu",
            F.relu6: "relu6", F.hardswish: "hardswish"}
_ADDS = {operator.add, operator.iadd, torch.add}


def _version(t: torch.Tensor | None) -> int:
    if t is None:
        return -1
    try:
        return t._version
    except RuntimeError:  # an inference tensor has no version counter (and cannot change)
        return 0


class FusedConv(nn.Module):
    """conv [-> bn folded] [-> act] [-> + residual] as one dnnctl::conv2d call (a Conv1d
    [-> BatchNorm1d] as conv2d over (N, C, 1, L) views).

    A submodule of the traced graph (conv and bn its own submodules, the fold an eager call
    keeps its buffers; a compiled graph folds in the graph), not a plain object the graph's
    code closes over: torch.compile guards an unchanged module's attributes and buffers at
    the cost of one dictionary check (on torch 2.11, ResNet-50's 53 fused convs as closures
    took its guards from 46 to 216 us a call), which a host-bound compiled model pays on
    every call."""

    def __init__(self, conv: nn.Conv2d | nn.Conv1d, bn: nn.BatchNorm2d | nn.BatchNorm1d | None,
                 act: str, handle: int, residual_before_act: bool = False,
                 keep_dtype: bool = False) -> None:
        super().__init__()
        self.conv, self.bn = conv, bn
        self.act, self.handle = act, handle
        self.one_d = base_type(conv) is nn.Conv1d  # (a parametrized Conv1d too)
        # act(conv + residual) instead of act(conv) + residual
        self.residual_before_act = residual_before_act
        # the add was in place (``out += identity``): the sum keeps the conv's dtype, as
        # eager's does under autocast with a float32 residual stream
        self.keep_dtype = keep_dtype
        self._stamp: tuple[Any, ...] | None = None  # the staleness stamp of the buffers
        self._fit = _LastFit()
        # the op's stride, padding and dilation: made again when the conv's are replaced
        self._geom = Geometry(CONV_ATTRS, conv_args)
        # eager inference calls of channels-last tensors: straight to the conv site's
        # replay Program once the Python path has recorded one (see native.Direct)
        self._direct = Direct()
        self.register_buffer("folded_weight", None, persistent=False)
        self.register_buffer("folded_bias", None, persistent=False)

    def _folded(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        mods = self._modules  # (nn.Module.__getattr__ costs ~0.4 us a lookup)
        conv, bn = mods["conv"], mods.get("bn")
        if bn is None:
            return conv.weight, conv.bias
        if torch.compiler.is_compiling():
            # traced: the graph folds the parameters as they are at each call (with
            # autograd where it is on). A fold kept from outside the graph stays what it
            # was when taken, whatever load_state_dict, an EMA update, .to() or fine-tuning
            # made of the weights since: no eager code runs between compiled calls to
            # refresh it. torch._inductor.config.freezing = True computes the fold once,
            # at compile time, for models whose weights no longer change
            return fold_bn(conv, bn)
        if torch.is_grad_enabled() and _needs_grad(conv, bn):
            # an eval-mode model that back-propagates (frozen-BN fine-tuning, saliency,
            # adversarial inputs): fold with autograd, so conv and BN parameters get
            # gradients
            return fold_bn(conv, bn)
        # cheap staleness check: in-place updates bump versions; .to() / .half() / a
        # ``.data =`` assignment move a tensor's storage (keeping its version). The
        # modules' own dicts, not their attributes: nn.Module.__getattr__ costs ~0.4 us a
        # lookup, six per call
        cp, bp, bb = conv._parameters, bn._parameters, bn._buffers
        w = cp.get("weight")
        if w is None:  # parametrized (weight_norm, spectral_norm): a property computed on
            # every read, so folded on every call (with autograd where grad is on), as
            # eager computes it
            return fold_bn(conv, bn)
        stamp = (_stamp(w, cp.get("bias"), bp.get("weight"), bp.get("bias"),
                        bb.get("running_mean"), bb.get("running_var")), bn.eps)
        mine = self._buffers
        if self._stamp != stamp:
            # normal tensors even inside inference_mode: the fold is kept, and a later call
            # with autograd (an input that requires grad: saliency) saves it for backward,
            # which an inference tensor cannot be
            with torch.inference_mode(False), torch.no_grad():
                w, b = fold_bn(conv, bn)
            self._stamp = stamp
            mine["folded_weight"], mine["folded_bias"] = w, b
        return mine["folded_weight"], mine["folded_bias"]

    def fold_now(self) -> None:
        """Fold now, without autograd (at patch time): the first eager call reads the kept
        fold as every later one does (torch.jit.trace runs the model twice and wants the
        same graph from both runs)."""
        if self._modules.get("bn") is not None:
            with torch.no_grad():
                self._folded()

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        mods = self._modules
        conv, bn = mods["conv"], mods.get("bn")
        one_d = self.one_d
        if bn is not None and (bn.training or (one_d and x.dim() == 2)):
            # switched to training: no folding; an unbatched (C, L) conv1d output is
            # (batch, features) to BatchNorm1d, not channels
            y = bn(conv(x))
            if self.residual_before_act and residual is not None:
                return ACTS[self.act](y + residual)
            y = ACTS[self.act](y)
            return y if residual is None else y + residual
        w, b = self._folded()
        if one_d:  # conv2d over (N, C, 1, L) views, as the Conv1d module route
            geom = conv1d_geometry(conv)
            if residual is not None and not self._fits(residual, x, w, *geom):
                return self._broadcast_add(conv1d_as_2d(
                    x, w, b, geom, conv.groups, self._act_before_add(), None, self.handle),
                    residual)
            return conv1d_as_2d(x, w, b, geom, conv.groups, self.act, residual, self.handle)
        compiling = torch.compiler.is_compiling()
        # traced: the geometry read from the module as its own forward reads it (the guards
        # a compiled eager model has), no cache to guard as well
        stride, pad, dil = conv_args(conv) if compiling else self._geom.eager_of(conv)
        if residual is not None and not self._fits(residual, x, w, stride, pad, dil):
            return self._broadcast_add(run_op("conv2d", x, w, b, stride, pad, dil, conv.groups,
                                              self._act_before_add(), None, self.handle),
                                       residual)
        if not compiling and x.is_cuda and direct_ok(x, w, b, residual):
            return self._direct_call(x, w, b, residual, stride, pad, dil, conv.groups)
        y = run_op("conv2d", x, w, b, stride, pad, dil, conv.groups, self.act, residual,
                   self.handle, self.residual_before_act)
        return self._dtype_of(y, x, residual)

    def _fits(self, residual: torch.Tensor, x: torch.Tensor, w: torch.Tensor, *geom: Any) -> bool:
        """:func:`_fits`, kept for the last shapes seen (an eager call: ~0.3 us, not 2.5;
        a traced one computes it each time, so torch.jit.trace records the same sizes in
        both of its runs)."""
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            return _fits(residual, x, w, *geom)
        last, key = self._fit, (x.shape, residual.shape, w.shape, geom)
        if last.key != key:
            last.key, last.ok = key, _fits(residual, x, w, *geom)
        return last.ok

    def _act_before_add(self) -> str:
        return "none" if self.residual_before_act else self.act

    def _broadcast_add(self, y: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """The chain's add of a tensor of another shape, which broadcasts (a time embedding's
        ``[:, :, None, None]``, a bias map): no residual the epilogue takes, so torch's add
        after the convolution, as eager's (the activation after it where it was)."""
        total = y + other
        if self.keep_dtype:  # ``out += other``: in place, out's dtype
            total = total.to(y.dtype)
        return ACTS[self.act](total) if self.residual_before_act else total

    def _direct_call(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                     residual: torch.Tensor | None, stride: tuple[int, ...],
                     pad: tuple[int, ...], dil: tuple[int, ...], groups: int) -> torch.Tensor:
        """An eager inference call: the conv site's replay Program where this key has
        one (the arrays and scalars kernels.conv2d gives conv2d_channels_last for a
        channels-last x), else the Python path, after which the site is looked up."""
        k = (x.shape, x.stride(), x.dtype, x.device, w.stride(), w.dtype, b is None,
             None if residual is None else (residual.shape, residual.stride(), residual.dtype))
        arrays = (x, w, b, residual)
        y = self._direct.run(k, arrays, plan_of(self.handle))
        if y is not None:
            return self._dtype_of(y.permute(0, 3, 1, 2), x, residual)
        y = run_op("conv2d", x, w, b, stride, pad, dil, groups, self.act, residual,
                   self.handle, self.residual_before_act)
        if is_nhwc(x):
            self._direct.learn(k, _CONV2D_CL, arrays,
                               (stride, pad, dil, groups,
                                None if self.act == "none" else self.act, "NHWC", False,
                                bool(self.residual_before_act)))
        return self._dtype_of(y, x, residual)

    def _dtype_of(self, y: torch.Tensor, x: torch.Tensor,
                  residual: torch.Tensor | None) -> torch.Tensor:
        if self.keep_dtype and residual is not None:
            want = _conv_dtype(x)
            if y.dtype != want:
                y = y.to(want)
        return y


class _LastFit:
    """The shapes of a FusedConv's last call with a residual, and whether the residual fit
    the epilogue. An object of its own, not attributes of the module: torch.jit.trace's check
    compares the module's attribute types after two calls."""

    __slots__ = ("key", "ok")

    def __init__(self) -> None:
        self.key: tuple[Any, ...] | None = None
        self.ok = True


def _fits(residual: torch.Tensor, x: torch.Tensor, w: torch.Tensor, stride: Any, pad: Any,
          dil: Any) -> bool:
    """``residual`` has the shape of conv2d(x, w) (x (N, C, H, W) or (C, H, W)) or, with a
    3-D w, of the conv1d over x's last dimension, so the epilogue takes it."""
    if w.dim() == 3:  # conv1d: (N, C, L) as (N, C, 1, L)
        h, k = 1, (1, w.shape[2])
        spatial = 1
    else:
        h, k = x.shape[-2], (w.shape[2], w.shape[3])
        spatial = 2
    p, q = output_size(h, x.shape[-1], k[0], k[1], stride, pad, dil)
    out = (*x.shape[:-1 - spatial], w.shape[0], *((p, q) if spatial == 2 else (q,)))
    return tuple(residual.shape) == out


def _conv_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype eager's convolution of x returns: autocast's where it is on."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if autocast_active(dev) else x.dtype


def _needs_grad(*modules: nn.Module) -> bool:
    """A parameter of the modules requires grad (a parametrized weight's originals, held
    by the module's ``parametrizations``, included)."""
    return any(p.requires_grad for m in modules for p in m.parameters())


def _stamp(w: torch.Tensor, *rest: torch.Tensor | None) -> tuple[Any, ...]:
    """What changes when the fold's inputs do: w's storage, dtype and version, and each
    other tensor's version and storage (``.data =`` keeps the version, moves the storage).
    Read directly (~70 ns a read); an inference tensor, which has no version, through
    :func:`_version`."""
    b, g, beta, rm, rv = rest
    try:
        return (w.data_ptr(), w.dtype, w._version,
                None if b is None else (b._version, b.data_ptr()),
                None if g is None else (g._version, g.data_ptr()),
                None if beta is None else (beta._version, beta.data_ptr()),
                rm._version, rm.data_ptr(), rv._version, rv.data_ptr())
    except (RuntimeError, AttributeError):
        return (w.data_ptr(), w.dtype, _version(w),
                *((_version(t), None if t is None else t.data_ptr()) for t in rest))


def fold_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) of conv followed by inference BatchNorm, computed in float32
    (float64 for a float64 weight). Each parameter is read once: a parametrized one
    (spectral_norm in training runs a power iteration on each read) is computed once."""
    weight, conv_bias = conv.weight, conv.bias
    acc = torch.promote_types(weight.dtype, torch.float32)
    bn_weight, bn_bias = bn.weight, bn.bias
    scale = torch.rsqrt(bn.running_var.to(acc) + bn.eps)
    if bn_weight is not None:
        scale = scale * bn_weight.to(acc)
    shift = -bn.running_mean.to(acc) * scale
    if bn_bias is not None:
        shift = shift + bn_bias.to(acc)
    if conv_bias is not None:
        shift = shift + conv_bias.to(acc) * scale
    w = weight.to(acc) * scale.reshape(-1, *[1] * (weight.dim() - 1))
    fmt = (torch.channels_last if weight.dim() == 4
           and weight.is_contiguous(memory_format=torch.channels_last)
           and not weight.is_contiguous() else torch.contiguous_format)
    return w.to(weight.dtype).contiguous(memory_format=fmt), shift.to(weight.dtype)


class FusedLinear(nn.Module):
    """linear -> act as one dnnctl::linear call (a submodule of the traced graph, as
    :class:`FusedConv`)."""

    def __init__(self, linear: nn.Linear, act: str, handle: int) -> None:
        super().__init__()
        self.linear, self.act, self.handle = linear, act, handle
        self._direct = Direct()  # (see FusedConv)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lin = self._modules["linear"]
        return linear_call(self._direct, x, lin.weight, lin.bias, self.act, self.handle)


def hooked(m: nn.Module) -> bool:
    """The module has forward (pre-)hooks: a feature extractor or Grad-CAM reads them, and
    pruning / the old weight_norm recompute ``weight`` in a pre-hook. A fused chain never
    calls its modules, so such a module is left out of every fusion."""
    return bool(m._forward_hooks or m._forward_pre_hooks or
                getattr(m, "_forward_hooks_with_kwargs", None))


def _single_user(node: fx.Node, blocks: dict[fx.Node, int]) -> fx.Node | None:
    """node's only user, if it has one and it is in node's mode block (see :func:`_blocks`)."""
    users = list(node.users)
    if len(users) != 1 or blocks.get(users[0], -1) != blocks.get(node, -2):
        return None
    return users[0]


def _blocks(graph: fx.Graph) -> dict[fx.Node, int]:
    """Each node's mode block: how many grad-mode / autocast switches precede it (see
    trace.MODE_CHANGES). A chain fuses within one block only: the fused op runs where the
    chain's last node was, in that node's modes (a conv under ``no_grad`` and its ReLU after
    the block fused would give the conv's weights gradients)."""
    blocks, block = {}, 0
    for n in graph.nodes:
        if n.op == "call_function" and n.target in MODE_CHANGES:
            block += 1
        blocks[n] = block
    return blocks


def _act_node(node: fx.Node, modules: dict[str, nn.Module], conv: bool) -> str | None:
    """The epilogue activation a node applies to its first argument, if any (``conv``: the
    head is a convolution, whose epilogue takes more activations than the GEMM's)."""
    takes = CONV_EPILOGUE_ACTS if conv else EPILOGUE_ACTS
    if node.op == "call_module":
        if hooked(modules[node.target]):
            return None
        found = act_of(modules[node.target])
        if found is None or found[0] not in takes:
            return None
        if found[0] == "gelu" and found[1] != ("none",):
            return None
        return found[0]
    if node.op == "call_function" and node.target in _FN_ACTS:
        if node.kwargs.get("approximate", "none") != "none" or node.kwargs.get("inplace"):
            return None
        if len(node.args) != 1 or _FN_ACTS[node.target] not in takes:
            return None
        return _FN_ACTS[node.target]
    return None


def fuse_graph(gm: fx.GraphModule, covered: set[str], fold_bn_ok: bool, handle: int,
               calls: dict[str, int]) -> list[Fusion]:
    """Rewrite gm's graph in place; ``covered``: module names dnnctl runs; ``calls``: how
    often each module is called in the graph (a shared module is not fused)."""
    modules = dict(gm.named_modules())
    graph = gm.graph
    blocks = _blocks(graph)
    fusions: list[Fusion] = []
    for node in list(graph.nodes):
        if node.op != "call_module" or node.target not in covered or calls[node.target] != 1:
            continue
        head = modules[node.target]
        kind = base_type(head)  # a parametrized conv's weight is computed on each read
        if kind not in (nn.Conv2d, nn.Conv1d, nn.Linear) or len(node.args) != 1 \
                or node.kwargs \
                or hooked(head):
            continue
        chain, folded, parts = [node], [], []
        bn = None
        cur = node
        nxt = _single_user(cur, blocks)
        is_conv = kind is not nn.Linear
        bn_type = nn.BatchNorm1d if kind is nn.Conv1d else nn.BatchNorm2d
        if (is_conv and fold_bn_ok and nxt is not None
                and nxt.op == "call_module" and type(modules[nxt.target]) is bn_type
                and nxt.target in covered and calls[nxt.target] == 1
                and not hooked(modules[nxt.target])
                and not modules[nxt.target].training and nxt.args[0] is cur):
            bn = modules[nxt.target]
            chain.append(nxt)
            folded.append(nxt.target)
            parts.append("bn")
            cur, nxt = nxt, _single_user(nxt, blocks)
        act = "none"
        # training: no activation in the epilogue (its gradient would need the
        # pre-activation, recomputed by a second conv / GEMM; the separate op saves it)
        if fold_bn_ok and nxt is not None and nxt.args and nxt.args[0] is cur:
            found = _act_node(nxt, modules, is_conv)
            if found is not None:  # activation modules are stateless: shared ones fuse too
                act = found
                chain.append(nxt)
                if nxt.op == "call_module":
                    folded.append(nxt.target)
                parts.append(found)
                cur, nxt = nxt, _single_user(nxt, blocks)
        residual = None
        # ``h += conv(x)`` mutates h (code may read it later): only ``conv(x) += r``, whose
        # left side is the chain's own value, fuses
        if (is_conv and nxt is not None and nxt.op == "call_function"
                and nxt.target in _ADDS and not nxt.kwargs and len(nxt.args) == 2
                and (nxt.target is not operator.iadd or nxt.args[0] is cur)):
            other = nxt.args[1] if nxt.args[0] is cur else nxt.args[0]
            if other is not cur and isinstance(other, fx.Node) and cur in nxt.args:
                residual = other
                chain.append(nxt)
                parts.append("residual")
                cur, nxt = nxt, _single_user(nxt, blocks)
        before = False
        # relu(bn(conv(x)) + identity): the activation after the add joins the epilogue
        # (inference only, as above; a 2-D conv)
        if (residual is not None and act == "none" and fold_bn_ok and kind is nn.Conv2d
                and nxt is not None and nxt.args and nxt.args[0] is cur):
            found = _act_node(nxt, modules, is_conv)
            if found is not None:
                act, before = found, True
                chain.append(nxt)
                if nxt.op == "call_module":
                    folded.append(nxt.target)
                parts.append(found)
        if len(chain) == 1:
            continue
        last = chain[-1]
        if is_conv:
            inplace = residual is not None and chain[-1 - int(before)].target is operator.iadd
            fn: Any = FusedConv(head, bn, act, handle, before, inplace)
            fn.fold_now()
            args = (node.args[0],) if residual is None else (node.args[0], residual)
        else:
            fn = FusedLinear(head, act, handle)
            args = (node.args[0],)
        name = add_submodule(gm, node.target, fn, modules)
        with graph.inserting_before(last):
            new = graph.call_module(name, args)
        last.replace_all_uses_with(new)
        for n in reversed(chain):
            graph.erase_node(n)
        fusions.append(Fusion(node.target, folded, parts))
    fusions += _bn_relu_chains(gm, modules, covered, handle, calls, blocks)
    _out_of_place_acts(gm, modules, covered, handle)
    _route_modules(gm, modules, covered)
    graph.lint()
    gm.recompile()
    return fusions


class Routed(nn.Module):
    """A covered module's dnnctl forward (the ``functools.partial`` patch gave it) as a
    submodule of the traced graph: the module itself a registered submodule, the forward's
    other arguments (handle, geometry, names) plain attributes. The graph calling the module
    would make torch.compile guard the partial held in the module's instance dictionary, its
    arguments and the module's identity through them on every call (what a module's own
    attributes cost in one dictionary check); a module with hooks is still called itself,
    so its hooks run."""

    def __init__(self, mod: nn.Module, fn: functools.partial) -> None:
        super().__init__()
        self.mod = mod
        args = fn.args
        self.takes_module = bool(args) and args[0] is mod
        self.fn = fn.func
        self.rest = tuple(args[1:] if self.takes_module else args)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        m = self._modules["mod"]
        mm = _nn_module  # torch's global module hooks, read in place (no call a forward)
        if (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or m._backward_pre_hooks or mm._global_forward_hooks
                or mm._global_forward_pre_hooks or mm._global_backward_hooks
                or mm._global_backward_pre_hooks):
            return m(*args, **kwargs)
        if kwargs:
            if self.takes_module:
                return self.fn(m, *self.rest, *args, **kwargs)
            return self.fn(*self.rest, *args, **kwargs)
        if self.takes_module:
            return self.fn(m, *self.rest, *args)
        return self.fn(*self.rest, *args)


class FusedBnAct(nn.Module):
    """BatchNorm2d -> [+ residual] -> ReLU as one dnnctl batch_norm call with its fused
    residual and ReLU (training: batch statistics, running statistics updated; eval: the
    running ones), which a BatchNorm not folded into a convolution takes: every one of a
    model in training mode (ResNet's bn -> relu, and its block end relu(bn + identity)),
    pre-activation blocks in eval. The backward recomputes the ReLU's mask from x (and the
    residual), so neither the add's and ReLU's passes nor the ReLU's backward pass run."""

    def __init__(self, bn: nn.BatchNorm2d, handle: int, residual: bool = False) -> None:
        super().__init__()
        self.bn, self.handle, self.residual = bn, handle, residual

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        # the submodule from the dict (nn.Module.__getattr__ costs ~0.5 us a read)
        bn = self._modules["bn"]
        if residual is not None and residual.shape != x.shape:
            # an add that broadcasts (see FusedConv._broadcast_add): torch's, then the ReLU
            return F.relu(bn_fwd(bn, self.handle, x) + residual)
        return bn_fwd(bn, self.handle, x, "relu", residual)


def _residual_add(node: fx.Node, cur: fx.Node) -> fx.Node | None:
    """The other operand when ``node`` adds it to ``cur`` (out of place, or ``cur += r``,
    which mutates only cur's own fresh value), else None."""
    if (node.op != "call_function" or node.target not in _ADDS or node.kwargs
            or len(node.args) != 2 or cur not in node.args):
        return None
    if node.target is operator.iadd and node.args[0] is not cur:
        return None
    other = node.args[1] if node.args[0] is cur else node.args[0]
    return other if isinstance(other, fx.Node) and other is not cur else None


def _bn_relu_chains(gm: fx.GraphModule, modules: dict[str, nn.Module], covered: set[str],
                    handle: int, calls: dict[str, int],
                    blocks: dict[fx.Node, int]) -> list[Fusion]:
    """Rewrite each BatchNorm2d that dnnctl runs, called once, whose only user is a ReLU of
    its output (module or function), or an add whose only user is such a ReLU, into one
    :class:`FusedBnAct` call."""
    graph = gm.graph
    fusions: list[Fusion] = []
    for node in list(graph.nodes):
        if (node.op != "call_module" or node.target not in covered
                or calls[node.target] != 1 or len(node.args) != 1 or node.kwargs):
            continue
        bn = modules[node.target]
        if type(bn) is not nn.BatchNorm2d or hooked(bn):
            continue
        nxt, cur, residual, add = _single_user(node, blocks), node, None, None
        if nxt is not None and (residual := _residual_add(nxt, node)) is not None:
            add, cur, nxt = nxt, nxt, _single_user(nxt, blocks)
        if nxt is None or len(nxt.args) != 1 or nxt.args[0] is not cur:
            continue
        if _act_node(nxt, modules, True) != "relu":
            continue
        name = add_submodule(gm, node.target, FusedBnAct(bn, handle, residual is not None),
                             modules)
        with graph.inserting_before(nxt):
            new = graph.call_module(name, (node.args[0],) if residual is None
                                    else (node.args[0], residual))
        nxt.replace_all_uses_with(new)
        folded = [nxt.target] if nxt.op == "call_module" else []
        for n in (nxt, add, node):
            if n is not None:
                graph.erase_node(n)
        parts = ["relu"] if residual is None else ["residual", "relu"]
        fusions.append(Fusion(node.target, folded, parts))
    return fusions


def _route_modules(gm: fx.GraphModule, modules: dict[str, nn.Module],
                   covered: set[str]) -> None:
    """Each graph call of a covered module whose forward is a partial (patch's, which
    binds positional arguments only): a call of its :class:`Routed` submodule instead (one
    per module, shared by its calls)."""
    routed: dict[str, str] = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or node.target not in covered:
            continue
        m = modules.get(node.target)
        fn = None if m is None else m.__dict__.get("forward")
        if not isinstance(fn, functools.partial) or fn.keywords:
            continue
        name = routed.get(node.target)
        if name is None:
            name = routed[node.target] = add_submodule(gm, node.target, Routed(m, fn),
                                                       modules)
        node.target = name


_FRESH_FNS = {operator.add, operator.sub, operator.mul, torch.add, torch.sub, torch.mul}


def _fresh(node: Any, covered: set[str]) -> bool:
    """The node's value is a tensor of its own that nothing else refers to: the result of a
    module dnnctl runs, of a fused chain, of an out-of-place arithmetic op, or an in-place
    add into such a value that nothing else reads."""
    if not isinstance(node, fx.Node) or node.op not in ("call_module", "call_function"):
        return False
    if node.op == "call_module":
        return node.target in covered
    if getattr(node.target, "dnnctl_fused", None) is not None:
        return True
    if node.target in _FRESH_FNS:
        return "out" not in node.kwargs
    if node.target is operator.iadd:
        lhs = node.args[0]
        return isinstance(lhs, fx.Node) and len(lhs.users) == 1 and _fresh(lhs, covered)
    return False


def _out_of_place_acts(gm: fx.GraphModule, modules: dict[str, nn.Module], covered: set[str],
                       handle: int) -> None:
    """An ``inplace=True`` activation module whose input is a fresh value read by nothing
    else (ResNet's ``bn -> ReLU(inplace=True)`` in training) runs out of place: no one can
    see the difference, and it saves the copy back into the input (a :class:`Routed`
    submodule per module, shared by its out-of-place calls)."""
    graph = gm.graph
    routed: dict[str, str] = {}
    for node in list(graph.nodes):
        if node.op != "call_module" or node.target not in covered:
            continue
        m = modules[node.target]
        if not getattr(m, "inplace", False) or hooked(m) or len(node.args) != 1 or node.kwargs:
            continue
        src = node.args[0]
        if not (isinstance(src, fx.Node) and len(src.users) == 1 and _fresh(src, covered)):
            continue
        name = routed.get(node.target)
        if name is None:
            fn = act_call(m, handle, inplace=False)
            if fn is None:
                continue
            name = routed[node.target] = add_submodule(gm, node.target + "_out_of_place",
                                                       Routed(m, fn), modules)
        node.target = name


def add_submodule(gm: fx.GraphModule, target: str, module: nn.Module,
                  modules: dict[str, nn.Module] | None = None) -> str:
    """Add ``module`` to gm under a name made of ``target`` (``dnnctl_layer1_0_conv1``, or
    ``..._2``, ``..._3`` where taken), and to ``modules`` (the passes look up every
    call_module node's module there: a conv whose output is a later fused chain's residual
    has that chain's node as its user); returns the name."""
    base = "dnnctl_" + target.replace(".", "_")
    name, i = base, 1
    while hasattr(gm, name):
        i += 1
        name = f"{base}_{i}"
    gm.add_submodule(name, module)
    if modules is not None:
        modules[name] = module
    return name
