"""ONNX nodes -> dnnctl problems: the graph view and one rule per ONNX op type.

A rule returns :class:`Mapped` (the problems a node runs, what was fused into it) or a
string saying why this node's form has no dnnctl problem (e.g. a 3-D convolution).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dnnctl.errors import UsageError

GEMM_ACTS = frozenset({"relu", "gelu", "silu"})  # the matmul epilogue's activations
CONV_ACTS = GEMM_ACTS | {"relu6", "hardswish"}  # conv2d's (MobileNetV2 / V3)
_FLOAT_TYPES = {1: "float32", 10: "float16", 16: "bfloat16"}
# ops whose output has their first input's shape: fills gaps ONNX shape inference leaves
# (e.g. function ops such as GroupNormalization in some onnx releases)
SAME_SHAPE = frozenset({
    "BatchNormalization", "GroupNormalization", "InstanceNormalization", "LayerNormalization",
    "RMSNormalization", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Gelu", "Erf", "Softmax",
    "LogSoftmax", "Identity", "Dropout", "Add", "Sub", "Mul", "Div"})


@dataclass
class Mapped:
    problems: list[tuple[str, dict[str, Any]]]
    fused: list[str] = field(default_factory=list)
    attention: int = 0


class Graph:
    """Producers, consumers, constants and inferred shapes of one ONNX graph."""

    def __init__(self, graph: Any, onnx: Any, opset: int):
        self.g, self.onnx, self.opset = graph, onnx, opset
        self.producer: dict[str, Any] = {}
        self.consumers: dict[str, list[Any]] = {}
        for node in graph.node:
            for out in node.output:
                self.producer[out] = node
            for inp in node.input:
                if inp:
                    self.consumers.setdefault(inp, []).append(node)
        self.outputs = {o.name for o in graph.output}
        self.inits = {t.name: t for t in graph.initializer}
        self.shapes: dict[str, tuple[int, ...] | None] = {}
        for vi in (*graph.input, *graph.value_info, *graph.output):
            self.shapes[vi.name] = _static_shape(vi)
        for t in graph.initializer:
            self.shapes[t.name] = tuple(int(d) for d in t.dims)
        self.consumed: set[str] = set()

    # -- queries ------------------------------------------------------------------------

    def shape(self, name: str, node: Any) -> tuple[int, ...]:
        """The static shape of tensor ``name`` (input or output of ``node``)."""
        shape = self.shapes.get(name)
        if shape is None:
            raise UsageError(f"{node.op_type} node {node.name or node.output[0]!r}: tensor "
                             f"{name!r} has no static shape after shape inference",
                             hint="bind the model's symbolic dimensions with --dim name=value "
                                  "(and --batch N), or export it with static shapes")
        return shape

    def attr(self, node: Any, name: str, default: Any = None) -> Any:
        for a in node.attribute:
            if a.name == name:
                return self.onnx.helper.get_attribute_value(a)
        return default

    def const(self, name: str) -> Any:
        """The value of a constant tensor (initializer or Constant node), else None."""
        if name in self.inits:
            return self.onnx.numpy_helper.to_array(self.inits[name])
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant":
            value = self.attr(node, "value")
            if value is not None:
                return self.onnx.numpy_helper.to_array(value)
        return None

    def only_consumer(self, name: str) -> Any:
        """The one node reading ``name`` (not a graph output), else None."""
        users = self.consumers.get(name, [])
        if len(users) != 1 or name in self.outputs or self.is_consumed(users[0]):
            return None
        return users[0]

    def float_dtype(self) -> str:
        for inp in self.g.input:
            if inp.name not in self.inits and inp.type.HasField("tensor_type"):
                dt = _FLOAT_TYPES.get(inp.type.tensor_type.elem_type)
                if dt:
                    return dt
        return "float32"

    def is_consumed(self, node: Any) -> bool:
        return node.output[0] in self.consumed

    def consume(self, *nodes: Any) -> None:
        for n in nodes:
            self.consumed.add(n.output[0])

    # -- activation patterns ------------------------------------------------------------

    def activation_at(self, x: str) -> tuple[str, list[Any], str] | None:
        """An activation applied to tensor ``x``: (fn, its nodes, output name), when the
        activation is the only reader of ``x`` (so it can be fused into x's producer)."""
        users = [u for u in self.consumers.get(x, []) if not self.is_consumed(u)]
        if x in self.outputs or not users:
            return None
        for head in users:
            found = self.pattern(head)
            if found is not None and found[2] == x and {n.output[0] for n in users} <= {
                    n.output[0] for n in found[1]}:
                return found[0], found[1], found[3]
        return None

    def pattern(self, head: Any) -> tuple[str, list[Any], str, str] | None:
        """(fn, nodes, input, output) of the activation starting at node ``head``: a single
        activation node, x·sigmoid(x) (SiLU) or the erf form of GELU as exporters write it."""
        op = head.op_type
        if op == "HardSwish":
            return "hardswish", [head], head.input[0], head.output[0]
        if op == "HardSigmoid":  # torch's hardsigmoid exports alpha = 1/6, beta = 0.5
            if abs(float(self.attr(head, "alpha", 0.2)) - 1 / 6) > 1e-6 or \
                    abs(float(self.attr(head, "beta", 0.5)) - 0.5) > 1e-6:
                return None
            return "hardsigmoid", [head], head.input[0], head.output[0]
        if op == "Clip" and self._clip_bounds(head) == (0.0, 6.0):
            return "relu6", [head], head.input[0], head.output[0]
        if op in ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "Gelu"):
            fn = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh",
                  "LeakyRelu": "leaky_relu", "Gelu": "gelu"}[op]
            if op == "Gelu" and self.attr(head, "approximate", b"none") in (b"tanh", "tanh"):
                fn = "gelu_tanh"
            if op == "Sigmoid":
                mul = self.only_consumer(head.output[0])
                if mul is not None and mul.op_type == "Mul" and head.input[0] in mul.input:
                    return "silu", [head, mul], head.input[0], mul.output[0]
            return fn, [head], head.input[0], head.output[0]
        if op in ("Div", "Mul") and self._scale_is(head, math.sqrt(2.0)):
            x = head.input[0]
            erf = self.only_consumer(head.output[0])
            add = erf is not None and erf.op_type == "Erf" and self.only_consumer(erf.output[0])
            mul = add is not None and add is not False and add.op_type == "Add" and \
                self.only_consumer(add.output[0])
            if not mul or mul.op_type != "Mul":
                return None
            nodes = [head, erf, add, mul]
            if x not in mul.input:  # 0.5 * x applied first: Mul(x, 0.5) feeds this Mul
                half = next((self.producer.get(i) for i in mul.input if i != add.output[0]),
                            None)
                if half is None or half.op_type != "Mul" or x not in half.input:
                    return None
                return "gelu", [half, *nodes], x, mul.output[0]
            last = self.only_consumer(mul.output[0])
            if last is not None and last.op_type == "Mul" and any(
                    self._is_const_value(i, 0.5) for i in last.input):
                nodes.append(last)
            return "gelu", nodes, x, nodes[-1].output[0]
        return None

    def _scale_is(self, node: Any, value: float) -> bool:
        c = self.const(node.input[1]) if len(node.input) > 1 else None
        if c is None or c.size != 1:
            return False
        v = float(c.reshape(-1)[0])
        return abs((v if node.op_type == "Div" else 1.0 / v if v else 0.0) - value) < 1e-3

    def _clip_bounds(self, node: Any) -> tuple[float, float] | None:
        """(min, max) of a Clip with constant bounds: inputs from opset 11, attributes
        before; None where a bound is missing or not constant."""
        if len(node.input) > 1:
            lo, hi = (self.const(node.input[i]) if len(node.input) > i and node.input[i]
                      else None for i in (1, 2))
            if lo is None or hi is None or lo.size != 1 or hi.size != 1:
                return None
            return float(lo.reshape(-1)[0]), float(hi.reshape(-1)[0])
        lo, hi = self.attr(node, "min"), self.attr(node, "max")
        return None if lo is None or hi is None else (float(lo), float(hi))

    def _is_const_value(self, name: str, value: float) -> bool:
        c = self.const(name)
        return c is not None and c.size == 1 and abs(float(c.reshape(-1)[0]) - value) < 1e-6


def _static_shape(vi: Any) -> tuple[int, ...] | None:
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return None
    dims = []
    for d in vi.type.tensor_type.shape.dim:
        if not d.HasField("dim_value") or d.dim_value <= 0:
            return None
        dims.append(int(d.dim_value))
    return tuple(dims)


Rule = Callable[[Graph, Any, str, str], "Mapped | str"]
