"""The ``cublaslt`` matmul variant without a GPU: epilogue codes (cublasLt.h values), which
keys it takes and why it refuses the others, and that it is registered as a vendor kernel.
Its numerics run in tests/gpu/test_gemm.py (every registered variant against float64)."""

from __future__ import annotations

import math

import pytest

from dnnctl.backends import cublaslt
from dnnctl.backends.base import DeviceInfo
from dnnctl.ops.registry import get_op, get_variant, variants
from dnnctl.plan.report import is_vendor

H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=227 * 1024)
T4 = DeviceInfo(backend="cupy", index=0, name="Tesla T4", compute_capability="7.5",
                sm_count=40, smem_per_block_optin=64 * 1024)
MM = get_op("matmul")
LT = get_variant("matmul", "cupy", "cublaslt")


def mm(**kw):
    return MM.problem(dict({"m": 64, "n": 64, "k": 64, "dtype": "bfloat16"}, **kw))


@pytest.mark.parametrize(("bias", "act", "code"), [
    (False, "none", 1), (True, "none", 4), (False, "relu", 2), (True, "relu", 6),
    (False, "gelu", 32), (True, "gelu", 36), (False, "silu", None), (True, "silu", None)])
def test_epilogue_codes_are_the_header_values(bias, act, code):
    assert cublaslt.epilogue_code(bias, act) == code


def test_gelu_forms_differ_within_the_half_tolerance():
    """cuBLASLt's tanh gelu against the erf reference: the bound the docstring states."""
    def erf_form(x):
        return 0.5 * x * (1 + math.erf(x / math.sqrt(2)))

    def tanh_form(x):
        return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    worst = max(abs(erf_form(i / 500) - tanh_form(i / 500)) for i in range(-5000, 5000))
    assert 4e-4 < worst < 4.8e-4
    assert worst < MM.tolerance(mm(dtype="float16"), "y") / 4


def test_supports_reasons():
    silu = LT.supports(mm(activation="silu", bias=True), H200)
    assert not silu and "silu" in silu.reason
    fp32 = LT.supports(mm(dtype="float32"), H200)
    assert not fp32 and "float32" in fp32.reason
    old = LT.supports(mm(), T4)
    assert not old and "8.0" in old.reason
    for key in (dict(), dict(bias=True, activation="gelu"), dict(activation="relu"),
                dict(batch=3, trans_a=True, trans_b=True, dtype="float16", bias=True)):
        got = LT.supports(mm(**key), H200)
        if cublaslt.available():
            assert got, got.reason
        else:  # this machine has no libcublasLt: refused by name, never an exception
            assert not got and "libcublasLt" in got.reason


def test_registered_as_a_vendor_candidate_with_no_parameters():
    assert LT.vendor and is_vendor("matmul", "cublaslt")
    assert "cublaslt" in [v.name for v in variants("matmul", "cupy")]
    assert list(LT.param_space(mm(), H200)) == [{}]
    assert LT.workspace_bytes(mm(bias=True, activation="gelu"), {}) == 0


def test_alignment_classes():
    assert cublaslt._alignment(0) == 256
    assert cublaslt._alignment(0x7F0000001000) == 256
    assert cublaslt._alignment(0x7F0000000010) == 16
    assert cublaslt._alignment(0x7F0000000002) == 2
