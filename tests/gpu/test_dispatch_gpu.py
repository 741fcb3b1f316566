"""GPU tests of the run-time fast path and the launch objects (CuPy on a CUDA device).

* A Launch built by a real CuPy module goes to ``cuLaunchKernel`` with its parameter block
  laid out once: the result equals the float64 reference and, bit for bit, the same kernel
  launched the plain way (RawKernel, NumPy scalars).
* Repeated public calls on CuPy arrays (the fast path from the second call on) equal the
  validating ``out=`` path bit for bit, for every memory op, and matmul / conv2d equal their
  references; signatures that differ only in dtype or strides are not confused.
* torch CUDA tensors (when torch is installed) run through the same fast path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dnnctl.ops.base import np_dtype, rel_norm_error

BF16 = np_dtype("bfloat16")  # ml_dtypes.bfloat16, the dtype CuPy 14 uses (cupy has no cp.bfloat16)


@pytest.fixture(scope="module")
def cp() -> Any:
    cupy = pytest.importorskip("cupy")
    from dnnctl.backends.registry import get_backend

    assert get_backend("cupy").availability()[0]
    return cupy


def _rand(cp: Any, *shape: int, dtype: Any = np.float32) -> Any:
    return cp.random.standard_normal(shape, dtype=cp.float32).astype(dtype)


def test_launch_calls_the_cuda_function_with_converted_scalars(cp: Any) -> None:
    from dnnctl.backends.registry import get_backend
    from dnnctl.ops import _memory_common as mc
    from dnnctl.ops.registry import get_op, get_variant

    op = get_op("softmax")
    problem = op.problem(rows=300, cols=1000, dtype="float16")
    variant = get_variant("softmax", "cupy", "block_row")
    params = {"block": 128, "vec": 8}
    dev = get_backend("cupy").device(cp.cuda.Device().id)
    mod = mc.compile_cuda(variant.source, variant.defines(problem),
                          [variant.instance(problem, params, 8)], dev)
    run = mc.launch(mod, variant.instance(problem, params, 8), 300, 128)
    assert run.handle  # the CUfunction behind the RawKernel
    dims = run.consts(np.int32(300), np.int32(1000))
    assert mc.plain_args(dims) == (300, 1000)
    x = _rand(cp, 300, 1000, dtype=cp.float16)
    y1, y2 = cp.full_like(x, cp.nan), cp.full_like(x, cp.nan)
    for _ in range(2):  # the same converted scalars serve every launch
        run((x, y1, *dims))
    run.fn((300,), (128,), (x, y2, np.int32(300), np.int32(1000)), shared_mem=0)
    cp.cuda.get_current_stream().synchronize()
    cp.testing.assert_array_equal(y1, y2)
    ref = op.reference(problem, {"x": cp.asnumpy(x).astype(np.float64)}, {})["y"]
    assert rel_norm_error(cp.asnumpy(y1), ref) <= op.tolerance(problem, "y")


def test_kernel_objects_replay_as_bare_launches(cp: Any) -> None:
    """The traced launches of a kernel object (what bench_tune replays) compute the same."""
    from dnnctl.backends.registry import get_backend
    from dnnctl.ops import _memory_common as mc
    from dnnctl.ops.registry import get_op, get_variant

    dev = get_backend("cupy").device(cp.cuda.Device().id)
    cases = [("layer_norm", "block_row", {"rows": 64, "cols": 768, "dtype": "bfloat16"},
              {"block": 128, "vec": 8}),
             ("matmul", "mma", {"m": 64, "n": 96, "k": 640, "dtype": "float16", "bias": True,
                                "activation": "gelu"},
              {"bm": 32, "bn": 32, "bk": 32, "warps": 4, "stages": 3, "splitk": 4,
               "reduce": "separate", "pipe": "simple"})]
    for op_name, vname, key, params in cases:
        op = get_op(op_name)
        problem = op.problem(key)
        variant = get_variant(op_name, "cupy", vname)
        assert variant.check_params(params) is None
        assert variant.valid_params(problem, params, dev)
        kern = variant.build(problem, params, dev)
        ins = {k: cp.asarray(v) for k, v in op.make_inputs(problem,
                                                            np.random.default_rng(3)).items()}
        spec = op.output_specs(problem)["y"]
        y = cp.full(spec.shape, cp.nan, dtype=np_dtype(spec.dtype))
        with mc.traced_launches() as log:
            kern(ins, {"y": y}, op.default_attrs(problem))
        assert log, f"{vname}: no launch traced"
        y_kernel = y.copy()
        y.fill(cp.nan)
        for fn, grid, block, args, smem in log:
            assert not any(type(a).__name__ == "CScalar" for a in args)
            fn(grid, block, args, shared_mem=smem)
        cp.cuda.get_current_stream().synchronize()
        cp.testing.assert_array_equal(y, y_kernel)
        ref = op.reference(problem, {k: cp.asnumpy(v).astype(np.float64)
                                     for k, v in ins.items()}, op.default_attrs(problem))["y"]
        assert rel_norm_error(cp.asnumpy(y), ref) <= op.tolerance(problem, "y")


def test_repeated_memory_op_calls_equal_the_validating_path(cp: Any) -> None:
    import dnnctl.ops as ops

    x3 = _rand(cp, 4, 33, 200, dtype=cp.float16)
    x4 = _rand(cp, 8, 16, 14, 14, dtype=BF16)
    x4n = _rand(cp, 8, 14, 14, 16, dtype=BF16)
    w, b = _rand(cp, 200, dtype=cp.float16), _rand(cp, 200, dtype=cp.float16)
    c16 = [_rand(cp, 16) for _ in range(3)] + [cp.abs(_rand(cp, 16)) + 0.5]
    calls = [
        (lambda **kw: ops.softmax(x3, **kw)),
        (lambda **kw: ops.log_softmax(x3, **kw)),
        (lambda **kw: ops.layer_norm(x3, w, b, eps=1e-3, **kw)),
        (lambda **kw: ops.rms_norm(x3, w, **kw)),
        (lambda **kw: ops.gelu(x4, bias=c16[0].astype(BF16), **kw)),
        (lambda **kw: ops.silu(x4n, bias=c16[1].astype(BF16), layout="NHWC", **kw)),
        (lambda **kw: ops.batch_norm(x4, c16[0], c16[3], c16[1], c16[2], **kw)),
        (lambda **kw: ops.group_norm(x4, 4, c16[1], c16[2], **kw)),
        (lambda **kw: ops.max_pool2d(x4, 3, 2, 1, **kw)),
        (lambda **kw: ops.avg_pool2d(x4, 2, count_include_pad=False, **kw)),
        (lambda **kw: ops.global_avg_pool2d(x4, **kw)),
    ]
    for i, call in enumerate(calls):
        first = call()
        second = call()  # the fast path
        third = call()
        assert isinstance(second, cp.ndarray) and second.shape == first.shape
        out = cp.full_like(first, cp.nan)
        assert call(out=out) is out  # validated every time (dispatch.run)
        for y in (first, second, third):
            cp.testing.assert_array_equal(y, out, err_msg=f"call {i}")


def test_inplace_and_training_state_on_the_fast_path(cp: Any) -> None:
    import dnnctl.ops as ops

    x = _rand(cp, 64, 1000, dtype=cp.float16)
    want = cp.maximum(x, 0)
    for _ in range(3):
        y = x.copy()
        ptr = y.data.ptr
        assert ops.relu(y, inplace=True) is y and y.data.ptr == ptr
        cp.testing.assert_array_equal(y, want)
    x4 = _rand(cp, 16, 8, 7, 7)
    rm, rv = cp.zeros(8, cp.float32), cp.ones(8, cp.float32)
    mean = x4.mean(axis=(0, 2, 3))
    for step in range(1, 4):
        ops.batch_norm(x4, rm, rv, training=True, momentum=0.5)
        cp.testing.assert_allclose(rm, mean * (1 - 0.5 ** step), rtol=1e-4, atol=1e-5)


def test_signatures_are_not_confused(cp: Any) -> None:
    import dnnctl.ops as ops
    from dnnctl.errors import ShapeError

    wide = _rand(cp, 32, 256)
    for dtype in (cp.float32, cp.float16, cp.float32, cp.float16):
        x = wide[:, :128].copy().astype(dtype)
        y = ops.softmax(x)
        assert y.dtype == dtype
        cp.testing.assert_allclose(y.astype(cp.float32).sum(axis=1), 1.0, rtol=5e-3)
    with pytest.raises(ShapeError, match="C-contiguous"):
        ops.softmax(wide[:, ::2])  # same shape and dtype as above, strided
    with pytest.raises(ShapeError, match="dtype float64"):
        ops.softmax(wide[:, :128].astype(cp.float64))


def test_repeated_matmul_and_conv2d_calls(cp: Any) -> None:
    import dnnctl.ops as ops

    a = _rand(cp, 4, 48, 320, dtype=cp.float16)
    bt = _rand(cp, 96, 320, dtype=cp.float16)
    bias = _rand(cp, 96, dtype=cp.float16)
    want = cp.matmul(a.astype(cp.float32), bt.T.astype(cp.float32)) + bias.astype(cp.float32)
    for _ in range(3):  # (4, 48, 320) @ (320, 96) as a transposed view: no copies
        y = ops.matmul(a, bt.T, bias=bias)
        assert y.shape == (4, 48, 96) and y.dtype == cp.float16
        assert rel_norm_error(cp.asnumpy(y), cp.asnumpy(want).astype(np.float64)) < 2e-3
    x = _rand(cp, 2, 9, 9, 16, dtype=cp.float16)
    w = _rand(cp, 24, 3, 3, 16, dtype=cp.float16)
    ys = [ops.conv2d(x, w, padding=1, layout="NHWC", activation="relu") for _ in range(3)]
    for y in ys[1:]:
        assert rel_norm_error(cp.asnumpy(y), cp.asnumpy(ys[0]).astype(np.float64)) < 1e-6


def test_torch_tensors_on_the_fast_path(cp: Any) -> None:
    torch = pytest.importorskip("torch")
    import dnnctl.ops as ops

    x = torch.randn(8, 64, 300, device="cuda", dtype=torch.float16)
    want = torch.softmax(x.float(), -1)
    for _ in range(3):
        y = ops.softmax(x)
        assert isinstance(y, torch.Tensor) and y.is_cuda and y.shape == x.shape
        assert float((y.float() - want).abs().max()) < 2e-3
    a = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(128, 32, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        y = ops.matmul(a, b)
        assert isinstance(y, torch.Tensor)
        ref = a.float() @ b.float()
        assert float((y.float() - ref).norm() / ref.norm()) < 1e-2
