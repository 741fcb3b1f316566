"""matmul ``cublaslt``: cuBLASLt's matmul with its own fused epilogue (one kernel).

What torch runs for ``F.linear`` + activation is cuBLAS and then a separate elementwise
kernel; cuBLASLt applies bias, relu or gelu in the GEMM's epilogue (the same path as
torch's ``_addmm_activation``), so the output is written once. fp16 / bf16 in and out with
fp32 compute and scale; any trans_a / trans_b; batches by stride (bias shared). Runs on the
call's stream with the seam's handle and workspace (dnnctl/backends/cublaslt.py): nothing is
allocated in a call, so it can be captured in a CUDA graph.

Not supported (``supports()`` says why): silu (cuBLASLt has no such epilogue), float32 (the
``cublas`` variant covers it), no libcublasLt in the process. cuBLASLt's gelu is the tanh
form: at most 4.8e-4 from the erf form of the reference, well inside the fp16 / bf16
tolerances (2e-3 / 8e-3 relative), which the check verifies like every variant's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dnnctl.backends import cublaslt, cuda
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

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            bias = inputs.get("bias")
            plan(index, stream_of(), ptr(inputs["a"]), ptr(inputs["b"]), ptr(outputs["y"]),
                 ptr(bias) if bias is not None else 0)

        kernel.flat_io = True  # type: ignore[attr-defined]  # pointers only
        kernel.keep = plan  # type: ignore[attr-defined]
        return kernel
