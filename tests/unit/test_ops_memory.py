"""Memory-bound ops on the numpy backend: registry, references, CPU variants, heuristics.

The float64 references are checked against independent formulations (a loop-by-loop
PyTorch pooling rule, math.erf, instance / layer norm identities); every numpy variant is
verified against them through dnnctl.ops.check, including odd sizes and NaN / inf.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from dnnctl import ops as dops
from dnnctl.backends.base import DeviceInfo
from dnnctl.backends.registry import get_backend
from dnnctl.errors import UsageError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import rel_norm_error
from dnnctl.ops.batch_norm import persist_fit
from dnnctl.ops.check import check_variant
from dnnctl.ops.registry import get_op, get_variant, variants
from dnnctl.resources import kernels_dir

MEMORY_OPS = ("activation", "softmax", "layer_norm", "rms_norm", "batch_norm", "group_norm",
              "pool2d", "global_avg_pool2d")
DT = ("float32", "float16", "bfloat16")
NP = get_backend("numpy")
CPU = NP.device(0)
H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=232448)


@pytest.mark.parametrize("op_name", MEMORY_OPS)
def test_each_op_has_two_cuda_and_two_numpy_variants_with_sources(op_name: str) -> None:
    cuda, cpu = variants(op_name, "cupy"), variants(op_name, "numpy")
    own = [v for v in cuda if not v.vendor]  # a library through torch has no source
    assert len(own) >= 2 and len(cpu) >= 2, (op_name, [v.name for v in cuda + cpu])
    for v in own:
        assert v.source and (kernels_dir() / v.source).is_file(), (v.name, v.source)
        assert v.doc and v.params, v.name
    assert all(v.doc and v.via_torch for v in cuda if v.vendor)
    assert len({v.name for v in cuda + cpu}) == len(cuda + cpu)


# ----------------------------------------------------------------------------- references


def _torch_pool_naive(x: np.ndarray, mode: str, k: tuple, s: tuple, p: tuple, d: tuple,
                      ceil: bool, cip: bool) -> np.ndarray:
    """PyTorch's max_pool2d / avg_pool2d, one output at a time (NCHW, float64)."""
    n, c, h, w = x.shape

    def osize(size: int, kk: int, ss: int, pp: int, dd: int) -> int:
        o = math.floor((size + 2 * pp - dd * (kk - 1) - 1 + (ss - 1 if ceil else 0)) / ss) + 1
        return o - 1 if ceil and (o - 1) * ss >= size + pp else o

    oh, ow = osize(h, k[0], s[0], p[0], d[0]), osize(w, k[1], s[1], p[1], d[1])
    y = np.empty((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            hs, ws = i * s[0] - p[0], j * s[1] - p[1]
            if mode == "max":
                taps = [x[:, :, hs + a * d[0], ws + b * d[1]] for a in range(k[0])
                        for b in range(k[1]) if 0 <= hs + a * d[0] < h and 0 <= ws + b * d[1] < w]
                y[:, :, i, j] = np.max(np.stack(taps), axis=0)
            else:
                he, we = min(hs + k[0], h + p[0]), min(ws + k[1], w + p[1])
                pool = (he - hs) * (we - ws)
                hs0, ws0, he0, we0 = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
                total = x[:, :, hs0:he0, ws0:we0].sum(axis=(2, 3))
                y[:, :, i, j] = total / (pool if cip else (he0 - hs0) * (we0 - ws0))
    return y


POOLS = [("max", (3, 3), (2, 2), (1, 1), (1, 1), False, True),
         ("max", (3, 3), (2, 2), (1, 1), (1, 1), True, True),
         ("max", (2, 3), (1, 2), (1, 0), (2, 1), True, True),
         ("avg", (3, 3), (2, 2), (1, 1), (1, 1), True, True),
         ("avg", (3, 3), (2, 2), (1, 1), (1, 1), True, False),
         ("avg", (2, 2), (3, 3), (1, 0), (1, 1), False, False),
         ("avg", (4, 1), (2, 1), (2, 0), (1, 1), True, True)]


@pytest.mark.parametrize("mode,k,s,p,d,ceil,cip", POOLS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pool_reference_matches_pytorch_rules(mode: str, k: tuple, s: tuple, p: tuple,
                                              d: tuple, ceil: bool, cip: bool,
                                              layout: str) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 9, 8))
    op = get_op("pool2d")
    prob = op.problem(n=2, c=3, h=9, w=8, mode=mode, kernel=k, stride=s, pad=p, dilation=d,
                      ceil_mode=ceil, count_include_pad=cip, dtype="float32", layout=layout)
    want = _torch_pool_naive(x, mode, k, s, p, d, ceil, cip)
    xin = x if layout == "NCHW" else x.transpose(0, 2, 3, 1)
    got = op.reference(prob, {"x": xin}, {})["y"]
    assert got.shape == op.output_specs(prob)["y"].shape
    got = got if layout == "NCHW" else got.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_pool_keys_follow_pytorch_constraints() -> None:
    op = get_op("pool2d")
    base = dict(n=1, c=1, h=8, w=8, dtype="float16", layout="NCHW")
    assert op.problem(base, mode="max", kernel=3)["stride"] == (3, 3)
    with pytest.raises(UsageError, match="more than half the kernel"):
        op.problem(base, mode="max", kernel=3, pad=2)
    with pytest.raises(UsageError, match="no dilation"):
        op.problem(base, mode="avg", kernel=3, dilation=2)
    with pytest.raises(UsageError, match="output would be"):
        op.problem(dict(base, h=2, w=2), mode="max", kernel=3, dilation=2)
    a = op.problem(base, mode="max", kernel=2, count_include_pad=False)
    assert a == op.problem(base, mode="max", kernel=2)  # irrelevant for max: one key


def test_erfc_has_small_relative_error_everywhere() -> None:
    x = np.concatenate([np.linspace(-7, 26, 6601), [0.0, -0.0, 1e-9, 26.5]])
    want = np.array([math.erfc(v) for v in x])
    assert np.max(np.abs(mc.erfc(x) - want) / want) < 2e-10
    edge = mc.erfc(np.array([np.nan, np.inf, -np.inf, 39.99, 40.01, -60.0]))
    assert np.isnan(edge[0]) and list(edge[1:]) == [0.0, 2.0, 0.0, 0.0, 2.0]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gelu_reference_table_equals_direct_formula(dtype: str) -> None:
    op = get_op("activation")
    prob = op.problem(fn="gelu", shape=(5, 300), dtype=dtype)
    x = op.make_inputs(prob, np.random.default_rng(0))["x"].astype(np.float64)
    table = op.reference(prob, {"x": x}, {})["y"]
    direct = 0.5 * x * np.array([math.erfc(-v / math.sqrt(2)) for v in x.ravel()]
                                ).reshape(x.shape)
    np.testing.assert_allclose(table, direct, rtol=1e-9, atol=0)


def test_softmax_and_norm_references_satisfy_identities() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((7, 33)) * 4
    sm = get_op("softmax")
    p = sm.problem(rows=7, cols=33, dtype="float32")
    y = sm.reference(p, {"x": x}, {})["y"]
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-12)
    lg = sm.reference(sm.problem(rows=7, cols=33, dtype="float32", log=True), {"x": x}, {})
    np.testing.assert_allclose(lg["y"], np.log(y), rtol=1e-10, atol=1e-12)
    ln = get_op("layer_norm")
    z = ln.reference(ln.problem(rows=7, cols=33, dtype="float32", weight=False, bias=False),
                     {"x": x}, {"eps": 0.0})["y"]
    np.testing.assert_allclose(z.mean(axis=1), 0, atol=1e-12)
    np.testing.assert_allclose(z.var(axis=1), 1, rtol=1e-10)
    rn = get_op("rms_norm")
    r = rn.reference(rn.problem(rows=7, cols=33, dtype="float32", weight=False), {"x": x},
                     {"eps": 0.0})["y"]
    np.testing.assert_allclose(np.mean(r * r, axis=1), 1, rtol=1e-10)


def test_group_norm_reference_is_instance_and_layer_norm_at_the_extremes() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 6, 4, 5)) + 3
    gn = get_op("group_norm")
    key = dict(n=2, c=6, h=4, w=5, dtype="float32", layout="NCHW", affine=False)
    one = gn.reference(gn.problem(key, groups=1), {"x": x}, {"eps": 0.0})["y"]
    flat = x.reshape(2, -1)
    want = (flat - flat.mean(1, keepdims=True)) / flat.std(1, keepdims=True)
    np.testing.assert_allclose(one, want.reshape(x.shape), rtol=1e-10, atol=1e-12)
    inst = gn.reference(gn.problem(key, groups=6), {"x": x}, {"eps": 0.0})["y"]
    m, sd = x.mean((2, 3), keepdims=True), x.std((2, 3), keepdims=True)
    np.testing.assert_allclose(inst, (x - m) / sd, rtol=1e-10, atol=1e-12)
    nhwc = gn.reference(gn.problem(key, groups=3, layout="NHWC"),
                        {"x": x.transpose(0, 2, 3, 1)}, {"eps": 0.0})["y"]
    nchw = gn.reference(gn.problem(key, groups=3), {"x": x}, {"eps": 0.0})["y"]
    np.testing.assert_allclose(nhwc.transpose(0, 3, 1, 2), nchw, rtol=1e-12)


def test_batch_norm_training_reference_updates_running_stats_like_pytorch() -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 3, 2, 5)) * 2 + 1
    bn = get_op("batch_norm")
    prob = bn.problem(n=4, c=3, h=2, w=5, dtype="float32", layout="NCHW", training=True,
                      affine=False)
    rm, rv = np.array([0.1, 0.2, 0.3]), np.array([1.0, 2.0, 3.0])
    out = bn.reference(prob, {"x": x, "running_mean": rm, "running_var": rv},
                       {"eps": 1e-5, "momentum": 0.25})
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3))
    np.testing.assert_allclose(out["save_mean"], mean)
    np.testing.assert_allclose(out["save_invstd"], 1 / np.sqrt(var + 1e-5))
    np.testing.assert_allclose(out["new_running_mean"], 0.75 * rm + 0.25 * mean)
    np.testing.assert_allclose(out["new_running_var"], 0.75 * rv + 0.25 * var * 40 / 39)
    with pytest.raises(UsageError, match="more than one value per channel"):
        bn.problem(n=1, c=3, h=1, w=1, dtype="float32", training=True)


def test_batch_norm_training_new_running_leaves_the_running_statistics_alone() -> None:
    """new_running=(mean, var) takes the updated statistics (as the in-place update would
    write them); running_mean / running_var keep their values; it needs both arrays and
    training."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((4, 3, 2, 5)) * 2 + 1).astype(np.float32)
    rm = np.array([0.1, 0.2, 0.3], np.float32)
    rv = np.array([1.0, 2.0, 3.0], np.float32)
    nm, nv = np.full(3, np.nan, np.float32), np.full(3, np.nan, np.float32)
    y = dops.batch_norm(x, rm, rv, training=True, momentum=0.25, new_running=(nm, nv))
    im, iv = rm.copy(), rv.copy()
    y2 = dops.batch_norm(x, im, iv, training=True, momentum=0.25)
    np.testing.assert_array_equal(y, y2)
    np.testing.assert_array_equal(nm, im)
    np.testing.assert_array_equal(nv, iv)
    assert rm.tolist() == np.float32([0.1, 0.2, 0.3]).tolist()
    assert rv.tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(UsageError, match="both new running statistics"):
        dops.batch_norm(x, rm, rv, training=True, new_running=(nm, None))
    with pytest.raises(UsageError, match="only in training"):
        dops.batch_norm(x, rm, rv, new_running=(nm, nv))


# ----------------------------------------------------------------------------- CPU variants

SMALL: dict[str, list[dict[str, Any]]] = {
    "activation": [dict(fn=f, shape=s, dtype=d, bias=b, layout=lay)
                   for f in ("relu", "gelu", "gelu_tanh", "silu", "leaky_relu", "relu6",
                             "hardswish", "hardsigmoid")
                   for s, b, lay in (((3, 5, 7), "channel", "NCHW"), ((3, 5, 7), "channel",
                                                                           "NHWC"),
                                     ((1,), "none", "NCHW"), ((13, 11), "none", "NCHW"))
                   for d in DT] + [dict(fn="sigmoid", shape=(4, 3), dtype="float16"),
                                   dict(fn="tanh", shape=(9,), dtype="bfloat16")],
    "softmax": [dict(rows=r, cols=c, dtype=d, log=lg) for r, c in ((1, 1), (5, 3), (3, 301))
                for d in DT for lg in (False, True)],
    "layer_norm": [dict(rows=r, cols=c, dtype=d, weight=w, bias=b)
                   for r, c in ((1, 1), (4, 77)) for d in DT for w, b in ((1, 1), (0, 0),
                                                                          (1, 0))],
    "rms_norm": [dict(rows=r, cols=c, dtype=d, weight=w) for r, c in ((2, 1), (4, 77))
                 for d in DT for w in (0, 1)],
    "batch_norm": [dict(n=n, c=c, h=h, w=w, dtype=d, layout=lay, training=t, affine=a)
                   for n, c, h, w in ((2, 3, 5, 3), (3, 1, 1, 1)) for d in DT
                   for lay in ("NCHW", "NHWC") for t in (False, True) for a in (False, True)],
    "group_norm": [dict(n=n, c=c, h=h, w=w, groups=g, dtype=d, layout=lay, affine=a)
                   for n, c, h, w, g in ((2, 6, 3, 5, 3), (1, 4, 1, 1, 4)) for d in DT
                   for lay in ("NCHW", "NHWC") for a in (False, True)],
    "pool2d": [dict(n=2, c=3, h=7, w=6, mode=m, kernel=3, stride=2, pad=1, ceil_mode=cm,
                    count_include_pad=cip, dtype=d, layout=lay)
               for m in ("max", "avg") for cm in (False, True) for cip in (False, True)
               for d in ("float32", "bfloat16") for lay in ("NCHW", "NHWC")],
    "global_avg_pool2d": [dict(n=2, c=c, h=h, w=w, dtype=d, layout=lay)
                          for c, h, w in ((3, 5, 7), (1, 1, 1)) for d in DT
                          for lay in ("NCHW", "NHWC")],
}


@pytest.mark.parametrize("op_name", MEMORY_OPS)
def test_numpy_variants_match_the_reference(op_name: str) -> None:
    op = get_op(op_name)
    checked, used = 0, set()
    for key in SMALL[op_name]:
        problem = op.problem(key)
        before = checked
        for v in variants(op_name, "numpy"):
            if not v.supports(problem, CPU):
                continue
            for params in v.param_space(problem, CPU):
                res = check_variant(op, problem, v, params, NP, CPU, seed=checked)
                assert res.ok, f"{problem.short()} {v.name}{params}: {res.detail}"
                checked += 1
                used.add(v.name)
        assert checked > before, f"no numpy variant runs {problem.short()}"
    assert len(used) >= 2


@pytest.mark.parametrize("op_name,key", [
    ("softmax", dict(rows=4, cols=9, dtype="float16")),
    ("softmax", dict(rows=4, cols=9, dtype="float32", log=True)),
    ("activation", dict(fn="relu", shape=(40,), dtype="float32")),
    ("activation", dict(fn="gelu", shape=(40,), dtype="bfloat16")),
    ("pool2d", dict(n=1, c=2, h=5, w=5, mode="max", kernel=3, stride=2, pad=1,
                    dtype="float16", layout="NCHW")),
    ("layer_norm", dict(rows=4, cols=9, dtype="float32")),
])
def test_numpy_variants_propagate_nan_and_inf(op_name: str, key: dict) -> None:
    op = get_op(op_name)
    problem = op.problem(key)
    ins = op.make_inputs(problem, np.random.default_rng(0))
    flat = ins["x"].reshape(-1)
    flat[[1, 7, -2]] = [np.nan, np.inf, -np.inf]
    ref = op.reference(problem, {k: v.astype(np.float64) for k, v in ins.items()},
                       op.default_attrs(problem))["y"]
    assert not np.isfinite(ref).all()
    for v in variants(op_name, "numpy"):
        if not v.supports(problem, CPU):  # (backward variants)
            continue
        out = {"y": np.full(ref.shape, 3.0, dtype=ins["x"].dtype)}
        params = next(iter(v.param_space(problem, CPU)))
        v.build(problem, params, CPU)(ins, out, op.default_attrs(problem))
        assert rel_norm_error(out["y"], ref) <= op.tolerance(problem, "y"), v.name


# ----------------------------------------------------------------------------- heuristics


def _random_key(op_name: str, rng: random.Random) -> dict[str, Any]:
    d = rng.choice(DT)
    lay = rng.choice(("NCHW", "NHWC"))
    pick = rng.choice
    if op_name == "activation":
        return dict(fn=pick(("relu", "gelu", "silu")), dtype=d, layout=lay,
                    shape=tuple(rng.randint(1, 70) for _ in range(rng.randint(2, 4))),
                    bias=pick(("none", "channel")), inplace=pick((False, True)))
    if op_name == "softmax":
        return dict(rows=rng.randint(1, 100000), dtype=d, log=pick((False, True)),
                    cols=pick((1, 3, 8, 100, 1000, 2048, 4097, 16384, 50000, 262144)))
    if op_name in ("layer_norm", "rms_norm"):
        return dict(rows=rng.randint(1, 100000), dtype=d,
                    cols=pick((1, 7, 64, 768, 2050, 4096, 12288, 16384, 65536)))
    n, c = rng.choice((1, 2, 32, 256)), rng.choice((1, 3, 8, 64, 96, 256, 2048))
    h, w = rng.choice((1, 7, 28, 56, 112, 224)), rng.choice((1, 7, 28, 56, 112))
    key = dict(n=n, c=c, h=h, w=w, dtype=d, layout=lay)
    if op_name == "batch_norm":
        key["training"] = n * h * w > 1 and pick((False, True))
    if op_name == "group_norm":
        key["groups"] = pick([g for g in (1, 2, 4, 8, 32) if c % g == 0])
    if op_name == "pool2d":
        k = min(3, h, w)
        key.update(mode=pick(("max", "avg")), kernel=k, stride=pick((1, 2)), pad=k // 2)
    return key


@pytest.mark.parametrize("op_name", MEMORY_OPS)
def test_default_choice_is_a_supported_variant_with_declared_params(op_name: str) -> None:
    op = get_op(op_name)
    rng = random.Random(op_name)
    for _ in range(120):
        problem = op.problem(_random_key(op_name, rng))
        for backend, dev in (("cupy", H200), ("numpy", CPU)):
            choice = op.default_choice(problem, backend, dev)
            v = get_variant(op_name, backend, choice.variant)
            assert v.supports(problem, dev), (problem.short(), choice.label())
            assert v.check_params(choice.param_dict) is None, (problem.short(), choice.label())
            assert v.valid_params(problem, choice.param_dict, dev), (problem.short(),
                                                                     choice.label())
        for v in variants(op_name, "cupy"):
            if v.supports(problem, H200):
                assert next(iter(v.param_space(problem, H200)), None) is not None, (
                    f"{v.name} supports {problem.short()} but offers no valid parameters")


def test_heuristic_picks_the_expected_strategy_by_shape() -> None:
    sm = get_op("softmax")

    def pick(**key: Any) -> str:
        return sm.default_choice(sm.problem(key), "cupy", H200).variant

    assert pick(rows=100000, cols=7, dtype="bfloat16") == "warp_row"
    assert pick(rows=8192, cols=3072, dtype="float16") == "block_row"
    assert pick(rows=8192, cols=8192, dtype="float16") == "async_smem"
    assert pick(rows=1000, cols=50000, dtype="float16") == "async_smem"
    assert pick(rows=1000, cols=100000, dtype="float32") == "online"
    # few long rows: chunks small enough for ~4 blocks per SM
    few = sm.default_choice(sm.problem(rows=4, cols=262144, dtype="float32"), "cupy", H200)
    assert few.label() == "split_row(block=512,chunk=2048,vec=4)"
    bn = get_op("batch_norm")
    train = bn.problem(n=32, c=64, h=56, w=56, dtype="float16", layout="NHWC", training=True)
    assert bn.default_choice(train, "cupy", H200).variant == "train_lastblock"
    # the persistent variants are tuner candidates; their parameters when a plan or a
    # caller wants the fit's pick: one block per SM where the layer allows it
    back = bn.problem(n=64, c=128, h=28, w=28, dtype="float16", layout="NHWC", training=True,
                      activation="relu", **{"pass": "backward"})
    assert bn.default_choice(back, "cupy", H200).variant == "bwd_reduce_dx"
    assert persist_fit.default_params(back, H200) == {"block": 256, "vec": 8, "rows": 24}
    big = bn.problem(n=64, c=256, h=56, w=56, dtype="float16", layout="NHWC", training=True)
    assert persist_fit.default_params(big, H200) is None
    infer = bn.problem(n=32, c=256, h=56, w=56, dtype="float16", layout="NHWC")
    assert bn.default_choice(infer, "cupy", H200).label() == \
        "infer_exact(block=256,unroll=2,vec=8)"
    act = get_op("activation")
    relu = act.problem(fn="relu", shape=(8192, 8192), dtype="float16")
    assert act.default_choice(relu, "cupy", H200).label() == \
        "exact_grid(block=128,unroll=1,vec=8)"
    pool = get_op("pool2d")
    key = dict(n=256, c=64, h=112, w=112, mode="max", kernel=3, stride=2, pad=1,
               dtype="float16", layout="NHWC")
    assert pool.default_choice(pool.problem(key), "cupy", H200).variant == "nhwc_tile"
    key.update(kernel=2, stride=2, pad=0)  # windows that do not overlap: nothing to share
    assert pool.default_choice(pool.problem(key), "cupy", H200).variant == "nhwc_vector"
    gn = get_op("group_norm")
    key = dict(n=32, c=256, h=56, w=56, groups=32, dtype="float16", layout="NHWC")
    assert gn.default_choice(gn.problem(key), "cupy", H200).label() == \
        "async_group(block=512,gpb=2,vec=8)"
    gap = get_op("global_avg_pool2d")
    key = dict(n=256, c=2048, h=7, w=7, dtype="float16", layout="NHWC")
    assert gap.default_choice(gap.problem(key), "cupy", H200).label() == \
        "gap_unrolled(block=256,group=32,unroll=4,vec=8)"
    key = dict(n=32, c=256, h=56, w=56, groups=32, dtype="float16", layout="NHWC")
    key.update(n=1, groups=4)  # 4 groups of 700 KB: split across blocks
    assert gn.default_choice(gn.problem(key), "cupy", H200).variant == "split_group"
