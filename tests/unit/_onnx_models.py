"""Small ONNX models built in code (onnx.helper), shaped like what exporters write:
a ResNet bottleneck stage, a ViT encoder block and a UNet level."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _B:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.i = 0

    def name(self, prefix: str) -> str:
        self.i += 1
        return f"{prefix}{self.i}"

    def const(self, value: np.ndarray, prefix: str = "c") -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def ints(self, value: list[int]) -> str:
        name = self.name("shape")
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.int64), name))
        return name

    def node(self, op: str, inputs: list[str], **attrs: object) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int, *, stride: int = 1, pad: int = 0,
             bias: bool = False, bn: bool = False, groups: int = 1) -> str:
        w = self.const(np.random.rand(cout, cin // groups, k, k) * 0.1, "w")
        ins = [x, w] + ([self.const(np.zeros(cout), "b")] if bias else [])
        y = self.node("Conv", ins, kernel_shape=[k, k], strides=[stride, stride],
                      pads=[pad] * 4, group=groups)
        if bn:
            y = self.node("BatchNormalization", [y, self.const(np.ones(cout)),
                                                 self.const(np.zeros(cout)),
                                                 self.const(np.zeros(cout)),
                                                 self.const(np.ones(cout))])
        return y

    def linear(self, x: str, k: int, n: int) -> str:
        y = self.node("MatMul", [x, self.const(np.random.rand(k, n) * 0.1, "w")])
        return self.node("Add", [y, self.const(np.zeros(n), "b")])

    def gelu_erf(self, x: str) -> str:  # what torch.onnx.export writes for nn.GELU()
        d = self.node("Div", [x, self.const(np.array(math.sqrt(2.0)))])
        e = self.node("Erf", [d])
        a = self.node("Add", [e, self.const(np.array(1.0))])
        m = self.node("Mul", [x, a])
        return self.node("Mul", [m, self.const(np.array(0.5))])

    def silu(self, x: str) -> str:
        return self.node("Mul", [x, self.node("Sigmoid", [x])])

    def save(self, path: Path, name: str, inputs: list[tuple[str, list[object]]],
             out: tuple[str, list[object]], opset: int = 18) -> Path:
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
            [helper.make_tensor_value_info(out[0], TensorProto.FLOAT, out[1])], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        onnx.checker.check_model(model)
        onnx.save(model, str(path))
        return path


def resnet_like(path: Path, batch: object = "N") -> Path:
    """Stem (7x7/2 conv + BN + ReLU, 3x3/2 max pool), two bottlenecks (the first with a
    projection), global average pool, flatten, Gemm classifier."""
    b = _B()
    x = b.node("Relu", [b.conv("image", 3, 16, 7, stride=2, pad=3, bn=True)])
    x = b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 16
    for block in range(2):
        y = b.node("Relu", [b.conv(x, cin, 8, 1, bn=True)])
        y = b.node("Relu", [b.conv(y, 8, 8, 3, pad=1, bn=True)])
        y = b.conv(y, 8, 32, 1, bn=True)
        short = b.conv(x, cin, 32, 1, bn=True) if block == 0 else x
        x = b.node("Relu", [b.node("Add", [y, short])])
        cin = 32
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x])])
    x = b.node("Gemm", [x, b.const(np.random.rand(10, 32), "fc"), b.const(np.zeros(10))],
               transB=1)
    return b.save(path, "resnet_like", [("image", [batch, 3, 32, 32])], (x, [batch, 10]))


def vit_like(path: Path, tokens: object = "seq", dim: int = 32, heads: int = 4) -> Path:
    """One pre-LN encoder block over (batch, tokens, dim): q/k/v projections, heads split by
    Reshape/Transpose, Q·Kᵀ/√d -> Softmax -> ·V, projection, residual, GELU MLP (erf form)."""
    b = _B()
    dh = dim // heads
    ln = b.node("LayerNormalization", ["x", b.const(np.ones(dim)), b.const(np.zeros(dim))],
                axis=-1)

    def split(t: str, perm: list[int]) -> str:
        r = b.node("Reshape", [t, b.ints([0, 0, heads, dh])])
        return b.node("Transpose", [r], perm=perm)

    q = split(b.linear(ln, dim, dim), [0, 2, 1, 3])
    k = split(b.linear(ln, dim, dim), [0, 2, 3, 1])
    v = split(b.linear(ln, dim, dim), [0, 2, 1, 3])
    s = b.node("Div", [b.node("MatMul", [q, k]), b.const(np.array(math.sqrt(dh)))])
    o = b.node("MatMul", [b.node("Softmax", [s], axis=-1), v])
    o = b.node("Reshape", [b.node("Transpose", [o], perm=[0, 2, 1, 3]), b.ints([0, 0, dim])])
    x1 = b.node("Add", ["x", b.linear(o, dim, dim)])
    ln2 = b.node("LayerNormalization", [x1, b.const(np.ones(dim)), b.const(np.zeros(dim))])
    h = b.linear(b.gelu_erf(b.linear(ln2, dim, 4 * dim)), 4 * dim, dim)
    out = b.node("Add", [x1, h])
    return b.save(path, "vit_like", [("x", [2, tokens, dim])], (out, [2, tokens, dim]))


def unet_like(path: Path, batch: int = 1) -> Path:
    """A UNet level: (GroupNorm -> SiLU -> conv) twice with a residual, a strided conv down,
    a transposed conv up, a skip Concat, and a 1x1 head."""
    b = _B()
    c = 16
    x = b.conv("x", 4, c, 3, pad=1, bias=True)

    def resblock(t: str, ch: int) -> str:
        h = b.node("GroupNormalization", [t, b.const(np.ones(ch)), b.const(np.zeros(ch))],
                   num_groups=4, epsilon=1e-5)
        h = b.conv(b.silu(h), ch, ch, 3, pad=1, bias=True)
        h = b.node("GroupNormalization", [h, b.const(np.ones(ch)), b.const(np.zeros(ch))],
                   num_groups=4, epsilon=1e-5)
        h = b.conv(b.silu(h), ch, ch, 3, pad=1, bias=True)
        return b.node("Add", [t, h])

    skip = resblock(x, c)
    down = b.conv(skip, c, c, 3, stride=2, pad=1, bias=True)
    mid = resblock(down, c)
    up = b.node("ConvTranspose", [mid, b.const(np.random.rand(c, c, 2, 2), "wt")],
                kernel_shape=[2, 2], strides=[2, 2])
    cat = b.node("Concat", [up, skip], axis=1)
    out = b.conv(cat, 2 * c, 4, 1, bias=True)
    return b.save(path, "unet_like", [("x", [batch, 4, 16, 16])], (out, [batch, 4, 16, 16]),
                  opset=21)


def mobilenet_like(path: Path, batch: int = 2) -> Path:
    """MobileNetV2 / V3 pieces as exporters write them: conv + BN + Clip(0, 6) (ReLU6, opset
    11+ bounds as inputs), a depthwise conv + BN + HardSwish, a HardSigmoid gate
    (alpha 1/6, as torch exports it), a Gemm + Clip (ReLU6 that no GEMM epilogue takes) and
    a HardSigmoid with ONNX's default alpha 0.2 (not torch's: left to the runtime)."""
    b = _B()
    zero, six = b.const(np.array(0.0)), b.const(np.array(6.0))
    x = b.node("Clip", [b.conv("x", 8, 32, 1, bn=True), zero, six])
    x = b.node("HardSwish", [b.conv(x, 32, 32, 3, pad=1, bn=True, groups=32)])
    gate = b.node("HardSigmoid", [b.node("GlobalAveragePool", [x])], alpha=1 / 6, beta=0.5)
    x = b.node("Mul", [x, gate])
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x])])
    x = b.node("Gemm", [x, b.const(np.random.rand(10, 32), "fc"), b.const(np.zeros(10))],
               transB=1)
    x = b.node("Clip", [x, zero, six])
    x = b.node("HardSigmoid", [x])
    return b.save(path, "mobilenet_like", [("x", [batch, 8, 14, 14])], (x, [batch, 10]))
