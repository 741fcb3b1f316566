"""conv2d ``dgrad_torch_cudnn`` / ``wgrad_torch_cudnn`` (``vendor = True``): cuDNN's data and
weight gradients as torch's autograd runs them.

Both call ``aten::convolution_backward`` with one output of its mask (dx; or dw, plus db when
the key asks for it), the algorithm of torch's own settings (``torch.backends.cudnn
.benchmark``). NHWC problems hand torch the channels-last views of dy / x / w, so cuDNN runs
its NHWC kernels and the result's NHWC view needs no copy. dgrad hands torch an unwritten x
(and wgrad an unwritten w) of the real shape in the key's layout, from torch's caching
allocator: cuDNN reads only dy and w (x and dy), but torch picks the layout of its kernels from
x's and w's strides. With the stride-0 stand-in of ``torch.nn.grad.conv2d_input`` this
variant ran 1.7-11x slower than autograd's own call on the 22 NHWC data gradients of
ResNet-50 at batch 64 (H100, benchmarks/RESULTS.md). float32 problems set cuDNN's TF32
switch to the key's ``tf32`` for the call.

They are candidates like ``torch_cudnn`` for the forward: a tuned plan names them where cuDNN
is the fastest, so a plan is never slower than cuDNN on the backward problems it tuned, and a
patched model's backward then runs torch's own formula for that problem (dnnctl.torch
.grad_plan). Un-tuned, a dense layer's gradients default to cuDNN, except the data
gradient of a 1x1 stride-1 unpadded layer, one GEMM, where ours measured as fast (conv2d.op
._cudnn_gradient_default). Weight gradients may use cuDNN's non-deterministic algorithms
(``deterministic = False``): ``dnnctl.use_deterministic()`` and ``--deterministic`` leave
them out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dnnctl.ops.base import SUPPORTED, Kernel, Problem, Support, unsupported
from dnnctl.ops.conv2d.cuda_base import CudaConv
from dnnctl.ops.conv2d.op import ConvGeom, geometry
from dnnctl.ops.registry import register_variant
from dnnctl.ops.torch_vendor import (
    cudnn_tf32,
    deliver,
    on_stream,
    tensor,
    torch_cuda_missing,
)


class _TorchCudnnBackward(CudaConv):
    vendor = True
    via_torch = True
    deterministic = False  # torch's algorithm pick; wgrad's may accumulate with atomics
    params: dict[str, tuple] = {}

    def supports_geom(self, g: ConvGeom, device: Any) -> Support:
        why = torch_cuda_missing()
        if why:
            return unsupported(why)
        if g.pt != g.pb or g.pl != g.pr:
            return unsupported("asymmetric padding: torch's convolution_backward takes one "
                               "padding per side pair")
        return SUPPORTED

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return 0  # cuDNN's workspace comes from torch's allocator

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        import torch

        g = geometry(problem)
        dgrad = g.pass_ == "dgrad"
        mask = [dgrad, not dgrad, (not dgrad) and g.bias]
        bias_sizes = [g.k] if mask[2] else None
        args = ([g.sh, g.sw], [g.pt, g.pl], [g.dh, g.dw], False, [0, 0], g.groups, mask)
        x_shape = (g.n, g.c, g.h, g.w)
        backward = torch.ops.aten.convolution_backward.default
        tf32 = g.tf32 if g.dtype == "float32" else None
        nhwc = g.nhwc
        fmt = torch.channels_last if nhwc else torch.contiguous_format

        def nchw(t: Any) -> Any:
            return t.permute(0, 3, 1, 2) if nhwc else t

        def run(inputs: Mapping[str, Any]) -> dict[str, Any]:
            dy, w = nchw(tensor(inputs["dy"])), None
            if dgrad:  # x: its shape and layout only
                w = nchw(tensor(inputs["w"]))
                x = torch.empty(x_shape, dtype=dy.dtype, device=dy.device, memory_format=fmt)
            else:  # w: likewise
                x = nchw(tensor(inputs["x"]))
                w = torch.empty((g.k, g.cg, g.r, g.s), dtype=x.dtype, device=x.device,
                                memory_format=fmt)
            dx, dw, db = backward(dy, x, w, bias_sizes, *args)
            if dgrad:
                return {"dx": dx.permute(0, 2, 3, 1) if nhwc else dx}
            out = {"dw": dw.permute(0, 2, 3, 1) if nhwc else dw}
            if mask[2]:
                out["db"] = db
            return out

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> dict[str, Any]:
            native = isinstance(inputs["dy"], torch.Tensor)
            with on_stream(native), cudnn_tf32(tf32):
                return deliver(outputs, run(inputs), native)

        kernel.flat_io = True  # type: ignore[attr-defined]  # pointers only
        kernel.adopts = True  # type: ignore[attr-defined]  # torch's outputs
        return kernel


@register_variant
class TorchCudnnDgrad(_TorchCudnnBackward):
    """cuDNN's data gradient through torch."""

    name = "dgrad_torch_cudnn"
    passes = ("dgrad",)
    doc = "dgrad: cuDNN's backward-data through torch (aten::convolution_backward, dx only)"


@register_variant
class TorchCudnnWgrad(_TorchCudnnBackward):
    """cuDNN's weight gradient (and torch's bias gradient) through torch."""

    name = "wgrad_torch_cudnn"
    passes = ("wgrad",)
    doc = ("wgrad: cuDNN's backward-filter through torch (aten::convolution_backward, dw and "
           "db)")
