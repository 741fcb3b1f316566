"""Convolutional workloads built from the real architectures (inference graphs).

Batch norm is folded into the convolutions (what an inference deployment runs), so every
conv carries a bias. dnnctl's fused epilogue is ``act(conv + bias) + residual``; where a
network applies the activation after the residual add (ResNet), the conv fuses bias and
residual and a separate in-place ``activation`` op follows, exactly as the model computes.
"""

from __future__ import annotations

from dnnctl.ops.conv2d.op import output_size
from dnnctl.workloads.model import Workload


class _Net:
    """Accumulates the problems of one network while tracking the activation shape."""

    def __init__(self, name: str, batch: int, dtype: str, layout: str):
        self.wl = Workload(name)
        self.n, self.dtype, self.layout = batch, dtype, layout

    def conv(self, c: int, h: int, w: int, k: int, r: int, *, stride: int = 1, pad: int = 0,
             groups: int = 1, act: str = "none", residual: bool = False) -> tuple[int, int]:
        self.wl.add("conv2d", {
            "n": self.n, "c": c, "h": h, "w": w, "k": k, "r": r, "s": r, "stride": stride,
            "pad": pad, "groups": groups, "dtype": self.dtype, "layout": self.layout,
            "bias": True, "activation": act, "residual": residual})
        return output_size(h, w, r, r, (stride, stride), (pad, pad), (1, 1))

    def relu(self, c: int, h: int, w: int) -> None:
        shape = [self.n, h, w, c] if self.layout == "NHWC" else [self.n, c, h, w]
        self.wl.add("activation", {"fn": "relu", "shape": shape, "dtype": self.dtype,
                                   "layout": self.layout, "inplace": True})

    def max_pool(self, c: int, h: int, w: int, k: int, stride: int, pad: int) -> tuple[int, int]:
        self.wl.add("pool2d", {"n": self.n, "c": c, "h": h, "w": w, "mode": "max",
                               "kernel": [k, k], "stride": [stride, stride], "pad": [pad, pad],
                               "dtype": self.dtype, "layout": self.layout})
        return output_size(h, w, k, k, (stride, stride), (pad, pad), (1, 1))

    def head(self, c: int, h: int, w: int, classes: int) -> None:
        self.wl.add("global_avg_pool2d", {"n": self.n, "c": c, "h": h, "w": w,
                                          "dtype": self.dtype, "layout": self.layout})
        self.wl.add("matmul", {"m": self.n, "n": classes, "k": c, "dtype": self.dtype,
                               "bias": True})


def resnet50(batch: int = 32, dtype: str = "float16", layout: str = "NHWC", image: int = 224,
             classes: int = 1000) -> Workload:
    """ResNet-50 v1.5 (torchvision): stride in the 3x3 conv, 3-4-6-3 bottlenecks."""
    net = _Net("resnet50", batch, dtype, layout)
    h, w = net.conv(3, image, image, 64, 7, stride=2, pad=3, act="relu")
    h, w = net.max_pool(64, h, w, 3, 2, 1)
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        cout = width * 4
        for b in range(blocks):
            s = stride if b == 0 else 1
            net.conv(cin, h, w, width, 1, act="relu")
            h2, w2 = net.conv(width, h, w, width, 3, stride=s, pad=1, act="relu")
            if b == 0:  # projection shortcut
                net.conv(cin, h, w, cout, 1, stride=s)
            net.conv(width, h2, w2, cout, 1, residual=True)
            net.relu(cout, h2, w2)
            h, w, cin = h2, w2, cout
    net.head(cin, h, w, classes)
    return net.wl


# (expansion t, output channels c, repeats n, first stride s), from the MobileNetV2 paper
_MBV2 = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
         (6, 160, 3, 2), (6, 320, 1, 1))


def mobilenet_v2(batch: int = 32, dtype: str = "float16", layout: str = "NHWC",
                 image: int = 224, classes: int = 1000) -> Workload:
    """MobileNetV2 1.0: inverted residuals with depthwise 3x3 convs.

    ReLU6 in the conv epilogues, as a patched torch MobileNetV2 sends them."""
    net = _Net("mobilenet_v2", batch, dtype, layout)
    h, w = net.conv(3, image, image, 32, 3, stride=2, pad=1, act="relu6")
    cin = 32
    for t, c, n, s in _MBV2:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            if t != 1:
                net.conv(cin, h, w, hidden, 1, act="relu6")
            h2, w2 = net.conv(hidden, h, w, hidden, 3, stride=stride, pad=1, groups=hidden,
                              act="relu6")
            net.conv(hidden, h2, w2, c, 1, residual=stride == 1 and cin == c)
            h, w, cin = h2, w2, c
    net.conv(cin, h, w, 1280, 1, act="relu6")
    net.head(1280, h, w, classes)
    return net.wl


def small(dtype: str = "float32", layout: str = "NCHW", batch: int = 2) -> Workload:
    """A small mixed workload that tunes in seconds, even on a CPU: convolutions where the
    algorithms really differ (3x3, a large filter for FFT, depthwise, 1x1), a GEMM and the
    memory-bound ops."""
    net = _Net("default", batch, dtype, layout)
    net.conv(32, 28, 28, 32, 3, pad=1, act="relu")
    net.conv(4, 40, 40, 8, 11, pad=5)
    net.conv(64, 28, 28, 64, 3, pad=1, groups=64, act="relu")
    net.conv(64, 14, 14, 128, 1, residual=True)
    net.relu(128, 14, 14)
    net.max_pool(32, 28, 28, 3, 2, 1)
    net.wl.add("global_avg_pool2d", {"n": batch, "c": 128, "h": 7, "w": 7, "dtype": dtype,
                                     "layout": layout})
    net.wl.add("matmul", {"m": 256, "n": 256, "k": 256, "dtype": dtype, "bias": True,
                          "activation": "gelu"})
    net.wl.add("softmax", {"rows": 256, "cols": 1000, "dtype": dtype})
    net.wl.add("layer_norm", {"rows": 256, "cols": 768, "dtype": dtype})
    return net.wl

