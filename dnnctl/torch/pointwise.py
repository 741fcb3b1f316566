"""Pointwise fusion: a chain of elementwise torch ops in a patched model's traced graph runs
as one generated CUDA kernel (inference).

What eager torch launches one kernel per op for - a rotary embedding (``x * cos +
cat([-x2, x1]) * sin``: ten kernels for q and k, two casts of the tables), a hand-written
RMSNorm's tail (``x * rsqrt(var + eps) * w``), QuickGELU (``x * sigmoid(1.702 * x)``), a
layer scale, ``silu(a) * b`` - becomes one launch that reads each input once and writes
the result once. In a decode step, where every kernel is a few microseconds of launch and
tail, and in a prefill, where each op of the chain reads and writes the whole activation,
that is time torch.compile's inductor saves by the same means; this does it without a
compile step.

**What fuses.** A group is a tree of eligible nodes ending at one root (the value the rest of
the graph reads): add / sub / mul / div (tensors or Python numbers, no ``alpha`` /
``rounding_mode``), neg, relu, silu, sigmoid, tanh, gelu (erf or tanh form), exp, sqrt,
rsqrt, abs, pow with a constant exponent, casts between float16 / bfloat16 / float32
(``.to(dtype)``, ``.float()``, ``.half()``, ``.bfloat16()``), slices of a tensor
(``x[..., a:b]``, step 1) and ``torch.cat`` of eligible values. A producer joins the group of
each eligible consumer it has (a cheap value read by two chains, the rotary tables' cast, is
computed in both); one with another kind of user stays an op of its own, which the group
reads. Views (transpose, view, unsqueeze), reductions and module calls are the group's
inputs, read through their strides and broadcast as torch broadcasts.

**What a call does.** The group keeps its original ops as a graph (``sub``). A call runs
them as they are unless it can run the kernel: CUDA tensors of float16 / bfloat16 / float32
on the current device, no autograd wanted (grad off, or no input that requires it), not
under torch.compile (inductor fuses the same ops itself) and sizes under 2**31. Per call
signature (the tensors' shapes, strides, dtypes, the scalars' values) the ops run once on
meta tensors: that gives every value's shape and dtype, and the output's shape, dtype and
strides exactly as eager would make them (an output laid out as its transposed input, as
TensorIterator does). The kernel computes in float32 and rounds each value to its own
dtype, as eager rounds each op's result: results match eager's up to the last bit of a
transcendental function. Kernels are generated per structure (ops, dtypes, ranks, broadcast
pattern, output layout), sizes and strides passed at launch, so a new sequence length
launches the same kernel.

The same generated code renders as Python (:mod:`dnnctl.torch.pointwise_render`), which the
unit tests run element by element on CPU tensors against the original ops.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.interpreter import Interpreter

from dnnctl.torch.fuse import add_submodule
from dnnctl.torch.library import any_autocast, plain_eager
from dnnctl.torch.pointwise_render import C_TYPES, cuda_source
from dnnctl.torch.trace import MODE_CHANGES

# ----------------------------------------------------------------------------- op tables

_BINARY = {operator.add: "add", operator.sub: "sub", operator.mul: "mul",
           operator.truediv: "div", torch.add: "add", torch.sub: "sub", torch.mul: "mul",
           torch.div: "div", torch.true_divide: "div"}
_BINARY_METHODS = {"add": "add", "sub": "sub", "mul": "mul", "div": "div",
                   "true_divide": "div"}
_UNARY = {operator.neg: "neg", torch.neg: "neg", torch.relu: "relu", F.relu: "relu",
          F.silu: "silu", torch.sigmoid: "sigmoid", F.sigmoid: "sigmoid",
          torch.tanh: "tanh", F.tanh: "tanh", torch.exp: "exp", torch.sqrt: "sqrt",
          torch.rsqrt: "rsqrt", torch.abs: "abs", F.gelu: "gelu", torch.cos: "cos",
          torch.sin: "sin", torch.log: "log"}
_UNARY_METHODS = {"neg": "neg", "relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh",
                  "exp": "exp", "sqrt": "sqrt", "rsqrt": "rsqrt", "abs": "abs", "cos": "cos",
                  "sin": "sin", "log": "log"}
_POW = {operator.pow, torch.pow}
_CAST_METHODS = {"float", "half", "bfloat16"}
_CATS = {torch.cat, torch.concat, torch.concatenate}
FLOATS = tuple(C_TYPES)  # the dtypes the kernels take
MAX_MEMBERS = 64  # op instances in one group
MAX_INPUTS = 16
MAX_PLANS = 64  # call signatures remembered per group


def _number(v: Any) -> bool:
    return type(v) in (int, float)


def _kind(node: fx.Node) -> tuple[str, str] | None:
    """(kind, op) of an eligible node: ("bin", "add"), ("un", "silu"), ("pow", ""),
    ("cast", ""), ("slice", ""), ("cat", ""); None where it is not one."""
    op, target, args, kwargs = node.op, node.target, node.args, node.kwargs
    if op == "call_function":
        if target in _BINARY and len(args) == 2 and not kwargs:
            return "bin", _BINARY[target]
        if target in _UNARY and len(args) == 1:
            name = _UNARY[target]
            if name == "gelu":
                approx = kwargs.get("approximate", "none")
                if set(kwargs) - {"approximate"} or approx not in ("none", "tanh"):
                    return None
                return "un", "gelu" if approx == "none" else "gelu_tanh"
            if kwargs and set(kwargs) != {"inplace"} or kwargs.get("inplace"):
                return None
            return "un", name
        if target in _POW and len(args) == 2 and not kwargs and _number(args[1]):
            return "pow", ""
        if target is operator.getitem and len(args) == 2 and _slices(args[1]):
            return "slice", ""
        if target in _CATS and not set(kwargs) - {"dim"} and 1 <= len(args) <= 2 \
                and isinstance(args[0], (list, tuple)) and len(args[0]) >= 1 \
                and all(isinstance(a, fx.Node) for a in args[0]):
            dim = args[1] if len(args) == 2 else kwargs.get("dim", 0)
            return ("cat", "") if type(dim) is int else None
        return None
    if op == "call_method":
        if target in _BINARY_METHODS and len(args) == 2 and not kwargs:
            return "bin", _BINARY_METHODS[target]
        if target in _UNARY_METHODS and len(args) == 1 and not kwargs:
            return "un", _UNARY_METHODS[target]
        if target == "pow" and len(args) == 2 and not kwargs and _number(args[1]):
            return "pow", ""
        if target in _CAST_METHODS and len(args) == 1 and not kwargs:
            return "cast", ""
        if target == "to" and ((len(args) == 2 and not kwargs)
                               or (len(args) == 1 and set(kwargs) == {"dtype"})):
            dtype = args[1] if len(args) == 2 else kwargs["dtype"]
            if isinstance(dtype, torch.dtype) and dtype not in FLOATS:
                return None
            if isinstance(dtype, (torch.dtype, fx.Node)):  # a node: checked at run time
                return "cast", ""
        return None
    return None


def _slices(index: Any) -> bool:
    """A basic index of slices (step 1) and at most one Ellipsis."""
    items = index if isinstance(index, tuple) else (index,)
    if not items or sum(i is Ellipsis for i in items) > 1:
        return False
    return all(i is Ellipsis or (isinstance(i, slice) and i.step in (None, 1)) for i in items)


def _tensor_args(node: fx.Node) -> list[fx.Node]:
    """The node's operands that carry tensor data (not slice bounds, dims or dtypes)."""
    kind = _kind(node)
    if kind is None:
        return []
    if kind[0] == "cat":
        return list(node.args[0])
    if kind[0] in ("slice", "pow", "cast", "un"):
        a = node.args[0]
        return [a] if isinstance(a, fx.Node) else []
    return [a for a in node.args if isinstance(a, fx.Node)]


_SHAPEISH_FNS = {operator.floordiv, operator.mod, operator.add, operator.sub, operator.mul,
                 operator.getitem, len}


def _scalarish(graph: fx.Graph) -> set[fx.Node]:
    """Nodes whose value is a Python number or shape, not a tensor: shape reads and the
    arithmetic over them (``x.shape[-1] // 2``)."""
    out: set[fx.Node] = set()
    for n in graph.nodes:
        shape_read = (n.op == "call_function" and n.target is getattr and len(n.args) == 2
                      and n.args[1] in ("shape", "ndim", "dtype", "device"))
        if shape_read or (n.op == "call_method" and n.target in ("size", "dim", "numel")):
            out.add(n)
        elif n.op == "call_function" and n.target in _SHAPEISH_FNS:
            nodes = [a for a in n.args if isinstance(a, fx.Node)]
            if nodes and all(a in out for a in nodes):
                out.add(n)
    return out


_INPLACE_FNS = {operator.iadd, operator.isub, operator.imul, operator.itruediv,
                operator.setitem, operator.ipow, operator.iand, operator.ior}


def _barrier(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """No group spans the node: it may write into a tensor it is given (an in-place method
    such as ``add_`` or ``__setitem__``, an augmented assignment, ``out=`` /
    ``inplace=True``, a module with ``inplace`` set or one that wraps such a module), or it
    enters or leaves a grad-mode / autocast block (the group runs in its root's modes)."""
    if node.op == "call_function" and node.target in MODE_CHANGES:
        return True
    if node.op == "call_method":
        name = str(node.target)
        return name.endswith("_") or name == "__setitem__" or "out" in node.kwargs
    if node.op == "call_function":
        return (node.target in _INPLACE_FNS or "out" in node.kwargs
                or bool(node.kwargs.get("inplace")))
    if node.op == "call_module":
        m = modules.get(str(node.target))
        inner = getattr(m, "mod", None)
        return bool(getattr(m, "inplace", False) or getattr(inner, "inplace", False))
    return False


# ----------------------------------------------------------------------------- grouping


@dataclass
class Group:
    """One fused chain: ``root`` and its members (graph order), the inputs they read."""

    root: fx.Node
    members: list[fx.Node]
    inputs: list[fx.Node] = field(default_factory=list)


def find_groups(graph: fx.Graph) -> list[Group]:
    """The groups to fuse in ``graph``, roots last to first (see the module doc)."""
    scalar = _scalarish(graph)

    def eligible(n: Any) -> bool:
        return (isinstance(n, fx.Node) and n not in scalar and _kind(n) is not None
                and n.op in ("call_function", "call_method"))

    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    modules = dict(graph.owning_module.named_modules()) if graph.owning_module else {}
    taken: set[fx.Node] = set()  # roots already, or absorbed into every consumer
    groups: list[Group] = []
    for root in reversed(list(graph.nodes)):
        if not eligible(root) or root in taken:
            continue
        if all(eligible(u) for u in root.users) and root.users:
            continue  # its consumers' groups compute it
        members: dict[fx.Node, None] = {root: None}
        stack = [root]
        while stack and len(members) < MAX_MEMBERS:
            n = stack.pop()
            for a in _tensor_args(n):
                if a in members or not eligible(a):
                    continue
                if not all(eligible(u) for u in a.users):
                    continue  # computed anyway for another user: read, not recomputed
                members[a] = None
                stack.append(a)
        if len(members) < 2:
            continue
        ordered = sorted(members, key=order.__getitem__)
        if any(_barrier(n, modules) for n in nodes[order[ordered[0]]:order[root]]):
            # the group runs where its root was: an in-place op between its first op and
            # there could change what the earlier ops read, a mode block how they run
            continue
        inputs: dict[fx.Node, None] = {}
        for n in ordered:
            for a in n.all_input_nodes:
                if a not in members:
                    inputs[a] = None
        if len(inputs) > MAX_INPUTS:
            continue
        taken.update(members)
        groups.append(Group(root, ordered, list(inputs)))
    return groups


def subgraph(group: Group) -> fx.GraphModule:
    """The group's ops as a graph module of their own: inputs as placeholders, the root's
    value its output (what runs when the kernel cannot)."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for i, n in enumerate(group.inputs):
        env[n] = g.placeholder(f"in{i}")
    for n in group.members:
        env[n] = g.node_copy(n, lambda a: env[a])
    g.output(env[group.root])
    return fx.GraphModule(nn.Module(), g)


# ----------------------------------------------------------------------------- per signature


class _Meta(Interpreter):
    """Runs the group's graph on meta tensors, keeping each node's value and, for slices and
    casts, what their arguments evaluated to."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm, garbage_collect_values=False)
        self.values: dict[fx.Node, Any] = {}
        self.evaluated: dict[fx.Node, tuple[Any, ...]] = {}

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        self.values[n] = out
        if n.op in ("call_function", "call_method"):
            self.evaluated[n] = self.map_nodes_to_values(n.args, n)
        return out


@dataclass
class _Sig:
    """What one call signature needs: node shapes / dtypes and the launch's int and float
    parameters in the order the code reads them."""

    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, torch.dtype]
    out_shape: tuple[int, ...]
    out_stride: tuple[int, ...]
    out_dtype: torch.dtype
    numel: int


class Program:
    """The group's ops in a form code is generated from: one entry per node of the group's
    graph, in order (placeholders first)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.nodes = [n for n in gm.graph.nodes if n.op != "output"]
        self.inputs = [n for n in self.nodes if n.op == "placeholder"]
        self.root = next(n for n in gm.graph.nodes if n.op == "output").args[0]

    def signature(self, args: Sequence[Any]) -> tuple[_Sig, list[Any], tuple[Any, ...]] | None:
        """(shapes and dtypes, the per-signature parameter values, the structure key the
        generated code depends on) for a call with ``args``; None where the kernel cannot
        run it (a value not a float tensor, an empty or huge output, any op meta tensors
        reject)."""
        meta_args = [torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
                     if isinstance(a, torch.Tensor) else a for a in args]
        for a in args:
            if isinstance(a, torch.Tensor) and a.dtype not in FLOATS:
                return None
        interp = _Meta(self.gm)
        try:
            with torch.no_grad():
                out = interp.run(*meta_args)
        except Exception:  # noqa: BLE001 - an op meta tensors refuse: run the ops as they are
            return None
        if not isinstance(out, torch.Tensor) or out.dtype not in FLOATS or out.numel() == 0:
            return None
        shapes, dtypes = {}, {}
        for n in self.nodes:
            v = interp.values.get(n)
            if n.op == "placeholder" and not isinstance(v, torch.Tensor):
                continue  # a number, a dtype, a slice bound: read where it is used
            if not isinstance(v, torch.Tensor) or v.dtype not in FLOATS:
                return None
            if any(s >= 2**31 for s in v.shape) or v.numel() >= 2**31:
                return None
            shapes[n.name], dtypes[n.name] = tuple(v.shape), v.dtype
        sig = _Sig(shapes, dtypes, tuple(out.shape), tuple(out.stride()), out.dtype,
                   out.numel())
        # 32-bit index arithmetic where every offset fits (integer division by a size is ~4x
        # cheaper than in 64 bits, and a kernel does a few per element)
        spans = [sum((d - 1) * st for d, st in zip(a.shape, a.stride()) if d)
                 for a in args if isinstance(a, torch.Tensor)]
        out_span = sum((d - 1) * st for d, st in zip(sig.out_shape, sig.out_stride) if d)
        wide = max([sig.numel, out_span, *spans]) >= 2**31 - 2**22
        code = _Codegen(self, sig, interp.evaluated, args, "long long" if wide else "unsigned")
        try:
            code.build()
        except _Refused:
            return None
        return sig, code.params, code.key


class _Refused(Exception):
    """The signature has something the generated code does not take."""


# ----------------------------------------------------------------------------- code generation
#
# The generated code is a list of statements in a tiny neutral form, rendered as CUDA or as
# Python: ("let", var, expr), ("if", [(cond, stmts), ...], else_stmts), ("store", expr);
# expressions are tuples: ("param", j), ("load", k, offset_expr), ("var", name),
# ("num", value), ("idx", d), ("op", name, a, b), ("round", dtype_name, a), ("add_i", a, b),
# ("mul_i", a, b), ("lt_i", a, b), ("sub_i", a, b).


class _Codegen:
    def __init__(self, prog: Program, sig: _Sig, evaluated: dict[fx.Node, tuple[Any, ...]],
                 args: Sequence[Any], itype: str) -> None:
        self.prog, self.sig, self.evaluated, self.args = prog, sig, evaluated, args
        self.itype = itype  # the index arithmetic's C type: "unsigned" or "long long"
        self.params: list[Any] = []  # values: ints (sizes, strides, starts), floats
        self.param_kinds: list[str] = []  # "i" int64, "f" float32
        self.ntmp = 0
        self.key: tuple[Any, ...] = ()

    def param(self, value: Any, kind: str) -> tuple:
        self.params.append(value)
        self.param_kinds.append(kind)
        return ("param", len(self.params) - 1)

    def build(self) -> None:
        sig = self.sig
        shape, stride = sig.out_shape, sig.out_stride
        nd = len(shape)
        # the output walked in its memory order: dims by stride, largest first
        perm = sorted(range(nd), key=lambda d: (-stride[d], -d)) if nd else []
        sizes = [self.param(shape[d], "i") for d in range(nd)]
        ostr = [self.param(stride[d], "i") for d in range(nd)]
        # decomposition of the linear index, innermost (last in perm) first
        decomp = [(d, sizes[d]) for d in reversed(perm)]
        body: list[Any] = []
        memo: dict[Any, Any] = {}
        root = self.emit(self.prog.root, [("idx", d) for d in range(nd)], body, memo)
        off: Any = ("num_i", 0)
        for d in range(nd):
            if shape[d] != 1:
                off = ("add_i", off, ("mul_i", ("idx", d), ostr[d]))
        body.append(("store", off, ("round", C_TYPES[sig.out_dtype], root)))
        inputs = []
        for n in self.prog.inputs:
            a = self.args[self.prog.inputs.index(n)]
            inputs.append(C_TYPES[a.dtype] if isinstance(a, torch.Tensor) else None)
        self.key = (tuple(inputs), C_TYPES[sig.out_dtype], tuple(decomp), tuple(self.param_kinds),
                    _freeze(body), self.itype)

    # -- values

    def tmp(self) -> str:
        self.ntmp += 1
        return f"t{self.ntmp}"

    def emit(self, node: Any, idx: list[Any], body: list[Any], memo: dict[Any, Any]) -> Any:
        """An expression of node's value at index ``idx`` (one entry per dim of its shape),
        statements it needs appended to ``body``."""
        if not isinstance(node, fx.Node):
            if _number(node):
                return ("num", float(node))
            raise _Refused(f"operand {node!r}")
        key = (node.name, _freeze(idx))
        got = memo.get(key)
        if got is not None:
            return got
        expr = self._emit(node, idx, body, memo)
        if expr[0] not in ("var", "num", "param"):
            var = self.tmp()
            body.append(("let", var, expr))
            expr = ("var", var)
        memo[key] = expr
        return expr

    def operand(self, a: Any, node: fx.Node, idx: list[Any], body: list[Any],
                memo: dict[Any, Any]) -> Any:
        """Operand ``a`` of ``node`` at the node's index ``idx``, broadcast as torch does."""
        if not isinstance(a, fx.Node):
            return self.emit(a, idx, body, memo)
        if a.op == "placeholder" and a.name not in self.sig.dtypes:  # a runtime scalar
            return self.emit(a, idx, body, memo)
        return self.emit(a, self.broadcast(a, node, idx), body, memo)

    def broadcast(self, a: fx.Node, node: fx.Node, idx: list[Any]) -> list[Any]:
        ashape, nshape = self.sig.shapes[a.name], self.sig.shapes[node.name]
        lead = len(nshape) - len(ashape)
        if lead < 0:
            raise _Refused("operand of higher rank")
        out = []
        for j, s in enumerate(ashape):
            out.append(("num_i", 0) if s == 1 and nshape[lead + j] != 1 else idx[lead + j])
        return out

    def _emit(self, node: fx.Node, idx: list[Any], body: list[Any],
              memo: dict[Any, Any]) -> Any:
        sig = self.sig
        if node.op == "placeholder":
            k = self.prog.inputs.index(node)
            a = self.args[k]
            if not isinstance(a, torch.Tensor):
                if _number(a):
                    return self.param(float(a), "f")
                raise _Refused(f"input {type(a).__name__}")
            shape, stride = tuple(a.shape), a.stride()
            off: Any = ("num_i", 0)
            for d, s in enumerate(shape):
                if s != 1 and stride[d] != 0:
                    off = ("add_i", off, ("mul_i", idx[d], self.param(stride[d], "i")))
            return ("load", k, off)
        kind, op = _kind(node) or (None, None)
        ev = self.evaluated[node]
        dt = C_TYPES[sig.dtypes[node.name]]
        if kind == "bin":
            a = self.operand(node.args[0], node, idx, body, memo)
            b = self.operand(node.args[1], node, idx, body, memo)
            return ("round", dt, ("op", op, a, b))
        if kind == "un":
            a = self.operand(node.args[0], node, idx, body, memo)
            return ("round", dt, ("op", op, a, None))
        if kind == "pow":
            a = self.operand(node.args[0], node, idx, body, memo)
            return ("round", dt, ("op", "pow", a, ("num", float(node.args[1]))))
        if kind == "cast":
            a = self.operand(node.args[0], node, idx, body, memo)
            return ("round", dt, a)
        if kind == "slice":
            src = node.args[0]
            sshape = sig.shapes[src.name]
            items = ev[1] if isinstance(ev[1], tuple) else (ev[1],)
            nd = len(sshape)
            n_sl = sum(i is not Ellipsis for i in items)
            if n_sl > nd:
                raise _Refused("too many indices")
            dims: list[Any] = []
            for i in items:
                if i is Ellipsis:
                    dims += [None] * (nd - n_sl)
                else:
                    dims.append(i)
            dims += [None] * (nd - len(dims))
            sidx = []
            for d, s in enumerate(dims):
                if s is None:
                    sidx.append(idx[d])
                    continue
                start, _stop, step = s.indices(sshape[d])
                if step != 1:
                    raise _Refused("slice step")
                sidx.append(idx[d] if start == 0
                            else ("add_i", idx[d], self.param(start, "i")))
            return self.emit(src, sidx, body, memo)
        if kind == "cat":
            parts = node.args[0]
            dim = ev[1] if len(ev) > 1 else node.kwargs.get("dim", 0)
            nshape = sig.shapes[node.name]
            nd = len(nshape)
            d = dim + nd if dim < 0 else dim
            if not 0 <= d < nd:
                raise _Refused("cat dim")
            var = self.tmp()
            body.append(("decl", var))
            branches = []
            start = 0
            for j, p in enumerate(parts):
                psize = sig.shapes[p.name][d] if p.name in sig.shapes else None
                if psize is None or len(sig.shapes[p.name]) != nd:
                    raise _Refused("cat part")
                stmts: list[Any] = []
                pidx = list(idx)
                if start:
                    pidx[d] = ("sub_i", idx[d], self.param(start, "i"))
                val = self.emit(p, pidx, stmts, dict(memo))
                stmts.append(("set", var, ("round", dt, val)))
                start += psize
                cond = None if j == len(parts) - 1 else ("lt_i", idx[d], self.param(start, "i"))
                branches.append((cond, stmts))
            body.append(("if", branches))
            return ("var", var)
        raise _Refused(f"node {node.format_node()}")


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, tuple):
        return tuple(_freeze(x) for x in v)
    return v


# ----------------------------------------------------------------------------- the module


class FusedPointwise(nn.Module):
    """One group of the traced graph (see the module doc): the kernel where it can run,
    the group's own ops (``sub``) otherwise."""

    def __init__(self, sub: fx.GraphModule, ops: list[str]) -> None:
        super().__init__()
        self.sub = sub
        self.ops = ops
        self._prog = Program(sub)
        self._plans: dict[Any, Any] = {}
        self._signatures = 0  # call signatures planned: past MAX_PLANS * 4 the ops run as
        # they are (a scalar input that changes every call would plan every call)
        self._launches = 0  # kernel launches made (tests, reports)
        self._refused = ""  # why the kernel is not used for a signature, if it ever was not

    @property
    def kernel_launches(self) -> int:
        return self._launches

    @property
    def refused(self) -> str:
        """Why the kernel stopped being used for a call signature ("" while it never did)."""
        return self._refused

    def __deepcopy__(self, memo: dict[int, Any]) -> FusedPointwise:
        import copy

        return FusedPointwise(copy.deepcopy(self.sub, memo), list(self.ops))

    def forward(self, *args: Any) -> Any:
        if torch.compiler.is_compiling():  # (the compiler fuses the ops itself)
            return self.sub(*args)
        first = None
        grad = torch.is_grad_enabled()
        for a in args:
            if isinstance(a, torch.Tensor):
                if type(a) is not torch.Tensor or not a.is_cuda or (a.requires_grad and grad):
                    return self.sub(*args)
                if first is None:
                    first = a
                elif a.device != first.device:
                    return self.sub(*args)
        # under torch.compile / jit.trace / a dispatch mode / vmap the ops themselves are
        # what must be seen; under autocast some of them (exp, pow, rsqrt) change dtype
        if first is None or not plain_eager(first) or any_autocast() \
                or self._signatures > 4 * MAX_PLANS:
            return self.sub(*args)
        key = tuple((a.shape, a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor)
                    else (type(a), a) for a in args)
        plans = self._plans
        plan = plans.get(key, _MISSING)
        if plan is _MISSING:
            if torch.cuda.is_current_stream_capturing():  # (no compile or check in a capture)
                return self.sub(*args)
            self._signatures += 1
            plan = _Launcher.make(self._prog, args, first.device)
            if len(plans) >= MAX_PLANS:
                plans.pop(next(iter(plans)))
            plans[key] = plan
            if plan is not None:
                return self._first(plan, key, args)
        if plan is None:
            return self.sub(*args)
        self._launches += 1
        return plan(args)

    def _first(self, plan: _Launcher, key: Any, args: tuple) -> Any:
        """A signature's first launch, checked against the ops: a kernel that disagrees (by
        more than a rounding of the output's dtype) is never launched for it again."""
        got = plan(args)
        want = self.sub(*args)
        self._launches += 1
        tol = 1e-5 if want.dtype == torch.float32 else 1e-2
        ok = (got.shape == want.shape and got.stride() == want.stride()
              and torch.allclose(got.float(), want.float(), rtol=tol, atol=tol, equal_nan=True))
        if not ok:
            self._plans[key] = None
            self._refused = "the generated kernel disagreed with the ops it replaces"
        return want


_MISSING = object()
_raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _raw_stream(index: int) -> int:
    """torch's current stream on device ``index`` as a raw handle (one C call)."""
    if _raw is not None:
        return _raw(index)
    return torch.cuda.current_stream(index).cuda_stream


class _Launcher:
    """A compiled kernel for one call signature: allocates the output as eager would lay
    it out and launches on torch's current stream."""

    _modules: dict[tuple[Any, int], Any] = {}

    def __init__(self, launch: Any, sig: _Sig, params: list[Any], kinds: tuple[str, ...],
                 itype: str, tensors: list[int], device: torch.device) -> None:
        import numpy as np

        self.launch, self.sig, self.device = launch, sig, device
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self.tensors = tensors
        index = np.int64 if itype == "long long" else np.uint32
        self.tail = [index(v) if k == "i" else np.float32(v) for v, k in zip(params, kinds)]
        self.n = index(sig.numel)

    @classmethod
    def make(cls, prog: Program, args: Sequence[Any], device: torch.device) -> _Launcher | None:
        if device.index is not None and device.index != torch.cuda.current_device():
            return None
        got = prog.signature(args)
        if got is None:
            return None
        sig, params, key = got
        try:
            fn = cls._function(key, device.index or 0)
        except Exception:  # noqa: BLE001 - no CuPy / NVRTC here: the ops run as they are
            return None
        from dnnctl.backends import cuda

        threads = 256
        blocks = max(1, min((sig.numel + threads - 1) // threads, 132 * 16))
        launch = cuda.Launch(fn, (blocks,), (threads,))
        tensors = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor)]
        return cls(launch, sig, params, key[3], key[5], tensors, device)

    @classmethod
    def _function(cls, key: tuple[Any, ...], device: int) -> Any:
        fn = cls._modules.get((key, device))
        if fn is None:
            from dnnctl.backends.registry import get_backend

            mod = get_backend("cupy").compile_code(cuda_source(key), device=device)
            fn = cls._modules[(key, device)] = mod.get_function("pointwise")
        return fn

    def __call__(self, args: Sequence[Any]) -> torch.Tensor:
        from dnnctl.backends import cuda

        sig = self.sig
        out = torch.empty_strided(sig.out_shape, sig.out_stride, dtype=sig.out_dtype,
                                  device=self.device)
        state = cuda.STATE
        saved = state.stream
        state.stream = _raw_stream(self.index)
        try:
            self.launch([*(args[k] for k in self.tensors), out, self.n, *self.tail])
        finally:
            state.stream = saved
        return out


# ----------------------------------------------------------------------------- the pass


def _op_name(node: fx.Node) -> str:
    kind, op = _kind(node) or ("?", "")
    return op or kind


def fuse_pointwise(gm: fx.GraphModule) -> list[str]:
    """Replace each group of gm's graph with a :class:`FusedPointwise` call; returns one
    line per group (its root and ops) for the patch report."""
    graph = gm.graph
    done: list[str] = []
    for group in find_groups(graph):
        sub = subgraph(group)
        ops = [_op_name(n) for n in group.members]
        mod = FusedPointwise(sub, ops)
        name = add_submodule(gm, "pointwise_" + group.root.name, mod)
        with graph.inserting_before(group.root):
            new = graph.call_module(name, tuple(group.inputs))
        group.root.replace_all_uses_with(new)
        for n in reversed(group.members):
            if not n.users:
                graph.erase_node(n)
        done.append(f"{group.root.name}: {len(group.members)} ops ({', '.join(ops)})")
    # members computed in every consumer's group: gone once all of them are
    for n in reversed(list(graph.nodes)):
        if not n.users and n.op in ("call_function", "call_method") and _kind(n) is not None:
            graph.erase_node(n)
    if done:
        graph.lint()
        gm.recompile()
    return done
