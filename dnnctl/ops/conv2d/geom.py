"""conv2d geometry shared by the op and its backward pass: the key's shape fields as a
:class:`ConvGeom`, padding forms, output sizes, the float64 reference convolution, layouts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dnnctl.errors import UsageError
from dnnctl.ops.base import Problem
from dnnctl.ops.matmul.op import activation_ref

# the epilogue's activations (relu6 / hardswish: MobileNetV2 / V3's conv + BN + act)
ACTIVATIONS: tuple[str, ...] = ("none", "relu", "gelu", "silu", "relu6", "hardswish")
# NCHW on tensor cores: above this many FLOPs the layout transposes of nhwc_implicit_gemm
# cost less than the element-wise NCHW patch gather of implicit_gemm
NCHW_TRANSPOSE_FLOPS = 5e8
LAYOUTS: tuple[str, ...] = ("NCHW", "NHWC")
CONV_PASSES: tuple[str, ...] = ("forward", "dgrad", "wgrad")


# ----------------------------------------------------------------------------- geometry


def pad4(pad: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) of a canonical pad (2 values: symmetric, or 4)."""
    if len(pad) == 2:
        return (pad[0], pad[0], pad[1], pad[1])
    if len(pad) == 4:
        return (pad[0], pad[1], pad[2], pad[3])
    raise UsageError(f"conv2d pad {pad!r} must have 2 or 4 values")


def canonical_pad(pad: tuple[int, ...]) -> tuple[int, ...]:
    """1 value -> (p, p); 4 values -> 2 when top == bottom and left == right."""
    if len(pad) == 1:
        return (pad[0], pad[0])
    if len(pad) == 2:
        return tuple(pad)
    if len(pad) == 4:
        top, bottom, left, right = pad
        return (top, left) if top == bottom and left == right else tuple(pad)
    raise UsageError(f"conv2d key field 'pad': {list(pad)} must have 1, 2 or 4 values",
                     hint="pad is [ph, pw] or [top, bottom, left, right]")


def output_size(h: int, w: int, r: int, s: int, stride: tuple[int, int],
                pad: tuple[int, ...], dilation: tuple[int, int]) -> tuple[int, int]:
    """Output (P, Q) of a convolution, as cuDNN and PyTorch compute it (floor mode)."""
    top, bottom, left, right = pad4(tuple(pad))
    p = (h + top + bottom - dilation[0] * (r - 1) - 1) // stride[0] + 1
    q = (w + left + right - dilation[1] * (s - 1) - 1) // stride[1] + 1
    return p, q


@dataclass(frozen=True)
class ConvGeom:
    """Every size of one conv2d problem as plain ints (what kernels are launched with)."""

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    sh: int
    sw: int
    pt: int
    pb: int
    pl: int
    pr: int
    dh: int
    dw: int
    groups: int
    p: int
    q: int
    dtype: str
    layout: str
    bias: bool
    activation: str
    residual: bool
    tf32: bool
    pass_: str = "forward"
    residual_before_act: bool = False  # act(conv + bias + residual)

    @property
    def cg(self) -> int:
        """Input channels per group."""
        return self.c // self.groups

    @property
    def kg(self) -> int:
        """Output channels per group."""
        return self.k // self.groups

    @property
    def nhwc(self) -> bool:
        return self.layout == "NHWC"

    @property
    def identity(self) -> bool:
        """1x1, stride 1, no padding: the patch matrix would be x itself (one GEMM)."""
        return (self.r, self.s, self.sh, self.sw, self.pt, self.pb, self.pl, self.pr) == (
            1, 1, 1, 1, 0, 0, 0, 0)

    @property
    def depthwise(self) -> bool:
        """One group per input channel (K/C output channels each)."""
        return self.groups == self.c

    @property
    def crs(self) -> int:
        """Reduction length of one output element (C/g * R * S)."""
        return self.cg * self.r * self.s

    @property
    def npq(self) -> int:
        return self.n * self.p * self.q

    def x_shape(self) -> tuple[int, ...]:
        return (self.n, self.h, self.w, self.c) if self.nhwc else (self.n, self.c, self.h, self.w)

    def w_shape(self) -> tuple[int, ...]:
        if self.nhwc:
            return (self.k, self.r, self.s, self.cg)
        return (self.k, self.cg, self.r, self.s)

    def y_shape(self) -> tuple[int, ...]:
        return (self.n, self.p, self.q, self.k) if self.nhwc else (self.n, self.k, self.p, self.q)


def geometry(problem: Problem) -> ConvGeom:
    """The :class:`ConvGeom` of a normalized conv2d problem."""
    top, bottom, left, right = pad4(problem["pad"])
    sh, sw = problem["stride"]
    dh, dw = problem["dilation"]
    p, q = output_size(problem["h"], problem["w"], problem["r"], problem["s"],
                       (sh, sw), (top, bottom, left, right), (dh, dw))
    return ConvGeom(
        n=problem["n"], c=problem["c"], h=problem["h"], w=problem["w"], k=problem["k"],
        r=problem["r"], s=problem["s"], sh=sh, sw=sw, pt=top, pb=bottom, pl=left, pr=right,
        dh=dh, dw=dw, groups=problem["groups"], p=p, q=q, dtype=problem["dtype"],
        layout=problem["layout"], bias=problem["bias"], activation=problem["activation"],
        residual=problem["residual"], tf32=problem["tf32"],
        pass_=problem.get("pass", "forward"),
        residual_before_act=bool(problem.get("residual_before_act", False)))


# ----------------------------------------------------------------------------- reference


def apply_activation(y: np.ndarray, activation: str) -> np.ndarray:
    """relu / gelu (erf form) / silu in the array's precision (float64 in the reference):
    matmul's reference activation, the same epilogue."""
    return y if activation == "none" else activation_ref(y, activation).astype(y.dtype)


def conv_nchw(x: np.ndarray, w: np.ndarray, g: ConvGeom) -> np.ndarray:
    """Plain convolution (no epilogue) of NCHW ``x`` with (K, C/g, R, S) ``w``, in x's dtype.

    Loops over the R*S filter taps; each tap is one strided view of the padded input and one
    batched matmul over the groups.
    """
    xp = np.pad(x, ((0, 0), (0, 0), (g.pt, g.pb), (g.pl, g.pr)))
    hp, wp = xp.shape[2], xp.shape[3]
    xg = xp.reshape(g.n, g.groups, g.cg, hp, wp)
    wg = w.reshape(g.groups, g.kg, g.cg, g.r, g.s)
    y = np.zeros((g.n, g.groups, g.kg, g.p * g.q), dtype=x.dtype)
    for r in range(g.r):
        h0 = r * g.dh
        for s in range(g.s):
            w0 = s * g.dw
            tap = xg[:, :, :, h0:h0 + (g.p - 1) * g.sh + 1:g.sh,
                     w0:w0 + (g.q - 1) * g.sw + 1:g.sw]
            tap = tap.reshape(g.n, g.groups, g.cg, g.p * g.q)
            y += np.matmul(wg[:, :, :, r, s], tap)
    return y.reshape(g.n, g.k, g.p, g.q)


def to_nchw(x: np.ndarray, layout: str) -> np.ndarray:
    return x.transpose(0, 3, 1, 2) if layout == "NHWC" else x


def from_nchw(y: np.ndarray, layout: str) -> np.ndarray:
    return y.transpose(0, 2, 3, 1) if layout == "NHWC" else y


