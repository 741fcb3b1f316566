"""matmul on the GPU: every registered cupy variant (cublas, mma, mma_atomic, simt, and any
added later) x dtype against the float64 reference on fresh random inputs with NaN-poisoned
outputs: size 1, odd sizes (scalar-load paths), M/N/K not multiples of any tile, both
transposes, batches, every epilogue, split-K, TF32. Then determinism of the two-pass split-K,
and the public API on CuPy arrays and torch tensors (DLPack, transposed and misaligned views).

Each case checks one parameter set, alternating the variant's default and a (seeded) split-K
or random sample of its space: NVRTC compiles bound the run (about 2 minutes cold, seconds
once CuPy's kernel cache is warm).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from dnnctl.backends.registry import get_backend
from dnnctl.ops.base import Choice, rel_norm_error
from dnnctl.ops.check import check_variant, prepare
from dnnctl.ops.registry import get_op, variants

OP = get_op("matmul")

CASES: list[tuple[str, dict]] = [
    ("size1", dict(m=1, n=1, k=1)),
    ("odd_all", dict(m=33, n=41, k=77, activation="relu")),
    ("tile_tails", dict(m=130, n=136, k=72, bias=True)),
    ("trans_a_gelu", dict(m=70, n=96, k=104, trans_a=True, bias=True, activation="gelu")),
    ("trans_b_batch3", dict(batch=3, m=40, n=24, k=200, trans_b=True, bias=True)),
    ("both_trans_silu", dict(m=64, n=80, k=96, trans_a=True, trans_b=True, activation="silu")),
    ("skinny_deep", dict(m=16, n=512, k=3000, bias=True)),
    ("decode_like", dict(m=5, n=1000, k=1536, trans_b=True, activation="silu")),
    ("square_512", dict(m=512, n=512, k=512)),
    ("tf32", dict(m=100, n=70, k=130, tf32=True, bias=True)),
]
DTYPES = ("float32", "float16", "bfloat16")


def _names() -> list[str]:
    return [v.name for v in variants("matmul", "cupy")]


@pytest.fixture(scope="module")
def gpu():
    be = get_backend("cupy")
    return be, be.device(0)


def _params(variant, problem, dev, rng: random.Random, i: int) -> dict | None:
    """One parameter set per case (compiles dominate the run): the variant's default on
    even cases, a split-K sample (else a random one) on odd cases."""
    own = getattr(variant, "default_params", None)
    if i % 2 == 0:
        return own(problem, dev) if own else next(iter(variant.param_space(problem, dev)),
                                                  None)
    space = list(variant.param_space(problem, dev))
    split = [p for p in space if p.get("splitk", 1) > 1]
    return rng.choice(split or space) if space else None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", _names())
def test_variant_matches_reference(name, dtype, gpu):
    be, dev = gpu
    variant = next(v for v in variants("matmul", "cupy") if v.name == name)
    rng = random.Random(f"{name}/{dtype}")
    checked, failures = 0, []
    for i, (cid, case) in enumerate(CASES):
        if case.get("tf32") and dtype != "float32":
            continue
        problem = OP.problem(dict(case, dtype=dtype))
        if not variant.supports(problem, dev):
            continue
        params = _params(variant, problem, dev, rng, i)
        assert params is not None, f"{name} supports {cid} but has no valid parameters"
        assert variant.check_params(params) is None
        res = check_variant(OP, problem, variant, params, be, dev, seed=100 + i)
        checked += 1
        if not res.ok:
            failures.append(f"{cid} {params}: {res.detail}")
        elif problem["m"] * problem["n"] >= 64 and (dtype != "float32" or problem["tf32"]):
            # a wrong-but-close kernel would sit near the tolerance; real ones do not
            assert res.max_rel_err < OP.tolerance(problem, "y") / 2, (cid, params, res)
    if checked == 0:
        pytest.skip(f"{name} supports none of the cases for {dtype}")
    assert not failures, f"{name} {dtype}:\n" + "\n".join(failures)


def test_every_case_has_a_variant(gpu):
    _, dev = gpu
    for cid, case in CASES:
        for dtype in DTYPES:
            if case.get("tf32") and dtype != "float32":
                continue
            p = OP.problem(dict(case, dtype=dtype))
            assert any(v.supports(p, dev) for v in variants("matmul", "cupy")), cid


def _run(kern, problem, be, host_inputs=None, seed=0):
    prep = prepare(OP, problem, be, np.random.default_rng(seed))
    if host_inputs is not None:
        prep.inputs = {k: be.asarray(a) for k, a in host_inputs.items()}
        prep.host_inputs = host_inputs
    kern(prep.inputs, prep.outputs, {})
    be.synchronize()
    return prep.host_inputs, be.to_numpy(prep.outputs["y"])


def test_split_k_is_bitwise_deterministic(gpu):
    """Two-pass and fused split-K sum the slabs in split order: identical bits, run to run,
    between the two forms and with the overlapped mainloop; the fused kernel's tile counters
    reset between launches."""
    from dnnctl.ops.registry import get_variant

    be, dev = gpu
    p = OP.problem(dict(m=16, n=256, k=4096, dtype="bfloat16", bias=True, activation="gelu"))
    base = {"bm": 16, "bn": 64, "bk": 32, "warps": 4, "stages": 4, "splitk": 8}
    mma = get_variant("matmul", "cupy", "mma")
    fused = mma.build(p, dict(base, reduce="fused", pipe="simple"), dev)
    separate = mma.build(p, dict(base, reduce="separate", pipe="simple"), dev)
    overlap = mma.build(p, dict(base, reduce="fused", pipe="overlap"), dev)
    host, y1 = _run(fused, p, be, seed=5)
    _, y2 = _run(fused, p, be, host_inputs=host)  # same kernel again: counters were reset
    _, y3 = _run(separate, p, be, host_inputs=host)
    _, y5 = _run(overlap, p, be, host_inputs=host)  # same mma order, other schedule
    assert np.array_equal(y1.view(np.uint16), y2.view(np.uint16))
    assert np.array_equal(y1.view(np.uint16), y3.view(np.uint16))
    assert np.array_equal(y1.view(np.uint16), y5.view(np.uint16))
    atomic = get_variant("matmul", "cupy", "mma_atomic").build(p, base, dev)
    _, ya = _run(atomic, p, be, host_inputs=host)
    ref = OP.reference(p, {k: v.astype(np.float64) for k, v in host.items()}, {})["y"]
    assert rel_norm_error(ya, ref) < 8e-3 and rel_norm_error(y1, ref) < 8e-3
    h4, y4 = _run(fused, p, be, seed=6)  # fresh inputs through the same kernel
    ref4 = OP.reference(p, {k: v.astype(np.float64) for k, v in h4.items()}, {})["y"]
    assert rel_norm_error(y4, ref4) < 8e-3


# ----------------------------------------------------------------------------- wgmma

WG_MODES = [
    # (key, params): every operand major-ness, both warpgroup counts, 128 x 256 tiles,
    # swapped skinny products, split-K in both reductions, tails everywhere
    (dict(m=300, n=520, k=1000, bias=True, activation="gelu"),
     dict(bm=128, bn=256, warps=8, stages=4, splitk=1, swap=0)),
    (dict(m=200, n=200, k=333, trans_a=True), dict(bm=256, bn=128, warps=8, stages=3,
                                                   splitk=1, swap=0)),
    (dict(m=130, n=136, k=2000, trans_a=True, trans_b=True, bias=True),
     dict(bm=128, bn=128, warps=8, stages=5, splitk=4, swap=0)),
    (dict(m=64, n=4096, k=1024, trans_b=True, activation="silu"),
     dict(bm=64, bn=128, warps=4, stages=6, splitk=4, swap=0)),
    (dict(m=16, n=4096, k=4096, trans_b=True, bias=True),
     dict(bm=128, bn=16, warps=4, stages=6, splitk=4, swap=1)),
    (dict(m=27, n=1000, k=1536, trans_b=True, activation="relu"),
     dict(bm=128, bn=32, warps=4, stages=6, splitk=2, swap=1)),
    (dict(batch=3, m=40, n=136, k=520, trans_a=True),
     dict(bm=128, bn=64, warps=8, stages=3, splitk=2, swap=1)),
    (dict(m=7, n=300, k=777, trans_b=True), dict(bm=64, bn=16, warps=4, stages=4, splitk=1,
                                                 swap=1)),
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize(("key", "params"), WG_MODES, ids=[f"mode{i}" for i in range(8)])
def test_wgmma_modes(key, params, dtype, gpu):
    """The Hopper kernel's modes one by one (the registry test samples them)."""
    from dnnctl.ops.registry import get_variant

    be, dev = gpu
    wg = get_variant("matmul", "cupy", "wgmma")
    problem = OP.problem(dict(key, dtype=dtype))
    if not wg.supports(problem, dev):
        pytest.skip(wg.supports(problem, dev).reason)
    full = dict(params, bk=64, reduce="fused")
    assert wg.check_params(full) is None and wg.valid_params(problem, full, dev)
    res = check_variant(OP, problem, wg, full, be, dev, seed=41)
    assert res.ok, res.detail
    assert res.max_rel_err < OP.tolerance(problem, "y") / 2, res


def test_wgmma_split_k_is_bitwise_deterministic(gpu):
    """Fused and separate split-K of the wgmma kernel sum the same slabs in the same order."""
    from dnnctl.ops.registry import get_variant

    be, dev = gpu
    wg = get_variant("matmul", "cupy", "wgmma")
    p = OP.problem(dict(m=16, n=512, k=4096, dtype="bfloat16", trans_b=True, bias=True,
                        activation="gelu"))
    if not wg.supports(p, dev):
        pytest.skip(wg.supports(p, dev).reason)
    base = dict(bm=128, bn=16, bk=64, warps=4, stages=6, splitk=8, swap=1)
    fused = wg.build(p, dict(base, reduce="fused"), dev)
    separate = wg.build(p, dict(base, reduce="separate"), dev)
    host, y1 = _run(fused, p, be, seed=5)
    _, y2 = _run(fused, p, be, host_inputs=host)
    _, y3 = _run(separate, p, be, host_inputs=host)
    assert np.array_equal(y1.view(np.uint16), y2.view(np.uint16))
    assert np.array_equal(y1.view(np.uint16), y3.view(np.uint16))
    ref = OP.reference(p, {k: v.astype(np.float64) for k, v in host.items()}, {})["y"]
    assert rel_norm_error(y1, ref) < 8e-3


# ----------------------------------------------------------------------------- public API


class _Pin:
    """A plan that pins one variant (and its parameters) for every matmul call."""

    def __init__(self, variant, params=None):
        self.choice = Choice.of(variant, params or {})

    def lookup(self, problem, backend, device):
        return self.choice if problem.op == "matmul" else None


def _ref64(a, b, bias=None, act="none"):
    y = np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64))
    if bias is not None:
        y = y + np.asarray(bias, np.float64)
    if act == "gelu":
        y = 0.5 * y * (1 + np.vectorize(math.erf)(y / math.sqrt(2)))
    elif act == "relu":
        y = np.maximum(y, 0)
    return y


@pytest.mark.parametrize("pin", [None, "mma", "cublas"])
def test_public_api_cupy_views(pin, gpu):
    cp = pytest.importorskip("cupy")
    import ml_dtypes

    import dnnctl

    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((96, 80)).astype(bf16)      # used transposed: (80, 96) @ ...
    b = (rng.standard_normal((96, 72)) / 10).astype(bf16)
    bias = rng.standard_normal(72).astype(bf16)
    plan = _Pin(pin) if pin else None
    if pin == "mma":
        plan = _Pin("mma", {"bm": 64, "bn": 64, "bk": 32, "warps": 4, "stages": 3,
                            "splitk": 1, "reduce": "fused", "pipe": "overlap"})
    y = dnnctl.ops.matmul(cp.asarray(a).T, cp.asarray(b), bias=cp.asarray(bias),
                          activation="gelu", plan=plan)
    assert isinstance(y, cp.ndarray) and y.shape == (80, 72) and y.dtype == bf16
    ref = _ref64(a.T, b, bias, "gelu")
    assert rel_norm_error(cp.asnumpy(y), ref) < 8e-3


def test_public_api_misaligned_and_batched(gpu):
    cp = pytest.importorskip("cupy")
    import dnnctl

    rng = np.random.default_rng(4)
    m, k, n = 33, 64, 40
    host_a = rng.standard_normal((3, m, k)).astype(np.float16)
    base = cp.empty(host_a.size + 1, dtype=cp.float16)
    base[1:] = cp.asarray(host_a.ravel())
    a = base[1:].reshape(3, m, k)  # 2-byte offset: no 16-byte loads possible
    assert a.data.ptr % 16 != 0
    b = cp.asarray((rng.standard_normal((3, k, n)) / 8).astype(np.float16))
    plan = _Pin("mma", {"bm": 32, "bn": 64, "bk": 32, "warps": 4, "stages": 2, "splitk": 2,
                        "reduce": "fused", "pipe": "simple"})
    y = dnnctl.ops.matmul(a, b, activation="relu", plan=plan)
    assert y.shape == (3, m, n)
    assert rel_norm_error(cp.asnumpy(y), _ref64(host_a, cp.asnumpy(b), act="relu")) < 2e-3
    y2 = dnnctl.ops.matmul(a, b[0], plan=plan)  # 3-D @ 2-D: one (3m x k) product
    assert rel_norm_error(cp.asnumpy(y2), _ref64(host_a, cp.asnumpy(b[0]))) < 2e-3


def test_public_api_torch_dlpack(gpu):
    torch = pytest.importorskip("torch")
    import dnnctl

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(9)
    a = torch.randn(4, 64, 128, device=dev, generator=g, dtype=torch.bfloat16)
    w = torch.randn(256, 128, device=dev, generator=g, dtype=torch.bfloat16) / 11
    bias = torch.randn(256, device=dev, generator=g, dtype=torch.bfloat16)
    for plan in (None, _Pin("mma", {"bm": 64, "bn": 128, "bk": 32, "warps": 4, "stages": 4,
                                    "splitk": 1, "reduce": "fused", "pipe": "overlap"})):
        y = dnnctl.ops.matmul(a, w.t(), bias=bias, activation="gelu", plan=plan)  # a @ W^T
        assert isinstance(y, torch.Tensor) and y.device.type == "cuda"
        assert y.shape == (4, 64, 256) and y.dtype == torch.bfloat16
        ref = torch.nn.functional.gelu(a.double() @ w.double().t() + bias.double())
        err = ((y.double() - ref).norm() / ref.norm()).item()
        assert err < 8e-3, err
