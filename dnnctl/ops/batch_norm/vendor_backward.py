"""batch_norm ``bwd_torch`` (``vendor = True``): the training batch_norm backward torch's
autograd runs, as a candidate for the backward problem.

It calls cuDNN's batch-norm backward (``aten::cudnn_batch_norm_backward``, with the empty
reserve a training forward without a fused activation leaves) where torch's own backend
choice for these tensors is cuDNN, else torch's native kernel
(``aten::native_batch_norm_backward``); NHWC problems hand torch the channels-last views, so
cuDNN runs its NHWC kernel and dx's NHWC view needs no copy. Where cuDNN's semi-persistent
kernel keeps x and dy on chip between its two passes it beats dnnctl's two-pass kernel
(0.79-0.90x on the smaller ResNet-50 shapes, H100, benchmarks/RESULTS.md); on the large
ones ours wins. As ``dgrad_torch_cudnn`` is for conv, it is a candidate: a tuned plan names
it where it is the fastest, so the tuned backward is never slower than torch's, and a
patched model's backward then runs torch's own formula for that problem
(dnnctl.torch.grad_plan). Keys with the fused ReLU or residual are left to dnnctl's kernels
(torch's path gates the gradient by the ReLU's saved output, which this problem's inputs do
not have), and affine ones only (cuDNN takes a weight).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dnnctl.ops._memory_common import CudaBackward
from dnnctl.ops.base import SUPPORTED, Kernel, Problem, Support, unsupported
from dnnctl.ops.batch_norm.backward import fused_relu
from dnnctl.ops.registry import register_variant
from dnnctl.ops.torch_vendor import deliver, on_stream, tensor, torch_cuda_missing


@register_variant
class BnBwdTorch(CudaBackward):
    op = "batch_norm"
    name = "bwd_torch"
    vendor = True
    via_torch = True
    deterministic = False  # the library's kernels: no promise of a fixed reduction order
    params: dict[str, tuple] = {}
    doc = ("backward: torch's own training batch_norm backward (cuDNN where torch picks it, "
           "else its native kernel)")

    def supports(self, problem: Problem, device: Any) -> Support:
        why = torch_cuda_missing()
        if why:
            return unsupported(why)
        if fused_relu(problem) or problem.get("residual"):
            return unsupported("a fused ReLU or residual: torch's path needs the ReLU's saved "
                               "output, which this problem does not pass")
        if not problem["affine"]:
            return unsupported("not affine: cuDNN's batch-norm backward takes a weight")
        return SUPPORTED

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        import torch

        aten = torch.ops.aten
        nhwc = problem["layout"] == "NHWC"

        def nchw(t: Any) -> Any:
            return t.permute(0, 3, 1, 2) if nhwc else t

        def run(inputs: Mapping[str, Any], eps: float) -> dict[str, Any]:
            dy, x = nchw(tensor(inputs["dy"])), nchw(tensor(inputs["x"]))
            w = tensor(inputs["weight"])
            mean, invstd = tensor(inputs["save_mean"]), tensor(inputs["save_invstd"])
            got = cudnn_backward(x, dy, w, w, mean, invstd, eps, nhwc)
            if got is None:
                got = aten.native_batch_norm_backward(dy, x, w, None, None, mean, invstd,
                                                      True, eps, [True, True, True])
            dx, dw, db = got
            return {"dx": dx.permute(0, 2, 3, 1) if nhwc else dx, "dweight": dw,
                    "dbias": db}

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> dict[str, Any]:
            native = isinstance(inputs["dy"], torch.Tensor)
            with on_stream(native):
                return deliver(outputs, run(inputs, float(attrs.get("eps", 1e-5))), native)

        kernel.flat_io = True  # type: ignore[attr-defined]  # pointers only
        kernel.adopts = True  # type: ignore[attr-defined]  # torch's outputs
        return kernel


_NO_RESERVE: dict[Any, Any] = {}  # device -> the empty reserve cuDNN's backward is handed


def cudnn_backward(x: Any, dy: Any, weight: Any, bias: Any, mean: Any, invstd: Any,
                   eps: float, channels_last: bool) -> tuple[Any, Any, Any] | None:
    """(dx, dweight, dbias) of a training batch_norm by cuDNN's backward, as torch's
    autograd runs it, on torch tensors (x, dy logical NCHW, 4-D, one dtype; both made dense
    channels-last or contiguous, as ``channels_last`` says x is stored); None where torch would not pick cuDNN for these tensors (its own
    backend choice, which takes the saved statistics' presence for the running ones') or
    where a reserve would have to be handed back (cuDNN's training forward reserves none
    without a fused activation)."""
    import torch

    if (not x.is_cuda or weight is None or bias is None or dy.dtype is not x.dtype
            or x.dim() != 4
            or torch._C._select_batch_norm_backend(x, weight, bias, mean, invstd, True, eps)
            != torch._C._BatchNormBackend.Cudnn
            or torch._C._get_cudnn_batch_norm_reserve_space_size(x, True) != 0):
        return None
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    empty = _NO_RESERVE.get(x.device)
    if empty is None:
        empty = _NO_RESERVE[x.device] = torch.empty(0, dtype=torch.uint8, device=x.device)
    return torch.ops.aten.cudnn_batch_norm_backward(
        x.contiguous(memory_format=fmt), dy.contiguous(memory_format=fmt), weight, None, None,
        mean, invstd, eps, empty)
