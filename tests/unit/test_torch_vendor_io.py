"""native_io: how the tuner hands a variant its inputs. A library called through torch gets
torch views of CuPy arrays (tested on the GPU by the tuner's runs); anything else, and any
variant on the numpy backend, gets its inputs as they are and its results back unchanged."""

from __future__ import annotations

import numpy as np

from dnnctl.ops.registry import get_variant, variants
from dnnctl.ops.torch_vendor import native_io


def test_torch_vendors_are_flagged_and_own_kernels_are_not():
    every = [v for op in ("conv2d", "attention", "matmul") for v in variants(op, "cupy")]
    flagged = {(v.op, v.name) for v in every if v.via_torch}
    assert {("conv2d", "torch_cudnn"), ("conv2d", "dgrad_torch_cudnn"),
            ("conv2d", "wgrad_torch_cudnn"), ("attention", "torch_flash")} <= flagged
    assert all(v.vendor for v in every if v.via_torch)
    assert not get_variant("conv2d", "cupy", "implicit_gemm").via_torch


def test_numpy_inputs_pass_through_unchanged():
    x = np.ones((2, 3), np.float32)
    for variant in (get_variant("conv2d", "cupy", "torch_cudnn"),
                    get_variant("conv2d", "numpy", "direct")):
        with native_io(variant, {"x": x, "bias": None}) as (args, back):
            assert args["x"] is x and args["bias"] is None
            made = {"y": x}
            assert back(made) is made
