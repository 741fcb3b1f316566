"""Recording the kernel modules a set of builds compiles (for parallel pre-compilation)."""

from __future__ import annotations

from dnnctl.backends import registry as base
from dnnctl.backends.base import DeviceInfo
from dnnctl.ops.conv2d import _cuda
from dnnctl.ops.precompile import CompileRecorder, compile_job, record_builds
from dnnctl.ops.registry import get_op, get_variant

H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, driver="580.159.04", cuda_runtime="13.0",
                  memory_bytes=150 << 30, l2_bytes=60 << 20, smem_per_block_optin=232448)


def _build(op: str, variant: str, key: dict, params: dict) -> tuple:
    return get_variant(op, "cupy", variant), get_op(op).problem(key), params


def test_records_each_module_once_in_first_use_order_and_restores_the_backend():
    before = base._BACKENDS.get("cupy")
    soft = _build("softmax", "block_row", {"rows": 64, "cols": 1000, "dtype": "float16"},
                  {"block": 128, "vec": 8})
    conv = _build("conv2d", "direct", {"n": 1, "c": 8, "h": 9, "w": 9, "k": 8, "r": 3, "s": 3,
                                       "pad": 1, "dtype": "float32", "layout": "NCHW"},
                  {"bm": 64, "bn": 64, "tm": 4, "tn": 4})
    broken = _build("softmax", "block_row", {"rows": 64, "cols": 1000, "dtype": "float16"},
                    {"block": "not-a-size", "vec": 8})  # its real build reports the error
    jobs = record_builds([soft, conv, soft, broken], H200)
    assert [j[0] for j in jobs] == ["softmax/block_row.cu", "conv2d/direct.cu"]
    source, defines, names = jobs[0]
    assert dict(defines)["DNNCTL_DTYPE"] == 1 and names
    assert base._BACKENDS.get("cupy") is before and not _cuda._OVERRIDE
    assert not isinstance(base._BACKENDS.get("cupy"), CompileRecorder)


def test_compile_job_returns_the_failure_instead_of_raising():
    err = compile_job(("no/such/kernel.cu", (), ()))
    assert err is not None and "no/such/kernel.cu" in err
