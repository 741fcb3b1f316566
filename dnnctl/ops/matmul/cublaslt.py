"""matmul ``cublaslt``: cuBLASLt's matmul with its own fused epilogue (one kernel).

What torch runs for ``F.linear`` + activation is cuBLAS and then a separate elementwise
kernel; cuBLASLt applies bias, relu or gelu in the GEMM's epilogue (the same path as
torch's ``_addmm_activation``), so the output is written once. fp16 / bf16 in and out with
fp32 compute and scale; any trans_a / trans_b; batches by stride (bias shared). Runs on the
call's stream with the seam's handle and workspace (dnnctl/backends/cublaslt.py): nothing is
allocated in a call, so it can be captured in a CUDA graph.

From torch CUDA tensors, a single product (batch 1) runs through torch's own C++ path to
the same library: ``_addmm_activation`` (cuBLASLt's RELU_BIAS / GELU_BIAS epilogue, gelu in
the same tanh form), ``addmm`` (its BIAS epilogue), or ``mm`` and an in-place relu / tanh
gelu where there is no bias. Those are ATen operators, which a replay records and calls
again from C++ (:func:`dnnctl.backends.replay.note_aten`); the ctypes call refuses a
recording. Torch's heuristic picks the algorithm, which may differ from this variant's (same
library, results within the same tolerance).

Not supported (``supports()`` says why): silu (cuBLASLt has no such epilogue), float32 (the
``cublas`` variant covers it), no libcublasLt in the process. cuBLASLt's gelu is the tanh
form: at most 4.8e-4 from the erf form of the reference, well inside the fp16 / bf16
tolerances (2e-3 / 8e-3 relative), which the check verifies like every variant's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dnnctl.backends import cublaslt, cuda, replay
from dnnctl.errors import UnsupportedError
from dnnctl.ops import codes
from dnnctl.ops.base import SUPPORTED, Kernel, Problem, Support, unsupported
from dnnctl.ops.matmul.cupy_variants import CupyMatmul
from dnnctl.ops.registry import register_variant


@register_variant
class CublasLtMatmul(CupyMatmul):
    """cublasLtMatmul with the BIAS / RELU(_BIAS) / GELU(_BIAS) epilogue."""

    name = "cublaslt"
    vendor = True
    doc = ("cuBLASLt matmul with a fused bias / relu / gelu epilogue (fp16/bf16, fp32 "
           "compute; gelu is cuBLASLt's tanh form)")

    def supports(self, problem: Problem, device: Any) -> Support:
        p = problem
        if p["dtype"] not in ("float16", "bfloat16"):
            return unsupported("cublaslt takes float16 / bfloat16 (float32: the cublas variant)")
        if p["dtype"] == "bfloat16" and device.cc_tuple < (8, 0):
            return unsupported("cuBLASLt bf16 matmul needs compute capability >= 8.0")
        if cublaslt.epilogue_code(p["bias"], p["activation"]) is None:
            return unsupported(f"cuBLASLt has no {p['activation']} epilogue "
                               f"(bias, relu and gelu only)")
        if max(p["m"], p["n"], p["k"]) >= 2**31 or p["batch"] >= 2**31:
            return unsupported("cuBLASLt takes 32-bit sizes here")
        if not cublaslt.available():
            return unsupported("libcublasLt cannot be loaded in this process (install the "
                               "CUDA runtime wheels, e.g. nvidia-cublas)")
        return SUPPORTED

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        p = problem
        code = cublaslt.epilogue_code(p["bias"], p["activation"])
        if code is None:
            raise UnsupportedError(f"matmul/cublaslt: no cuBLASLt epilogue for "
                                   f"activation {p['activation']!r}")
        plan = cublaslt.LtPlan(m=p["m"], n=p["n"], k=p["k"], batch=p["batch"],
                               trans_a=p["trans_a"], trans_b=p["trans_b"],
                               data_type=codes.CUDA_R[p["dtype"]],
                               compute=codes.CUBLAS_COMPUTE["32F"], epilogue=code)
        index = int(device.index)
        plan.prepare(index)
        ptr, stream_of = cuda.ptr, cuda.current_stream
        through_torch = _torch_lt(p)

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            bias = inputs.get("bias")
            if through_torch is not None and through_torch(inputs, outputs, bias):
                return
            cuda.refuse("cuBLASLt called through ctypes")
            plan(index, stream_of(), ptr(inputs["a"]), ptr(inputs["b"]), ptr(outputs["y"]),
                 ptr(bias) if bias is not None else 0)

        kernel.flat_io = True  # type: ignore[attr-defined]  # pointers only
        kernel.keep = plan  # type: ignore[attr-defined]
        # from torch tensors, torch's own cuBLASLt call (ATen ops: recorded, replayed from
        # C++); the ctypes call refuses a recording
        kernel.replayable = through_torch is not None  # type: ignore[attr-defined]
        return kernel


def _torch_lt(p: Problem) -> Any:
    """For a single product (batch 1): ``run(inputs, outputs, bias)`` that computes it
    through torch's C++ path when the arrays are torch tensors, and says whether it did;
    None for batched problems and without torch.

    With a bias: ``_addmm_activation`` (relu / gelu: cuBLASLt with the same RELU_BIAS /
    GELU_BIAS epilogue, gelu in the same tanh form) or ``addmm`` (the BIAS epilogue);
    without one: ``mm``, then relu / tanh-gelu in place. Each is an ATen operator a replay
    calls again from C++; the Python binding of each is ~3 us of host time where the
    ctypes call through this module's plan is ~15 (an H100 host)."""
    if p["batch"] != 1:
        return None
    try:
        import torch
    except ImportError:
        return None
    aten = torch.ops.aten
    act, has_bias = p["activation"], p["bias"]
    gelu = act == "gelu"
    m, n, k = p["m"], p["n"], p["k"]
    # the logical (m, k) / (k, n) views of a / b stored C-contiguous as the key says
    a_shape, a_strides = (m, k), ((1, m) if p["trans_a"] else (k, 1))
    b_shape, b_strides = (k, n), ((1, k) if p["trans_b"] else (n, 1))
    tensor = torch.Tensor
    if has_bias and act != "none":
        main, main_fn = aten._addmm_activation.out, torch._addmm_activation
        extra = {"beta": 1, "alpha": 1, "use_gelu": gelu}
    elif has_bias:
        main, main_fn, extra = aten.addmm.out, torch.addmm, {"beta": 1, "alpha": 1}
    else:
        main, main_fn, extra = aten.mm.out, torch.mm, {}
    # no bias: the activation in place over the product (rounded first, as torch's
    # linear + activation is; cuBLASLt's own epilogue would round once)
    post, post_kw = {"relu": (aten.relu_.default, {}),
                     "gelu": (aten.gelu_.default, {"approximate": "tanh"})}.get(
        act if not has_bias else "none", (None, {}))

    def run(inputs: Mapping[str, Any], outputs: Mapping[str, Any], bias: Any) -> bool:
        a, b, y = inputs["a"], inputs["b"], outputs["y"]
        if not (isinstance(a, tensor) and isinstance(b, tensor) and isinstance(y, tensor)
                and (bias is None or isinstance(bias, tensor))):
            return False
        mats = (a.as_strided(a_shape, a_strides, a.storage_offset()),
                b.as_strided(b_shape, b_strides, b.storage_offset()))
        args = (bias, *mats) if has_bias else mats
        out = y.as_strided((m, n), (n, 1), y.storage_offset())
        res = main_fn(*args, **extra, out=out)
        replay.note_aten(main, args, {**extra, "out": out}, res)
        if post is not None:
            post(out, **post_kw)
            replay.note_aten(post, (out,), post_kw, out)
        return True

    return run
