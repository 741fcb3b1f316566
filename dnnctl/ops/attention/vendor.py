"""Vendor attention candidates (``vendor = True``): torch's SDPA backends, cuDNN through
nvidia-cudnn-frontend, and flash-attn, each where importable.

The kernels read only data pointers (``flat_io``): a torch caller's tensors arrive as they
are and the library runs on torch's current stream, which the pipeline has made the call's
stream (a side stream and a graph capture included); CuPy arrays (the tuner's, a CuPy
caller's) are viewed through ``torch.from_dlpack`` and run on CuPy's current stream wrapped
as a torch external stream. The libraries allocate their own results, so the kernels
*adopt* their outputs (``adopts``, see ``dnnctl.ops.dispatch.adopting``): called without
``out`` / ``lse`` (or dq / dk / dv), they return the library's tensors (a CuPy view of them
for CuPy inputs) instead of copying them into ours; an output that is passed is written
with one copy. ``supports()`` answers for the features each library has; the tuner times
them as the pipeline calls them, so a plan picks whichever is fastest.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Mapping
from typing import Any

from dnnctl.backends import replay
from dnnctl.ops.attention.cupy_variants import CupyAttention
from dnnctl.ops.attention.op import attn_scale, lse_shape
from dnnctl.ops.base import SUPPORTED, Kernel, Problem, Support, unsupported
from dnnctl.ops.registry import register_variant
from dnnctl.ops.torch_vendor import (
    deliver,
    on_stream,
    tensor,
    torch_cuda_missing,
    torch_tensor_type,
)


@functools.cache
def _flash_has_block_table() -> bool:
    import torch

    schema = torch.ops.aten._flash_attention_forward.default._schema
    return any(a.name == "block_table" for a in schema.arguments)


def _bshd(p: Problem, x: Any) -> Any:
    """(B, S, H, D) view of a q/k/v/out tensor in the problem's layout."""
    return x.transpose(1, 2) if not p["varlen"] and p["layout"] == "BHSD" else x


def _bhsd(p: Problem, x: Any) -> Any:
    return x if p["layout"] == "BHSD" else x.transpose(1, 2)


class _TorchBase(CupyAttention):
    vendor = True
    via_torch = True
    deterministic = True
    aten_call = True  # the runner's library call is one ATen operator's

    def supports(self, problem: Problem, device: Any) -> Support:
        why = torch_cuda_missing()
        if why:
            return unsupported(why)
        p = problem
        if p["head_dim"] != p["head_dim_v"]:
            return unsupported("torch's fused SDPA kernels need head_dim == head_dim_v")
        if p["head_dim"] % 8 or p["head_dim"] > 256:
            return unsupported("head_dim must be a multiple of 8 and at most 256")
        if p["softcap"]:
            return unsupported("torch's SDPA has no softcap")
        return self.more(p)

    def more(self, p: Problem) -> Support:
        return SUPPORTED

    # the library's view of q / k / v / out: (B, S, H, D), or _bhsd's (B, H, S, D)
    layout = staticmethod(_bshd)

    def operands(self, p: Problem, inputs: Mapping[str, Any]) -> tuple[Any, Any, Any]:
        """q, k, v as the library takes them."""
        q, k, v = (self.layout(p, tensor(inputs[n])) for n in ("q", "k", "v"))
        return q, k, v

    def runner(self, p: Problem) -> Any:
        """``run(q, k, v, inputs, scale) -> (out, lse)``: the library's forward call."""
        raise NotImplementedError

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        p = problem
        run = self.runner(p)

        lse_rows = lse_shape(p)
        native_kind = torch_tensor_type()

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> dict[str, Any]:
            native = isinstance(inputs["q"], native_kind)
            q, k, v = self.operands(p, inputs)
            with on_stream(native):
                out, lse = run(q, k, v, inputs, attn_scale(p, attrs))
                return deliver(outputs, {"out": self.layout(p, out),
                                         "lse": lse.reshape(lse_rows)}, native,
                               strided=("out",))

        kernel.flat_io = True  # type: ignore[attr-defined]  # pointers only
        # torch's SDPA reads strides: a torch caller's q / k / v as they are (a packed qkv's
        # views), and its out in torch's own layout (B, S, H, D) memory, as SDPA returns it
        # (lse dense: the backward's and the tests' row layout)
        kernel.strided_io = True  # type: ignore[attr-defined]
        kernel.adopts = True  # type: ignore[attr-defined]  # the library's out / lse
        # one ATen call (recorded: replay.note_aten), its results seen through views: the
        # dispatcher may replay it from C++ (a copy of a result refuses the recording)
        kernel.replayable = self.aten_call  # type: ignore[attr-defined]
        return kernel


@register_variant
class TorchFlash(_TorchBase):
    """torch's FlashAttention-2 (aten::_flash_attention_forward): GQA, bottom-right causal,
    sliding windows, varlen, paged caches of 256-multiple pages."""

    name = "torch_flash"
    doc = "torch FlashAttention-2 backend (aten::_flash_attention_forward)"

    def more(self, p: Problem) -> Support:
        if p["causal"] == "top_left" and p["seq_q"] != p["seq_kv"] or (
                p["varlen"] and p["causal"] == "top_left"):
            return unsupported("flash-attn's causal mask is bottom-right aligned")
        if p["varlen"] and "backward" not in self.passes:
            # measured on torch 2.11: out right, lse rows not in the (Hq, Tq) layout
            return unsupported("torch's varlen flash forward returns its lse in another "
                               "layout (not wired)")
        if p["paged"]:
            if not _flash_has_block_table():
                return unsupported("this torch's aten::_flash_attention_forward takes no "
                                   "block_table (paged KV)")
            if p["paged"] % 256:
                return unsupported("flash-attn pages are multiples of 256 tokens")
        return SUPPORTED

    def operands(self, p: Problem, inputs: Mapping[str, Any]) -> tuple[Any, Any, Any]:
        if not p["paged"]:
            return super().operands(p, inputs)
        return _bshd(p, tensor(inputs["q"])), tensor(inputs["k"]), tensor(inputs["v"])

    def runner(self, p: Problem) -> Any:
        import torch

        fwd = torch.ops.aten._flash_attention_forward.default
        causal = p["causal"] != "none"
        w = p["window"]
        left, right = (w, 0 if causal else w) if w else (None, None)

        def run(q: Any, k: Any, v: Any, inputs: Mapping[str, Any], scale: float) -> Any:
            cq = tensor(inputs["cu_seqlens_q"]) if p["varlen"] else None
            ck = tensor(inputs["cu_seqlens_k"]) if p["varlen"] else None
            paged = {"seqused_k": tensor(inputs["seqused_k"]),
                     "block_table": tensor(inputs["block_table"])} if p["paged"] else {}
            args = (q, k, v, cq, ck, p["seq_q"], p["seq_kv"], 0.0, causal, False)
            kw = {"scale": scale, "window_size_left": left, "window_size_right": right,
                  **paged}
            res = fwd(*args, **kw)
            replay.note_aten(fwd, args, kw, res)
            return res[0], res[1]

        return run


class _TorchDense(_TorchBase):
    """Shared limits of the efficient / cuDNN backends: dense, equal heads (unless the
    backend takes GQA), top-left causal."""

    def takes_gqa(self, p: Problem) -> bool:
        return False

    def more(self, p: Problem) -> Support:
        if p["varlen"] or p["paged"] or p["window"]:
            return unsupported(f"{self.name}: no varlen, paged KV or window here")
        if p["heads_q"] != p["heads_kv"] and not self.takes_gqa(p):
            return unsupported(f"{self.name} takes equal query / key heads (no GQA)")
        if p["causal"] == "bottom_right":
            return unsupported(f"{self.name}'s causal mask is top-left aligned")
        return SUPPORTED


@register_variant
class TorchEfficient(_TorchDense):
    """torch's memory-efficient (CUTLASS) backend."""

    name = "torch_efficient"
    doc = "torch memory-efficient SDPA backend (aten::_efficient_attention_forward)"

    def runner(self, p: Problem) -> Any:
        import torch

        fwd = torch.ops.aten._efficient_attention_forward.default
        mask_type = 1 if p["causal"] == "top_left" else 0

        def run(q: Any, k: Any, v: Any, inputs: Mapping[str, Any], scale: float) -> Any:
            args = (q, k, v, None, None, None, p["seq_q"], p["seq_kv"], 0.0, mask_type, True)
            res = fwd(*args, scale=scale)
            replay.note_aten(fwd, args, {"scale": scale}, res)
            return res[0], res[1][..., :p["seq_q"]]  # lse rows padded to 32

        return run


@functools.cache
def _cudnn_takes_gqa() -> bool:
    """torch's cuDNN attention op takes k / v with fewer heads than q: measured on torch
    2.11 with cuDNN 9.19 (H200: decode B8 32/8 heads over 4096 keys, 129 x 300 keys at
    16/2, causal 8/1; relative error 0.002 against the expanded-heads reference). Older
    builds keep the equal-heads rule."""
    import torch

    parts = torch.__version__.split("+")[0].split(".")
    try:
        return (int(parts[0]), int(parts[1])) >= (2, 11)
    except (ValueError, IndexError):
        return False


@register_variant
class TorchCudnn(_TorchDense):
    """cuDNN's fused flash attention as torch calls it (GQA on torch >= 2.11, BHSD)."""

    name = "torch_cudnn"
    doc = "torch cuDNN SDPA backend (aten::_scaled_dot_product_cudnn_attention)"

    layout = staticmethod(_bhsd)

    def takes_gqa(self, p: Problem) -> bool:
        # measured: the forward on contiguous BHSD operands (not the backward, not BSHD views)
        return "forward" in self.passes and p["layout"] == "BHSD" and _cudnn_takes_gqa()

    def runner(self, p: Problem) -> Any:
        import torch

        fwd = torch.ops.aten._scaled_dot_product_cudnn_attention.default
        causal = p["causal"] == "top_left"

        def run(q: Any, k: Any, v: Any, inputs: Mapping[str, Any], scale: float) -> Any:
            args = (q, k, v, None, True, 0.0, causal, False)
            res = fwd(*args, scale=scale)
            replay.note_aten(fwd, args, {"scale": scale}, res)
            return res[0], res[1]

        return run


@register_variant
class FlashAttnPackage(_TorchBase):
    """The flash-attn package (Dao-AILab) when importable: softcap too."""

    name = "flash_attn"
    doc = "flash-attn package flash_attn_func / flash_attn_varlen_func"
    aten_call = False  # the package's own extension: nothing a replay can call again

    def supports(self, problem: Problem, device: Any) -> Support:
        if importlib.util.find_spec("flash_attn") is None:
            return unsupported("flash-attn is not installed")
        why = torch_cuda_missing()
        if why:
            return unsupported(why)
        p = problem
        if p["head_dim"] != p["head_dim_v"] or p["head_dim"] % 8 or p["head_dim"] > 256:
            return unsupported("flash-attn needs head_dim == head_dim_v, a multiple of 8, <= 256")
        if p["paged"]:
            return unsupported("paged caches go through flash_attn_with_kvcache (not wired)")
        if p["causal"] == "top_left" and (p["seq_q"] != p["seq_kv"] or p["varlen"]):
            return unsupported("flash-attn's causal mask is bottom-right aligned")
        return SUPPORTED

    def runner(self, p: Problem) -> Any:
        import flash_attn

        causal = p["causal"] != "none"
        w = p["window"]
        window = (w, 0 if causal else w) if w else (-1, -1)

        def run(q: Any, k: Any, v: Any, inputs: Mapping[str, Any], scale: float) -> Any:
            kw = dict(softmax_scale=scale, causal=causal, window_size=window,
                      softcap=p["softcap"], return_attn_probs=True)
            if p["varlen"]:
                cq, ck = tensor(inputs["cu_seqlens_q"]), tensor(inputs["cu_seqlens_k"])
                res = flash_attn.flash_attn_varlen_func(q, k, v, cq, ck, p["seq_q"],
                                                        p["seq_kv"], **kw)
            else:
                res = flash_attn.flash_attn_func(q, k, v, **kw)
            return res[0], res[1]

        return run


@functools.cache
def _unread_rng(device: Any, shape: Any) -> Any:
    """The philox seed / offset a backward op takes: without dropout it is never read, so
    one tensor per device serves every call (no allocation and fill per call)."""
    import torch

    return torch.zeros(shape, dtype=torch.int64, device=device)


@register_variant
class TorchFlashBackward(TorchFlash):
    """torch's FlashAttention-2 backward (aten::_flash_attention_backward): dq, dk, dv from
    the forward's out and lse; GQA, bottom-right causal, windows, varlen."""

    name = "torch_flash_bwd"
    passes = ("backward",)
    deterministic = False  # dq is accumulated with atomics
    doc = "torch FlashAttention-2 backward (aten::_flash_attention_backward)"

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        import torch

        p = problem
        bwd = torch.ops.aten._flash_attention_backward.default
        causal = p["causal"] != "none"
        w = p["window"]
        left, right = (w, 0 if causal else w) if w else (None, None)
        native_kind = torch.Tensor

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> dict[str, Any]:
            t = {n: tensor(inputs[n]) for n in ("q", "k", "v", "out", "dout", "lse")}
            q, k, v, o, do = (_bshd(p, t[n]) for n in ("q", "k", "v", "out", "dout"))
            cq = tensor(inputs["cu_seqlens_q"]) if p["varlen"] else None
            ck = tensor(inputs["cu_seqlens_k"]) if p["varlen"] else None
            rng = _unread_rng(q.device, 2)
            native = isinstance(inputs["q"], native_kind)
            with on_stream(native):
                dq, dk, dv = bwd(do, q, k, v, o, t["lse"], cq, ck, p["seq_q"], p["seq_kv"],
                                 0.0, causal, rng, rng, scale=attn_scale(p, attrs),
                                 window_size_left=left, window_size_right=right)
                return deliver(outputs, {"dq": _bshd(p, dq), "dk": _bshd(p, dk),
                                         "dv": _bshd(p, dv)}, native)

        kernel.flat_io = True  # type: ignore[attr-defined]  # pointers only
        kernel.adopts = True  # type: ignore[attr-defined]  # the library's gradients
        return kernel


@register_variant
class TorchCudnnBackward(TorchCudnn):
    """cuDNN's fused flash attention backward as torch calls it
    (aten::_scaled_dot_product_cudnn_attention_backward): dq, dk, dv from the forward's out
    and lse (cuDNN's softmax statistics are the natural-log lse, shaped (B, H, Sq, 1))."""

    name = "torch_cudnn_bwd"
    passes = ("backward",)
    deterministic = False  # cuDNN's backward accumulates dq in no fixed order
    doc = "torch cuDNN SDPA backward (aten::_scaled_dot_product_cudnn_attention_backward)"

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        import torch

        p = problem
        bwd = torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default
        causal = p["causal"] == "top_left"
        stats = (p["batch"], p["heads_q"], p["seq_q"], 1)
        native_kind = torch.Tensor

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> dict[str, Any]:
            t = {n: tensor(inputs[n]) for n in ("q", "k", "v", "out", "dout", "lse")}
            q, k, v, o, do = (_bhsd(p, t[n]) for n in ("q", "k", "v", "out", "dout"))
            rng = _unread_rng(q.device, ())
            native = isinstance(inputs["q"], native_kind)
            with on_stream(native):
                grads = bwd(do, q, k, v, o, t["lse"].reshape(stats), rng, rng, None, None,
                            None, p["seq_q"], p["seq_kv"], 0.0, causal,
                            scale=attn_scale(p, attrs))
                return deliver(outputs, {name: _bhsd(p, val) for name, val in
                                         zip(("dq", "dk", "dv"), grads)}, native)

        kernel.flat_io = True  # type: ignore[attr-defined]  # pointers only
        kernel.adopts = True  # type: ignore[attr-defined]  # the library's gradients
        return kernel
