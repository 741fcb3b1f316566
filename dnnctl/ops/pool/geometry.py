"""Pooling geometry shared by the forward and backward variants: output sizes (PyTorch's
rules, ceil mode included), average-pooling divisors and the kernels' compiled-in geometry."""

from __future__ import annotations

from typing import Any

import numpy as np

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import Problem


def out_size(size: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    """PyTorch's pooling output size (a ceil-mode window must start inside input + pad)."""
    num = size + 2 * p - d * (k - 1) - 1
    o = (num + (s - 1 if ceil else 0)) // s + 1
    if ceil and (o - 1) * s >= size + p:
        o -= 1
    return o


def out_hw(problem: Problem) -> tuple[int, int]:
    (kr, ks), (sh, sw) = problem["kernel"], problem["stride"]
    (ph, pw), (dh, dw) = problem["pad"], problem["dilation"]
    ceil = problem["ceil_mode"]
    return (out_size(problem["h"], kr, sh, ph, dh, ceil),
            out_size(problem["w"], ks, sw, pw, dw, ceil))


def kernel_defines(problem: Problem) -> dict[str, Any]:
    """The -D geometry the pooling kernels (forward and backward) compile in."""
    (kr, ks), (sh, sw) = problem["kernel"], problem["stride"]
    (ph, pw), (dh, dw) = problem["pad"], problem["dilation"]
    oh, ow = out_hw(problem)
    return {"DNNCTL_DTYPE": mc.DTYPE_CODE[problem["dtype"]], "H": problem["h"],
            "W": problem["w"], "C": problem["c"], "OH": oh, "OW": ow, "KR": kr, "KS": ks,
            "SH": sh, "SW": sw, "PH": ph, "PW": pw, "DH": dh, "DW": dw,
            "MODE": int(problem["mode"] == "avg"), "CIP": int(problem["count_include_pad"]),
            "LAYOUT": int(problem["layout"] == "NHWC")}


def out_shape(problem: Problem) -> tuple[int, int, int, int]:
    oh, ow = out_hw(problem)
    n, c = problem["n"], problem["c"]
    return (n, c, oh, ow) if problem["layout"] == "NCHW" else (n, oh, ow, c)


def avg_divisor(problem: Problem) -> np.ndarray:
    """(OH, OW) divisors of average pooling (PyTorch's rule, dilation 1)."""
    oh, ow = out_hw(problem)
    out = []
    for o, size, k, s, p in ((oh, problem["h"], problem["kernel"][0], problem["stride"][0],
                              problem["pad"][0]),
                             (ow, problem["w"], problem["kernel"][1], problem["stride"][1],
                              problem["pad"][1])):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, size + p)
        full = end - start
        real = np.minimum(end, size) - np.maximum(start, 0)
        out.append(full if problem["count_include_pad"] else real)
    return (out[0][:, None] * out[1][None, :]).astype(np.float64)
