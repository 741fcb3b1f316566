"""Write resnet_block.onnx, the small ONNX model the README's tour turns into a workload:
a ResNet stem (7x7/2 conv + BatchNorm + ReLU, 3x3/2 max pool), one bottleneck with a
projection shortcut, global average pool and a Gemm classifier (10 classes); the batch dimension is 'N'
and the channels are narrow, so the file stays small.

    python docs/examples/make_resnet_block.py docs/examples/resnet_block.onnx
"""

from __future__ import annotations

import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def const(name: str, shape: tuple[int, ...]) -> str:
        inits.append(numpy_helper.from_array(
            (rng.standard_normal(shape) * 0.1).astype(np.float32), name))
        return name

    def conv_bn(x: str, name: str, cin: int, cout: int, k: int, stride: int = 1,
                relu: bool = True) -> str:
        nodes.append(helper.make_node(
            "Conv", [x, const(f"{name}.w", (cout, cin, k, k))], [f"{name}.conv"],
            kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, name=name))
        bn = [const(f"{name}.bn.{p}", (cout,)) for p in ("scale", "bias", "mean")]
        inits.append(numpy_helper.from_array(np.ones(cout, np.float32), f"{name}.bn.var"))
        nodes.append(helper.make_node("BatchNormalization", [f"{name}.conv", *bn,
                                                             f"{name}.bn.var"], [f"{name}.bn"]))
        if not relu:
            return f"{name}.bn"
        nodes.append(helper.make_node("Relu", [f"{name}.bn"], [f"{name}.relu"]))
        return f"{name}.relu"

    x = conv_bn("image", "stem", 3, 16, 7, stride=2)
    nodes.append(helper.make_node("MaxPool", [x], ["pool"], kernel_shape=[3, 3],
                                  strides=[2, 2], pads=[1, 1, 1, 1]))
    y = conv_bn("pool", "b1.conv1", 16, 16, 1)
    y = conv_bn(y, "b1.conv2", 16, 16, 3)
    y = conv_bn(y, "b1.conv3", 16, 64, 1, relu=False)
    short = conv_bn("pool", "b1.down", 16, 64, 1, relu=False)
    nodes.append(helper.make_node("Add", [y, short], ["b1.add"]))
    nodes.append(helper.make_node("Relu", ["b1.add"], ["b1.out"]))
    nodes.append(helper.make_node("GlobalAveragePool", ["b1.out"], ["gap"]))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"]))
    nodes.append(helper.make_node("Gemm", ["flat", const("fc.w", (10, 64)),
                                           const("fc.b", (10,))], ["logits"], transB=1))
    graph = helper.make_graph(
        nodes, "resnet_block",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="dnnctl docs/examples")
    onnx.checker.check_model(model)
    return model


if __name__ == "__main__":
    onnx.save(build(), sys.argv[1] if len(sys.argv) > 1 else "resnet_block.onnx")
