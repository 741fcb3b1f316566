"""GPU tests of the memory-bound ops (activation, softmax, norms, pooling) on a CUDA device.

* Every cupy variant of the registry x a sample of its parameters (first, last, random) x
  problems covering every dtype and layout, rows of length 1, odd sizes and sizes that are
  no multiple of any block or vector width, against the float64 reference through
  dnnctl.ops.check (fresh random inputs, NaN-poisoned outputs).
* NaN / +-inf propagation wherever the reference propagates them.
* The public API on CuPy arrays and torch CUDA tensors (zero copy: torch in, torch out), and
  agreement with torch's own ops on the same tensors (skipped without torch).

Every module the cases compile is built first by a pool of processes into CuPy's on-disk
kernel cache, so the run stays short on a fresh machine.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from dnnctl.backends.base import DeviceInfo
from dnnctl.ops.registry import get_op, get_variant, variants

H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=232448)

P: dict[str, list[dict[str, Any]]] = {
    "activation": [
        dict(fn="relu", shape=(1,), dtype="float32"),
        dict(fn="gelu", shape=(1000003,), dtype="float16"),
        dict(fn="gelu_tanh", shape=(3, 5, 7, 9), dtype="bfloat16", bias="channel"),
        dict(fn="silu", shape=(2, 64, 12, 12), dtype="float16", bias="channel", inplace=True),
        dict(fn="sigmoid", shape=(8, 7, 7, 72), dtype="bfloat16", bias="channel",
             layout="NHWC"),
        dict(fn="tanh", shape=(33, 17), dtype="float32", bias="channel", layout="NHWC"),
        dict(fn="leaky_relu", shape=(4096, 1024), dtype="float16"),
        dict(fn="relu", shape=(3, 100), dtype="bfloat16", inplace=True),
        dict(fn="relu6", shape=(8, 32, 14, 14), dtype="float16", bias="channel"),
        dict(fn="hardswish", shape=(8, 7, 7, 72), dtype="float16", bias="channel",
             layout="NHWC"),
        dict(fn="hardsigmoid", shape=(1000003,), dtype="bfloat16"),
    ],
    "softmax": [
        dict(rows=1, cols=1, dtype="float32"),
        dict(rows=1000, cols=1, dtype="float16", log=True),
        dict(rows=77, cols=33, dtype="bfloat16"),
        dict(rows=513, cols=1000, dtype="float16"),
        dict(rows=64, cols=2048, dtype="float32", log=True),
        dict(rows=300, cols=4097, dtype="bfloat16"),
        dict(rows=16, cols=16384, dtype="float16"),
        dict(rows=4, cols=262144, dtype="float32"),
        dict(rows=3, cols=100003, dtype="float16", log=True),
        dict(rows=2, cols=65536, dtype="bfloat16"),
    ],
    "layer_norm": [
        dict(rows=1, cols=1, dtype="float32"),
        dict(rows=1000, cols=768, dtype="float16"),
        dict(rows=33, cols=1025, dtype="bfloat16", bias=False),
        dict(rows=8, cols=8192, dtype="float32", weight=False, bias=False),
        dict(rows=2, cols=50000, dtype="float16"),
    ],
    "rms_norm": [
        dict(rows=64, cols=4096, dtype="bfloat16"),
        dict(rows=7, cols=3, dtype="float32", weight=False),
        dict(rows=4, cols=20000, dtype="float16"),
    ],
    "batch_norm": [
        dict(n=2, c=3, h=5, w=7, dtype="float32", layout="NCHW"),
        dict(n=8, c=64, h=14, w=14, dtype="float16", layout="NHWC"),
        dict(n=4, c=96, h=7, w=7, dtype="bfloat16", layout="NHWC", training=True),
        dict(n=16, c=32, h=9, w=11, dtype="float16", layout="NCHW", training=True),
        dict(n=2, c=5, h=1, w=1, dtype="float32", layout="NHWC", training=True,
             affine=False),
        dict(n=1, c=8, h=33, w=33, dtype="bfloat16", layout="NCHW", affine=False),
    ],
    "group_norm": [
        dict(n=2, c=6, h=5, w=7, groups=3, dtype="float32", layout="NCHW"),
        dict(n=4, c=64, h=16, w=16, groups=32, dtype="float16", layout="NHWC"),
        dict(n=1, c=32, h=64, w=64, groups=4, dtype="bfloat16", layout="NCHW"),
        dict(n=2, c=48, h=7, w=7, groups=6, dtype="float16", layout="NHWC", affine=False),
        dict(n=1, c=16, h=128, w=128, groups=2, dtype="float16", layout="NHWC"),
    ],
    "pool2d": [
        dict(n=2, c=3, h=7, w=9, mode="max", kernel=3, stride=2, pad=1, dtype="float32",
             layout="NCHW"),
        dict(n=4, c=64, h=56, w=56, mode="max", kernel=3, stride=2, pad=1, dtype="float16",
             layout="NHWC"),
        dict(n=2, c=24, h=17, w=17, mode="avg", kernel=3, stride=2, pad=1, ceil_mode=True,
             count_include_pad=False, dtype="bfloat16", layout="NHWC"),
        dict(n=2, c=5, h=8, w=11, mode="avg", kernel=(2, 3), stride=(1, 2), pad=(1, 1),
             ceil_mode=True, dtype="float16", layout="NCHW"),
        dict(n=1, c=16, h=9, w=9, mode="max", kernel=2, stride=1, pad=1, dilation=2,
             dtype="bfloat16", layout="NHWC"),
        dict(n=3, c=7, h=6, w=6, mode="max", kernel=1, dtype="float32", layout="NCHW"),
    ],
    "global_avg_pool2d": [
        dict(n=2, c=3, h=5, w=7, dtype="float32", layout="NCHW"),
        dict(n=32, c=256, h=7, w=7, dtype="float16", layout="NHWC"),
        dict(n=2, c=64, h=56, w=56, dtype="bfloat16", layout="NHWC"),
        dict(n=1, c=3, h=224, w=224, dtype="float16", layout="NCHW"),
        dict(n=3, c=5, h=1, w=1, dtype="bfloat16", layout="NHWC"),
    ],
}

# the backward pass (pass: backward) and max pooling with indices: edge shapes (size 1, odd
# sizes, N = 1, stride-2 and overlapping pool windows, dilation 2) and ResNet-50 / ViT-B/16
# training shapes
_BW = {"pass": "backward"}
P["activation"] += [
    dict(fn="relu", shape=(1,), dtype="float32", **_BW),
    dict(fn="gelu", shape=(1000003,), dtype="float16", **_BW),
    dict(fn="gelu", shape=(197 * 2, 3072), dtype="bfloat16", bias="channel", layout="NHWC",
         **_BW),
    dict(fn="silu", shape=(2, 64, 13, 13), dtype="float16", bias="channel", **_BW),
    dict(fn="tanh", shape=(33, 17), dtype="float32", bias="channel", layout="NHWC", **_BW),
    dict(fn="leaky_relu", shape=(1, 3, 5, 7), dtype="bfloat16", bias="channel", **_BW),
]
P["softmax"] += [
    dict(rows=1, cols=1, dtype="float32", **_BW),
    dict(rows=12 * 197, cols=197, dtype="float16", **_BW),
    dict(rows=77, cols=1000, dtype="bfloat16", log=True, **_BW),
    dict(rows=5, cols=8193, dtype="float32", **_BW),
    dict(rows=3, cols=100003, dtype="float16", log=True, **_BW),
]
P["layer_norm"] += [
    dict(rows=1, cols=1, dtype="float32", **_BW),
    dict(rows=2 * 197, cols=768, dtype="float16", **_BW),
    dict(rows=33, cols=1025, dtype="bfloat16", bias=False, **_BW),
    dict(rows=8, cols=8192, dtype="float32", weight=False, bias=False, **_BW),
    dict(rows=2, cols=50000, dtype="float16", **_BW),
]
P["rms_norm"] += [
    dict(rows=64, cols=4096, dtype="bfloat16", **_BW),
    dict(rows=7, cols=3, dtype="float32", weight=False, **_BW),
]
P["batch_norm"] += [
    dict(n=32, c=64, h=28, w=28, dtype="float16", layout="NHWC", training=True),
    dict(n=1, c=3, h=31, w=33, dtype="float32", layout="NCHW", training=True),
    dict(n=4, c=96, h=7, w=7, dtype="bfloat16", layout="NHWC", training=True, **_BW),
    dict(n=16, c=32, h=9, w=11, dtype="float16", layout="NCHW", training=True, **_BW),
    dict(n=2, c=5, h=1, w=1, dtype="float32", layout="NHWC", training=True, affine=False,
         **_BW),
    dict(n=8, c=256, h=14, w=14, dtype="float16", layout="NHWC", training=True, **_BW),
    # relu(batch_norm(x)) (activation: relu), forward and the backward's recomputed mask
    dict(n=32, c=64, h=28, w=28, dtype="float16", layout="NHWC", activation="relu"),
    dict(n=16, c=256, h=14, w=14, dtype="bfloat16", layout="NHWC", training=True,
         activation="relu"),
    dict(n=4, c=3, h=31, w=33, dtype="float32", layout="NCHW", training=True,
         activation="relu"),
    dict(n=8, c=256, h=14, w=14, dtype="float16", layout="NHWC", training=True,
         activation="relu", **_BW),
    dict(n=16, c=32, h=9, w=11, dtype="float16", layout="NCHW", training=True,
         activation="relu", **_BW),
    dict(n=4, c=96, h=7, w=7, dtype="bfloat16", layout="NHWC", training=True, affine=False,
         activation="relu", **_BW),
    # relu(batch_norm(x) + residual), a ResNet block's end
    dict(n=16, c=256, h=14, w=14, dtype="float16", layout="NHWC", training=True,
         activation="relu", residual=True),
    dict(n=8, c=64, h=9, w=9, dtype="float32", layout="NCHW", activation="relu",
         residual=True),
    dict(n=8, c=256, h=14, w=14, dtype="bfloat16", layout="NHWC", training=True,
         activation="relu", residual=True, **_BW),
    dict(n=4, c=32, h=9, w=11, dtype="float16", layout="NCHW", training=True,
         activation="relu", residual=True, **_BW),
]
P["group_norm"] += [
    dict(n=2, c=6, h=5, w=7, groups=3, dtype="float32", layout="NCHW", **_BW),
    dict(n=4, c=64, h=16, w=16, groups=32, dtype="float16", layout="NHWC", **_BW),
    dict(n=1, c=48, h=7, w=7, groups=6, dtype="bfloat16", layout="NHWC", affine=False, **_BW),
]
P["pool2d"] += [
    dict(n=2, c=3, h=7, w=9, mode="max", kernel=3, stride=2, pad=1, dtype="float32",
         layout="NCHW", indices=True),
    dict(n=4, c=64, h=56, w=56, mode="max", kernel=3, stride=2, pad=1, dtype="float16",
         layout="NHWC", indices=True),
    dict(n=2, c=3, h=7, w=9, mode="max", kernel=3, stride=2, pad=1, dtype="float32",
         layout="NCHW", **_BW),
    dict(n=4, c=64, h=56, w=56, mode="max", kernel=3, stride=2, pad=1, dtype="float16",
         layout="NHWC", **_BW),
    dict(n=1, c=16, h=9, w=9, mode="max", kernel=2, stride=1, pad=1, dilation=2,
         dtype="bfloat16", layout="NHWC", **_BW),
    dict(n=2, c=24, h=17, w=17, mode="avg", kernel=3, stride=2, pad=1, ceil_mode=True,
         count_include_pad=False, dtype="bfloat16", layout="NHWC", **_BW),
    dict(n=1, c=5, h=8, w=11, mode="avg", kernel=(2, 3), stride=(1, 2), pad=(1, 1),
         ceil_mode=True, dtype="float16", layout="NCHW", **_BW),
]
P["global_avg_pool2d"] += [
    dict(n=1, c=3, h=5, w=7, dtype="float32", layout="NCHW", **_BW),
    dict(n=32, c=2048, h=7, w=7, dtype="float16", layout="NHWC", **_BW),
    dict(n=3, c=5, h=1, w=1, dtype="bfloat16", layout="NHWC", **_BW),
]


def _sample(space: list[dict[str, Any]], seed: str) -> list[dict[str, Any]]:
    """First, last and one random parameter set (the extremes of every sweep)."""
    picks = [space[0], space[-1]]
    if len(space) > 2:
        picks.append(random.Random(seed).choice(space[1:-1]))
    out: list[dict[str, Any]] = []
    for p in picks:
        if p not in out:
            out.append(p)
    return out


def _cases() -> list[tuple[str, int, str, dict[str, Any]]]:
    out = []
    for op_name, keys in P.items():
        op = get_op(op_name)
        for i, key in enumerate(keys):
            problem = op.problem(key)
            for v in variants(op_name, "cupy"):
                if not v.supports(problem, H200):
                    continue
                for params in _sample(list(v.param_space(problem, H200)),
                                      f"{op_name}{i}{v.name}"):
                    out.append((op_name, i, v.name, params))
    return out


CASES = _cases()


# ----------------------------------------------------------------------------- cache warm-up


@pytest.fixture(scope="session")
def cuda(request: pytest.FixtureRequest) -> Any:
    import os

    import cupy

    from dnnctl.backends import registry as base
    from dnnctl.ops.precompile import compile_jobs, default_workers, record_builds

    # warm the cache for the cases this session runs, with this worker's share of the cores
    chosen = {tuple(item.callspec.params[k] for k in ("op_name", "index", "variant_name"))
              for item in request.session.items
              if item.module is not None and item.module.__name__ == __name__
              and hasattr(item, "callspec") and "variant_name" in item.callspec.params}
    jobs = record_builds(((get_variant(op_name, "cupy", vname), get_op(op_name).problem(
        P[op_name][i]), params) for op_name, i, vname, params in CASES
        if (op_name, i, vname) in chosen), H200)
    share = max(1, default_workers() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    try:  # a warm-up that cannot run only costs time: each case compiles for itself
        compile_jobs(jobs, workers=share, timeout_s=60)
    except Exception as exc:
        print(f"[kernel cache warm-up skipped: {type(exc).__name__}: {exc}]")
    be = base.get_backend("cupy")
    assert be.availability()[0]
    return be, be.device(cupy.cuda.Device().id)


# ----------------------------------------------------------------------------- correctness


@pytest.mark.parametrize("op_name,index,variant_name,params", CASES,
                         ids=[f"{o}-{i}-{v}-{'-'.join(map(str, p.values()))}"
                              for o, i, v, p in CASES])
def test_variant_matches_reference(cuda: Any, op_name: str, index: int, variant_name: str,
                                   params: dict[str, Any]) -> None:
    from dnnctl.ops.check import check_variant

    be, dev = cuda
    op = get_op(op_name)
    problem = op.problem(P[op_name][index])
    variant = get_variant(op_name, "cupy", variant_name)
    if not variant.supports(problem, dev) or not variant.valid_params(problem, params, dev):
        pytest.skip(f"not applicable on {dev.name}")
    res = check_variant(op, problem, variant, params, be, dev, seed=index)
    assert res.ok, f"{problem.short()} {variant_name}{params}: {res.detail}"


NAN_CASES = [
    ("activation", dict(fn="relu", shape=(1031,), dtype="float16")),
    ("activation", dict(fn="gelu", shape=(4, 64), dtype="float32", bias="channel",
                        layout="NHWC")),
    ("activation", dict(fn="silu", shape=(257,), dtype="bfloat16")),
    ("softmax", dict(rows=6, cols=40, dtype="float16")),
    ("softmax", dict(rows=6, cols=3000, dtype="float32", log=True)),
    ("softmax", dict(rows=2, cols=20000, dtype="bfloat16")),
    ("layer_norm", dict(rows=6, cols=40, dtype="float16")),
    ("rms_norm", dict(rows=6, cols=3000, dtype="float32")),
    ("pool2d", dict(n=2, c=8, h=9, w=9, mode="max", kernel=3, stride=2, pad=1,
                    dtype="float16", layout="NHWC")),
    ("pool2d", dict(n=2, c=3, h=9, w=9, mode="max", kernel=3, stride=2, pad=1,
                    dtype="float32", layout="NCHW")),
    ("global_avg_pool2d", dict(n=2, c=8, h=9, w=9, dtype="float16", layout="NHWC")),
]


@pytest.mark.parametrize("op_name,key", NAN_CASES)
def test_nan_and_inf_propagate_like_the_reference(cuda: Any, op_name: str,
                                                  key: dict[str, Any]) -> None:
    from dnnctl.ops.base import rel_norm_error

    be, dev = cuda
    op = get_op(op_name)
    problem = op.problem(key)
    ins = op.make_inputs(problem, np.random.default_rng(5))
    flat = ins["x"].reshape(-1)
    flat[[1, 17, flat.size - 2]] = [np.nan, np.inf, -np.inf]
    ref = op.reference(problem, {k: v.astype(np.float64) for k, v in ins.items()},
                       op.default_attrs(problem))["y"]
    assert not np.isfinite(ref).all()
    ran = 0
    for v in variants(op_name, "cupy"):
        if not v.supports(problem, dev):
            continue
        for params in _sample(list(v.param_space(problem, dev)), v.name):
            kernel = v.build(problem, params, dev)
            outs = {k: be.empty(s.shape, np.dtype(ins["x"].dtype))
                    for k, s in op.output_specs(problem).items()}
            for o in outs.values():
                be.poison(o)
            kernel({k: be.asarray(a) for k, a in ins.items()}, outs, op.default_attrs(problem))
            be.synchronize()
            err = rel_norm_error(be.to_numpy(outs["y"]), ref)
            assert err <= op.tolerance(problem, "y"), f"{v.name}{params}: {err}"
            ran += 1
    assert ran


# ----------------------------------------------------------------------------- public API


def test_public_api_on_cupy_arrays(cuda: Any) -> None:
    import cupy as cp

    import dnnctl.ops as ops

    x = cp.random.standard_normal((4, 6, 10, 12), dtype=cp.float32).astype(cp.float16)
    y = ops.relu(x)
    assert isinstance(y, cp.ndarray) and y.dtype == cp.float16
    cp.testing.assert_array_equal(y, cp.maximum(x, 0))
    sm = ops.softmax(x, axis=1)
    cp.testing.assert_allclose(sm.astype(cp.float32).sum(axis=1), 1.0, rtol=5e-3)
    before = x.data.ptr
    assert ops.silu(x, inplace=True) is x and x.data.ptr == before
    rm, rv = cp.zeros(6, cp.float32), cp.ones(6, cp.float32)
    out = ops.batch_norm(x, rm, rv, training=True)
    assert out.shape == x.shape and float(cp.abs(rm).sum()) > 0  # running stats updated
    p = ops.max_pool2d(x, 3, 2, 1)
    assert p.shape == (4, 6, 5, 6) and isinstance(p, cp.ndarray)
    g = ops.global_avg_pool2d(cp.ascontiguousarray(x.transpose(0, 2, 3, 1)), layout="NHWC")
    assert g.shape == (4, 1, 1, 6)
    from dnnctl.errors import ShapeError

    with pytest.raises(ShapeError, match="mix array kinds"):
        ops.relu(x, bias=np.zeros(6, np.float16))


def _torch() -> Any:
    return pytest.importorskip("torch")


TORCH_TOL = {"float32": 2e-5, "float16": 3e-3, "bfloat16": 2e-2}


def _close(ours: Any, theirs: Any, dtype: str) -> None:
    torch = _torch()
    assert isinstance(ours, torch.Tensor) and ours.is_cuda
    a, b = ours.double(), theirs.double()
    finite = torch.isfinite(b)
    assert torch.equal(torch.isfinite(a), finite)
    err = float(torch.linalg.vector_norm((a - b)[finite]) /
                max(float(torch.linalg.vector_norm(b[finite])), 1e-30))
    assert err <= TORCH_TOL[dtype], err


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_matches_torch_on_the_same_tensors(cuda: Any, dtype: str) -> None:
    torch = _torch()
    import torch.nn.functional as F

    import dnnctl.ops as ops

    dt = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, device="cuda", generator=gen).to(dt)

    x = randn(8, 32, 15, 17) * 2
    b = randn(32)
    _close(ops.relu(x), F.relu(x), dtype)
    _close(ops.gelu(x, bias=b), F.gelu(x + b[None, :, None, None]), dtype)
    _close(ops.gelu(x, approximate="tanh"), F.gelu(x, approximate="tanh"), dtype)
    _close(ops.silu(x), F.silu(x), dtype)
    _close(ops.leaky_relu(x, 0.1), F.leaky_relu(x, 0.1), dtype)
    _close(ops.sigmoid(x), torch.sigmoid(x), dtype)
    _close(ops.tanh(x), torch.tanh(x), dtype)
    for cols in (1, 100, 4096, 70001):
        s = randn(9, cols) * 3
        _close(ops.softmax(s), torch.softmax(s, -1), dtype)
        _close(ops.log_softmax(s), torch.log_softmax(s, -1), dtype)
        w, bb = randn(cols), randn(cols)
        _close(ops.layer_norm(s, w, bb), F.layer_norm(s, (cols,), w, bb), dtype)
        _close(ops.rms_norm(s, w), F.rms_norm(s, (cols,), w, eps=1e-6), dtype)
    _close(ops.softmax(x, axis=1), torch.softmax(x, 1), dtype)
    w32, b32 = torch.randn(32, device="cuda"), torch.randn(32, device="cuda")
    rm, rv = torch.randn(32, device="cuda") * 0.1, torch.rand(32, device="cuda") + 0.5
    _close(ops.batch_norm(x, rm, rv, w32, b32),
           F.batch_norm(x, rm, rv, w32, b32, training=False), dtype)
    rm2, rv2 = rm.clone(), rv.clone()
    y = ops.batch_norm(x, rm, rv, w32, b32, training=True, momentum=0.3)
    want = F.batch_norm(x, rm2, rv2, w32, b32, training=True, momentum=0.3)
    _close(y, want, dtype)
    assert torch.allclose(rm, rm2, rtol=1e-4, atol=1e-5)
    assert torch.allclose(rv, rv2, rtol=1e-4, atol=1e-5)
    xl = x.permute(0, 2, 3, 1).contiguous()  # NHWC
    yl = ops.batch_norm(xl, rm, rv, w32, b32, layout="NHWC")
    _close(yl.permute(0, 3, 1, 2), F.batch_norm(x, rm, rv, w32, b32), dtype)
    gn = F.group_norm(x.float(), 8, w32, b32).to(dt)  # fp32 parameters, as ours
    _close(ops.group_norm(x, 8, w32, b32), gn, dtype)
    _close(ops.group_norm(xl, 8, w32, b32, layout="NHWC").permute(0, 3, 1, 2), gn, dtype)
    _close(ops.max_pool2d(x, 3, 2, 1), F.max_pool2d(x, 3, 2, 1), dtype)
    _close(ops.max_pool2d(xl, 3, 2, 1, ceil_mode=True, layout="NHWC").permute(0, 3, 1, 2),
           F.max_pool2d(x, 3, 2, 1, ceil_mode=True), dtype)
    _close(ops.max_pool2d(x, 2, 1, 1, dilation=2), F.max_pool2d(x, 2, 1, 1, dilation=2),
           dtype)
    _close(ops.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
           F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), dtype)
    _close(ops.avg_pool2d(xl, (2, 3), (1, 2), (1, 1), layout="NHWC").permute(0, 3, 1, 2),
           F.avg_pool2d(x, (2, 3), (1, 2), (1, 1)), dtype)
    _close(ops.global_avg_pool2d(x), F.adaptive_avg_pool2d(x, 1), dtype)
    _close(ops.global_avg_pool2d(xl, layout="NHWC").permute(0, 3, 1, 2),
           F.adaptive_avg_pool2d(x, 1), dtype)


def test_torch_tensors_are_taken_and_returned_zero_copy(cuda: Any) -> None:
    torch = _torch()

    import dnnctl.ops as ops

    x = torch.randn(64, 1000, device="cuda", dtype=torch.bfloat16)
    y = ops.softmax(x)
    assert isinstance(y, torch.Tensor) and y.is_cuda and y.dtype == torch.bfloat16
    assert y.data_ptr() != x.data_ptr()
    ptr = x.data_ptr()
    z = ops.relu(x, inplace=True)
    assert z is x and x.data_ptr() == ptr and bool((x >= 0).all())
    out = torch.empty_like(x)
    assert ops.layer_norm(x, out=out) is out
    assert torch.allclose(out.float().mean(-1), torch.zeros(64, device="cuda"), atol=2e-2)
