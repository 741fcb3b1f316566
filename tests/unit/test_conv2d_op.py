"""conv2d op: key normalization, geometry, the float64 reference and the public function."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops.conv2d.op import geometry, output_size, pad4
from dnnctl.ops.registry import get_op

OP = get_op("conv2d")
BASE = {"n": 2, "c": 4, "h": 7, "w": 6, "k": 6, "r": 3, "s": 3, "dtype": "float32",
        "layout": "NCHW"}


def key(**kw):
    return dict(BASE, **kw)


def naive_conv(x, w, stride, pad, dil, groups):
    """Loop-by-loop definition (NCHW, float64) to check the vectorized reference against."""
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    top, bottom, left, right = pad
    p = (h + top + bottom - dil[0] * (r - 1) - 1) // stride[0] + 1
    q = (wd + left + right - dil[1] * (s - 1) - 1) // stride[1] + 1
    kg = k // groups
    y = np.zeros((n, k, p, q))
    for b in range(n):
        for ko in range(k):
            g = ko // kg
            for i in range(p):
                for j in range(q):
                    acc = 0.0
                    for ci in range(cg):
                        for u in range(r):
                            for v in range(s):
                                hi = i * stride[0] - top + u * dil[0]
                                wi = j * stride[1] - left + v * dil[1]
                                if 0 <= hi < h and 0 <= wi < wd:
                                    acc += x[b, g * cg + ci, hi, wi] * w[ko, ci, u, v]
                    y[b, ko, i, j] = acc
    return y


# ----------------------------------------------------------------------------- keys


def test_pad_canonical_forms():
    assert OP.problem(key(pad=1))["pad"] == (1, 1)
    assert OP.problem(key(pad=[1, 2]))["pad"] == (1, 2)
    assert OP.problem(key(pad=[1, 1, 2, 2]))["pad"] == (1, 2)
    assert OP.problem(key(pad=[0, 1, 0, 1]))["pad"] == (0, 1, 0, 1)
    assert OP.problem(key(pad="1,1,2,2"))["pad"] == (1, 2)
    # the same convolution written two ways is one problem (plan keys match)
    assert OP.problem(key(pad=[2, 2, 1, 1])) == OP.problem(key(pad=[2, 1]))
    with pytest.raises(UsageError, match="pad"):
        OP.problem(key(pad=[1, 2, 3]))
    with pytest.raises(UsageError, match=">= 0"):
        OP.problem(key(pad=-1))


def test_defaults_and_scalars_broadcast():
    p = OP.problem(key(stride=2, dilation=[1, 2]))
    assert p["stride"] == (2, 2) and p["dilation"] == (1, 2) and p["pad"] == (0, 0)
    assert p["groups"] == 1 and p["activation"] == "none" and not p["bias"]
    assert not p["residual"] and not p["tf32"]


def test_check_rejects_inconsistent_keys():
    with pytest.raises(UsageError, match="c=4 is not divisible by groups=3"):
        OP.problem(key(groups=3, k=6))
    with pytest.raises(UsageError, match="k=6 is not divisible by groups=4"):
        OP.problem(key(groups=4))
    with pytest.raises(UsageError, match="output size"):
        OP.problem(key(h=2, r=3))
    with pytest.raises(UsageError, match="output size"):
        OP.problem(key(h=5, r=3, dilation=3))
    with pytest.raises(UsageError, match="activation"):
        OP.problem(key(activation="tanh"))
    with pytest.raises(UsageError, match="layout"):
        OP.problem(key(layout="CHWN"))
    with pytest.raises(UsageError, match="dtype"):
        OP.problem({k: v for k, v in BASE.items() if k != "dtype"})


def test_tf32_only_kept_for_float32():
    assert OP.problem(key(tf32=True))["tf32"] is True
    assert OP.problem(key(tf32=True, dtype="float16"))["tf32"] is False


def test_output_size_matches_torch_formula():
    assert output_size(56, 56, 3, 3, (1, 1), (1, 1), (1, 1)) == (56, 56)
    assert output_size(224, 224, 7, 7, (2, 2), (3, 3), (1, 1)) == (112, 112)
    assert output_size(56, 56, 1, 1, (2, 2), (0, 0), (1, 1)) == (28, 28)
    assert output_size(7, 8, 3, 3, (2, 2), (0, 1, 2, 0), (2, 1)) == (2, 4)
    assert pad4((1, 2)) == (1, 1, 2, 2)


def test_specs_by_layout():
    g = geometry(OP.problem(key(layout="NHWC", groups=2, bias=True, residual=True)))
    specs = OP.input_specs(OP.problem(key(layout="NHWC", groups=2, bias=True, residual=True)))
    assert specs["x"].shape == (2, 7, 6, 4)
    assert specs["w"].shape == (6, 3, 3, 2)
    assert specs["bias"].shape == (6,)
    assert specs["residual"].shape == (2, g.p, g.q, 6) == (2, 5, 4, 6)
    nchw = OP.problem(key(groups=2))
    assert OP.input_specs(nchw)["w"].shape == (6, 2, 3, 3)
    assert set(OP.input_specs(nchw)) == {"x", "w"}
    assert OP.output_specs(nchw)["y"].shape == (2, 6, 5, 4)


def test_flops_and_bytes():
    p = OP.problem(key(groups=2))
    assert OP.flops(p) == 2 * 2 * 6 * 5 * 4 * 2 * 9
    assert OP.min_bytes(p) == 4 * (2 * 4 * 7 * 6 + 6 * 2 * 9 + 2 * 6 * 5 * 4)


def test_make_inputs_scaled_and_nonzero():
    p = OP.problem(key(c=64, k=64, h=9, w=9, dtype="float16", bias=True, residual=True))
    inp = OP.make_inputs(p, np.random.default_rng(0))
    assert inp["x"].dtype == np.float16
    assert np.count_nonzero(inp["x"]) > 0.99 * inp["x"].size
    assert abs(float(np.std(inp["w"].astype(np.float64))) - 1 / math.sqrt(64 * 9)) < 0.005
    y = OP.reference(p, {k: v.astype(np.float64) for k, v in inp.items()}, {})["y"]
    assert 0.3 < float(np.std(y)) < 3.0  # O(1) outputs: fp16 keeps its precision
    assert set(inp) == {"x", "w", "bias", "residual"}


def test_tolerances():
    assert OP.tolerance(OP.problem(key()), "y") == 1e-5
    assert OP.tolerance(OP.problem(key(tf32=True)), "y") == 1e-3
    assert OP.tolerance(OP.problem(key(dtype="float16")), "y") == 2e-3
    assert OP.tolerance(OP.problem(key(dtype="bfloat16")), "y") == 8e-3


# ----------------------------------------------------------------------------- reference


@pytest.mark.parametrize("kw", [
    {},
    {"stride": 2, "pad": 1},
    {"pad": [0, 2, 1, 0], "dilation": [2, 1]},
    {"groups": 2, "stride": [1, 2], "pad": [1, 0]},
    {"groups": 4, "k": 8, "pad": 1},  # depthwise, multiplier 2
    {"r": 1, "s": 1, "n": 1},
    {"r": 2, "s": 5, "pad": [1, 1, 2, 2], "dilation": 2, "w": 11},
])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_reference_matches_naive_loops(kw, layout):
    p = OP.problem(key(layout=layout, **kw))
    g = geometry(p)
    rng = np.random.default_rng(1)
    inp = {k: v.astype(np.float64) for k, v in OP.make_inputs(p, rng).items()}
    got = OP.reference(p, inp, {})["y"]
    x, w = inp["x"], inp["w"]
    if layout == "NHWC":
        x, w = x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2)
    want = naive_conv(x, w, (g.sh, g.sw), (g.pt, g.pb, g.pl, g.pr), (g.dh, g.dw), g.groups)
    if layout == "NHWC":
        want = want.transpose(0, 2, 3, 1)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("act", ["none", "relu", "gelu", "silu", "relu6", "hardswish"])
def test_reference_epilogue_order(act):
    p = OP.problem(key(bias=True, residual=True, activation=act, pad=1))
    rng = np.random.default_rng(2)
    inp = {k: v.astype(np.float64) for k, v in OP.make_inputs(p, rng).items()}
    plain = OP.reference(OP.problem(key(pad=1)), inp, {})["y"]
    z = plain + inp["bias"].reshape(1, -1, 1, 1)
    act_fn = {"none": lambda t: t, "relu": lambda t: np.maximum(t, 0),
              "gelu": lambda t: 0.5 * t * np.vectorize(math.erfc)(-t / math.sqrt(2)),
              "silu": lambda t: t / (1 + np.exp(-t)), "relu6": lambda t: np.clip(t, 0, 6),
              "hardswish": lambda t: t * np.clip(t + 3, 0, 6) / 6}[act]
    want = act_fn(z) + inp["residual"]
    tol = 1e-9 if act == "gelu" else 1e-12  # the reference's erfc: relative error < 2e-10
    np.testing.assert_allclose(OP.reference(p, inp, {})["y"], want, rtol=tol, atol=tol)


def test_reference_relu_propagates_nan():
    p = OP.problem(key(r=1, s=1, activation="relu"))
    inp = {k: v.astype(np.float64) for k, v in OP.make_inputs(p, np.random.default_rng(3)).items()}
    inp["x"][0, 0, 0, 0] = np.nan
    y = OP.reference(p, inp, {})["y"]
    assert np.isnan(y[0, :, 0, 0]).all() and np.isfinite(y[1]).all()


# ----------------------------------------------------------------------------- public function


def test_public_conv2d_numpy_matches_reference():
    from dnnctl.ops import conv2d

    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 9, 8, 4), dtype=np.float32)  # NHWC
    w = rng.standard_normal((6, 3, 3, 2), dtype=np.float32)
    b = rng.standard_normal(6, dtype=np.float32)
    res = rng.standard_normal((2, 4, 4, 6), dtype=np.float32)
    y = conv2d(x, w, bias=b, stride=2, padding=(1, 0, 1, 0), groups=2, activation="silu",
               residual=res, layout="NHWC")
    p = OP.problem(n=2, c=4, h=9, w=8, k=6, r=3, s=3, stride=2, pad=[1, 0, 1, 0], groups=2,
                   dtype="float32", layout="NHWC", bias=True, activation="silu", residual=True)
    want = OP.reference(p, {"x": x.astype(np.float64), "w": w.astype(np.float64),
                            "bias": b.astype(np.float64), "residual": res.astype(np.float64)},
                        {})["y"]
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == want.shape
    assert np.linalg.norm(y - want) / np.linalg.norm(want) < 1e-5


def test_public_conv2d_same_padding_and_callable_package():
    import dnnctl.ops
    import dnnctl.ops.conv2d as pkg

    x = np.random.default_rng(5).standard_normal((1, 3, 10, 11), dtype=np.float32)
    w = np.random.default_rng(6).standard_normal((5, 3, 4, 3), dtype=np.float32)
    y1 = pkg(x, w, padding="same", dilation=2)
    y2 = dnnctl.ops.conv2d(x, w, padding=(3, 3, 2, 2), dilation=2)
    assert y1.shape == (1, 5, 10, 11)
    np.testing.assert_array_equal(y1, y2)


def test_public_conv2d_shape_errors():
    from dnnctl.ops import conv2d

    x = np.zeros((1, 4, 5, 5), np.float32)
    with pytest.raises(ShapeError, match=r"C/groups = 4/2"):
        conv2d(x, np.zeros((3, 4, 3, 3), np.float32), groups=2)
    with pytest.raises(ShapeError, match=r"bias has shape \(2,\), expected \(3,\)"):
        conv2d(x, np.zeros((3, 4, 3, 3), np.float32), bias=np.zeros(2, np.float32))
    with pytest.raises(ShapeError, match="dtype float16, expected float32"):
        conv2d(x, np.zeros((3, 4, 3, 3), np.float16))
    with pytest.raises(ShapeError, match=r"residual has shape .* expected \(1, 3, 3, 3\)"):
        conv2d(x, np.zeros((3, 4, 3, 3), np.float32), residual=np.zeros((1, 3, 5, 5),
                                                                         np.float32))
    with pytest.raises(ShapeError, match="4 dims"):
        conv2d(x[0], np.zeros((3, 4, 3, 3), np.float32))
    with pytest.raises(UsageError, match="activation"):
        conv2d(x, np.zeros((3, 4, 3, 3), np.float32), activation="tanh")
    with pytest.raises(UsageError, match="output size"):
        conv2d(x, np.zeros((3, 4, 7, 7), np.float32))
