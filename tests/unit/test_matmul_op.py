"""matmul op: key normalization, the float64 reference, numpy variants, the public function."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dnnctl
from dnnctl.backends.registry import get_backend
from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops.base import Choice
from dnnctl.ops.check import check_variant
from dnnctl.ops.dispatch import use_plan
from dnnctl.ops.matmul.numpy_variants import erf32
from dnnctl.ops.registry import get_op, variants

OP = get_op("matmul")
NP = get_backend("numpy")


def key(**kw):
    return dict({"m": 5, "n": 6, "k": 7, "dtype": "float32"}, **kw)


# ----------------------------------------------------------------------------- keys


def test_defaults_and_normalization():
    p = OP.problem(key(trans_a="true", bias=1))
    assert p["batch"] == 1 and p["trans_a"] is True and p["trans_b"] is False
    assert p["bias"] is True and p["activation"] == "none" and p["tf32"] is False


def test_tf32_is_canonicalized_for_16_bit():
    assert OP.problem(key(dtype="float16", tf32=True))["tf32"] is False
    assert OP.problem(key(tf32=True))["tf32"] is True
    assert OP.problem(key(dtype="bfloat16", tf32=True)) == OP.problem(key(dtype="bfloat16"))


def test_bad_keys_name_the_field():
    with pytest.raises(UsageError, match="'activation'"):
        OP.problem(key(activation="tanh"))
    with pytest.raises(UsageError, match="'m'.*>= 1"):
        OP.problem(key(m=0))
    with pytest.raises(UsageError, match="missing"):
        OP.problem({"m": 1, "n": 1, "dtype": "float16"})
    with pytest.raises(UsageError, match="unknown key field"):
        OP.problem(key(alpha=2))


def test_specs_follow_storage_layout():
    p = OP.problem(key(batch=3, trans_a=True, trans_b=True, bias=True))
    specs = OP.input_specs(p)
    assert specs["a"].shape == (3, 7, 5) and specs["b"].shape == (3, 6, 7)
    assert specs["bias"].shape == (6,)
    assert OP.output_specs(p)["y"].shape == (3, 5, 6)
    p1 = OP.problem(key())
    assert OP.input_specs(p1)["a"].shape == (5, 7) and OP.output_specs(p1)["y"].shape == (5, 6)
    assert OP.flops(p) == 2 * 3 * 5 * 6 * 7


# ----------------------------------------------------------------------------- reference


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_reference_matches_loops(ta, tb):
    rng = np.random.default_rng(1)
    p = OP.problem(key(batch=2, trans_a=ta, trans_b=tb, bias=True, activation="gelu"))
    inp = {k: v.astype(np.float64) for k, v in OP.make_inputs(p, rng).items()}
    y = OP.reference(p, inp, {})["y"]
    a, b, bias = inp["a"], inp["b"], inp["bias"]
    for bi in range(2):
        for i in range(5):
            for j in range(6):
                acc = sum((a[bi, kk, i] if ta else a[bi, i, kk]) *
                          (b[bi, j, kk] if tb else b[bi, kk, j]) for kk in range(7))
                v = acc + bias[j]
                v = 0.5 * v * math.erfc(-v / math.sqrt(2))
                # the reference's erfc has a relative error under 2e-10
                assert y[bi, i, j] == pytest.approx(v, rel=1e-9, abs=1e-12)


def test_tolerances_by_dtype():
    assert OP.tolerance(OP.problem(key()), "y") == 1e-5
    assert OP.tolerance(OP.problem(key(tf32=True)), "y") == 1e-3
    assert 1e-3 <= OP.tolerance(OP.problem(key(dtype="float16")), "y") <= 1e-2
    assert 1e-3 <= OP.tolerance(OP.problem(key(dtype="bfloat16")), "y") <= 1e-2


def test_erf32_accuracy():
    x = np.linspace(-6, 6, 2001).astype(np.float32)
    ref = np.vectorize(math.erf)(x.astype(np.float64))
    assert np.max(np.abs(erf32(x) - ref)) < 5e-7  # 1.5e-7 formula + float32 arithmetic


# ----------------------------------------------------------------------------- variants

SHAPES = [
    dict(m=1, n=1, k=1),
    dict(m=33, n=17, k=65, bias=True, activation="relu"),
    dict(m=70, n=9, k=3, trans_a=True, activation="silu"),
    dict(batch=3, m=19, n=40, k=31, trans_b=True, bias=True, activation="gelu"),
    dict(batch=2, m=130, n=3, k=5, trans_a=True, trans_b=True),
]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_numpy_variants_verify(dtype, shape):
    p = OP.problem(key(dtype=dtype, **shape))
    dev = NP.device(0)
    seen = 0
    for v in variants("matmul", "numpy"):
        assert v.supports(p, dev)
        for params in v.param_space(p, dev):
            res = check_variant(OP, p, v, params, NP, dev, seed=seen)
            assert res.ok, f"{v.name}{params}: {res.detail}"
            seen += 1
    assert seen >= 2


def test_blocked_param_space_is_real_choice():
    v = next(v for v in variants("matmul", "numpy") if v.name == "blocked")
    p = OP.problem(key(m=300))
    blocks = [pp["block"] for pp in v.param_space(p, NP.device(0))]
    assert blocks == [32, 64, 128, 256]


def test_default_choice_numpy():
    assert OP.default_choice(OP.problem(key()), "numpy", NP.device(0)).variant == "numpy"


# ----------------------------------------------------------------------------- function


def _ref(a, b, bias=None, act="none"):
    y = np.matmul(a.astype(np.float64), b.astype(np.float64))
    if bias is not None:
        y = y + bias
    if act == "relu":
        y = np.maximum(y, 0)
    return y


def test_function_2d_and_transposed_views_take_no_copy():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((6, 4)).astype(np.float32)
    b = rng.standard_normal((3, 6)).astype(np.float32)
    y = dnnctl.ops.matmul(a.T, b.T, activation="relu")
    assert y.shape == (4, 3)
    np.testing.assert_allclose(y, _ref(a.T, b.T, act="relu"), rtol=1e-5, atol=1e-6)


class _Recorder:
    """A plan that records the keys it is asked about and answers 'blocked'."""

    def __init__(self):
        self.keys = []

    def lookup(self, problem, backend, device):
        self.keys.append(problem)
        return Choice.of("blocked", {"block": 32})


def test_function_keys_and_batching():
    rng = np.random.default_rng(3)
    rec = _Recorder()
    a3 = rng.standard_normal((2, 5, 4)).astype(np.float16)
    b2 = rng.standard_normal((4, 3)).astype(np.float16)
    with use_plan(rec):
        y = dnnctl.ops.matmul(a3, b2)  # folded into one (10 x 4) @ (4 x 3) product
        assert y.shape == (2, 5, 3) and y.dtype == np.float16
        np.testing.assert_allclose(y.astype(np.float64), _ref(a3, b2), rtol=5e-3, atol=5e-3)
        b3 = rng.standard_normal((2, 3, 4)).astype(np.float16).swapaxes(1, 2)
        bias = rng.standard_normal(3).astype(np.float16)
        y = dnnctl.ops.matmul(a3, b3, bias=bias)
        np.testing.assert_allclose(y.astype(np.float64), _ref(a3, b3, bias.astype(np.float64)),
                                   rtol=5e-3, atol=5e-3)
        y = dnnctl.ops.matmul(a3[0], b3)  # 2-D a broadcast over the batch
        assert y.shape == (2, 5, 3)
    k0, k1, k2 = (p.as_dict() for p in rec.keys)
    assert (k0["batch"], k0["m"], k0["n"], k0["k"]) == (1, 10, 3, 4)
    assert (k1["batch"], k1["trans_b"], k1["bias"]) == (2, True, True)
    assert k2["batch"] == 2 and not k2["trans_a"]


def test_function_rejects_bad_operands():
    a = np.ones((3, 4), np.float32)
    with pytest.raises(ShapeError, match="do not chain"):
        dnnctl.ops.matmul(a, np.ones((5, 2), np.float32))
    with pytest.raises(ShapeError, match="dtype"):
        dnnctl.ops.matmul(a, np.ones((4, 2), np.float16))
    with pytest.raises(ShapeError, match="bias"):
        dnnctl.ops.matmul(a, np.ones((4, 2), np.float32), bias=np.ones(3, np.float32))
    with pytest.raises(ShapeError, match="batch sizes"):
        dnnctl.ops.matmul(np.ones((2, 3, 4), np.float32), np.ones((3, 4, 2), np.float32))
    with pytest.raises(UsageError, match="activation"):
        dnnctl.ops.matmul(a, np.ones((4, 2), np.float32), activation="tanh")
