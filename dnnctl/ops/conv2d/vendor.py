"""conv2d ``torch_cudnn`` (``vendor = True``): cuDNN's convolution as torch calls it, with
dnnctl's epilogue.

The convolution runs through ``aten::convolution`` (cuDNN on a CUDA build, the algorithm of
torch's own settings: ``torch.backends.cudnn.benchmark``) without its bias; the epilogue
(bias -> activation -> residual, dnnctl's order) then runs in one in-place pass of
kernels/conv2d/epilogue.cu, so its numerics are the other variants'. With ``fuse`` 1 a
conv + bias + ReLU problem runs ``torch.cudnn_convolution_relu`` instead, and a ResNet
block's end, relu(conv + bias + residual) (``residual_before_act``),
``torch.cudnn_convolution_add_relu``: one cuDNN fusion graph, no separate pass.

NHWC problems hand torch the channels-last views of x (N, H, W, C) and w (K, R, S, C/g) (a
torch caller's channels-last tensors as they are: ``attrs["channels_last"]``); the result
comes back channels-last, so its NHWC view needs no copy. Asymmetric padding is
applied by ``F.pad`` first (one more pass). float32 problems set cuDNN's TF32 switch to the
key's ``tf32`` for the call. The kernel reads pointers only (``flat_io``) and adopts torch's
output (``adopts``): see dnnctl.ops.torch_vendor. A tuned plan names this variant where cuDNN
is the fastest candidate, so a plan is never slower than cuDNN on the shapes it tuned.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dnnctl.backends import cuda, replay
from dnnctl.ops.base import SUPPORTED, Kernel, Problem, Support, unsupported
from dnnctl.ops.conv2d import _cuda
from dnnctl.ops.conv2d.cuda_base import CudaConv, Epilogue
from dnnctl.ops.conv2d.op import ConvGeom, geometry
from dnnctl.ops.registry import register_variant
from dnnctl.ops.torch_vendor import (
    cudnn_tf32,
    deliver,
    on_stream,
    tensor,
    torch_cuda_missing,
)


def _has_fused_relu() -> bool:
    import torch

    return hasattr(torch, "cudnn_convolution_relu")


def _has_fused_add_relu() -> bool:
    import torch

    return hasattr(torch, "cudnn_convolution_add_relu")


def _picks_cudnn(seen: dict[tuple, bool], x: Any, w: Any, stride: list[int],
                 padding: list[int], dilation: list[int], groups: int) -> bool:
    """Whether torch's convolution of ``x`` and ``w`` (no bias) calls cuDNN's, asked once
    per kernel and memory layout of the two (shapes and dtype are the problem's)."""
    key = (x.stride(), w.stride())
    got = seen.get(key)
    if got is None:
        import torch

        select = getattr(torch._C, "_select_conv_backend", None)
        got = seen[key] = select is not None and select(
            x, w, None, stride, padding, dilation, False, [0, 0], groups
        ) == torch._C._ConvBackend.Cudnn
    return got


@register_variant
class TorchCudnnConv(CudaConv):
    """cuDNN through torch + dnnctl's one-pass epilogue (or cuDNN's conv + bias + ReLU)."""

    name = "torch_cudnn"
    vendor = True
    via_torch = True
    # not bitwise repeatable across processes: cuDNN's algorithm is torch's pick (its
    # benchmark mode may choose another one in the next run)
    deterministic = False
    doc = ("cuDNN convolution through torch (aten::convolution, or cudnn_convolution_relu / "
           "_add_relu with fuse=1) + dnnctl's in-place epilogue")
    params = {"fuse": (0, 1)}

    def supports_geom(self, g: ConvGeom, device: Any) -> Support:
        why = torch_cuda_missing()
        if why:
            return unsupported(why)
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        if not params["fuse"]:
            return True
        g = geometry(problem)
        if g.activation != "relu":
            return False
        if g.residual:  # relu(conv + bias + residual): cuDNN's conv + add + ReLU graph
            return g.residual_before_act and _has_fused_add_relu()
        return _has_fused_relu()

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        """cuDNN's fused conv + bias + ReLU where the problem is that: measured on the H100
        (tools/conv_probe.py, ResNet-50 batch-32 layers, fp16 NHWC) at 0.45-0.71x the time
        of the conv with a separate bias and ReLU."""
        fuse = {"fuse": 1}
        return fuse if self.valid_params(problem, fuse, device) else {"fuse": 0}

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return 0  # cuDNN's workspace comes from torch's allocator

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        import torch
        import torch.nn.functional as F

        g = geometry(problem)
        fused = bool(params["fuse"])
        symmetric = g.pt == g.pb and g.pl == g.pr
        padding = [g.pt, g.pl] if symmetric else [0, 0]
        pad4 = None if symmetric else (g.pl, g.pr, g.pt, g.pb)  # F.pad: W first, then H
        stride, dilation, groups = [g.sh, g.sw], [g.dh, g.dw], g.groups
        # torch's Python binding of aten::convolution: ~4 us less host time per call than
        # the torch.ops OpOverload (3.0 against 6.9 us on the CPU box)
        conv = torch.convolution
        aten = torch.ops.aten
        conv_relu = torch.cudnn_convolution_relu if fused and not g.residual else None
        conv_add_relu = torch.cudnn_convolution_add_relu if fused and g.residual else None
        epi = Epilogue(_cuda.runtime(), g) if not fused and _cuda.needs_epilogue(g) else None
        tf32 = g.tf32 if g.dtype == "float32" else None
        nhwc = g.nhwc
        # where torch's convolution would call cuDNN's for these tensors, call it the way
        # aten::convolution does (its switches read per call), without aten::convolution's
        # own argument checks and backend choice: ~2-3 us less host time a call. Half
        # types only (a float32 call's TF32 switch is read per op kind in newer torch)
        to_cudnn: dict[tuple, bool] = {}  # x's and w's strides -> torch would pick cuDNN
        cudnn_conv = torch.cudnn_convolution if g.dtype != "float32" else None
        _C = torch._C

        def run(inputs: Mapping[str, Any], cl: bool) -> Any:
            x, w = tensor(inputs["x"]), tensor(inputs["w"])
            if nhwc and not cl:  # torch's (N, C, H, W) / (K, C/g, R, S) channels-last views
                x, w = x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2)
            if pad4 is not None:
                cuda.refuse("a padded copy of x")
                x = F.pad(x, pad4)
            if conv_relu is not None:
                bias = tensor(inputs["bias"]) if g.bias else None
                args: tuple = (x, w, bias, stride, padding, dilation, groups)
                raw, op = conv_relu(*args), aten.cudnn_convolution_relu.default
            elif conv_add_relu is not None:
                bias = tensor(inputs["bias"]) if g.bias else None
                z = tensor(inputs["residual"])
                if nhwc and not cl:
                    z = z.permute(0, 3, 1, 2)
                args = (x, w, z, 1.0, bias, stride, padding, dilation, groups)
                raw, op = conv_add_relu(*args), aten.cudnn_convolution_add_relu.default
            elif cudnn_conv is not None and _C._get_cudnn_enabled() and _picks_cudnn(
                    to_cudnn, x, w, stride, padding, dilation, groups):
                args = (x, w, padding, stride, dilation, groups, _C._get_cudnn_benchmark(),
                        _C._get_cudnn_deterministic() or _C._get_deterministic_algorithms(),
                        _C._get_cudnn_allow_tf32())
                raw, op = cudnn_conv(*args), aten.cudnn_convolution.default
            else:
                args = (x, w, None, stride, padding, dilation, False, [0, 0], groups)
                raw, op = conv(*args), aten.convolution.default
            # (a replay's C++ makes the same call: cuDNN's settings are read there as here)
            replay.note_aten(op, args, {}, raw)
            y = raw.permute(0, 2, 3, 1) if nhwc else raw
            if not y.is_contiguous():
                cuda.refuse("a contiguous copy of the result")
                y = y.contiguous()
            if epi is not None:  # in place, on the call's stream (the library's too)
                epi(y, inputs)
            return y

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> dict[str, Any]:
            native = isinstance(inputs["x"], torch.Tensor)
            # a channels-last call's torch tensors are already (N, C, H, W) views
            cl = native and bool(attrs.get("channels_last"))
            if tf32 is not None:  # (a setting a replay would not make around its call)
                cuda.refuse("cuDNN's TF32 switch set for the call")
            with on_stream(native), cudnn_tf32(tf32):
                return deliver(outputs, {"y": run(inputs, cl)}, native)

        kernel.flat_io = True  # type: ignore[attr-defined]  # pointers only
        kernel.adopts = True  # type: ignore[attr-defined]  # torch's output
        # cuDNN's call (recorded: replay.note_aten) and the epilogue's launch, nothing else
        # a replay would miss (a padded or copied tensor refuses the recording)
        kernel.replayable = True  # type: ignore[attr-defined]
        return kernel
