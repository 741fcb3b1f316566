"""conv2d numpy variants: every registered one against the float64 reference (forward, dgrad
and wgrad problems, each variant on the passes it declares), and the CPU heuristic / tuning
picking different winners by shape."""

from __future__ import annotations

import numpy as np
import pytest

from dnnctl.backends.registry import get_backend
from dnnctl.ops.check import check_variant
from dnnctl.ops.conv2d.numpy_variants import erf32, fast_len
from dnnctl.ops.registry import get_op, variants

OP = get_op("conv2d")
BE = get_backend("numpy")
DEV = BE.device(0)

CASES = [
    {},
    {"n": 1, "c": 5, "k": 3, "h": 9, "w": 5},  # N=1, odd sizes
    {"stride": 2, "pad": 1},
    {"pad": [0, 2, 1, 0], "dilation": [2, 1]},  # asymmetric pad, dilation
    {"groups": 2, "stride": [1, 2], "pad": [1, 0]},
    {"groups": 4, "k": 8, "pad": 1},  # depthwise, multiplier 2
    {"groups": 4, "k": 4, "pad": 1, "stride": 2, "bias": True, "activation": "relu"},
    {"r": 1, "s": 1, "n": 1, "residual": True},
    {"r": 2, "s": 5, "pad": [1, 1, 2, 2], "dilation": 2, "w": 11, "bias": True,
     "activation": "gelu", "residual": True},
    {"activation": "silu", "bias": True, "c": 9, "k": 10},
    {"activation": "relu6", "bias": True, "groups": 4, "k": 4, "pad": 1},
    {"activation": "hardswish", "bias": True, "r": 1, "s": 1},
]


def _names():
    return [v.name for v in variants("conv2d", "numpy")]


def test_three_numpy_variants_registered():
    assert set(_names()) >= {"im2col_gemm", "direct", "fft", "dgrad_im2col_gemm",
                             "dgrad_direct", "wgrad_im2col_gemm", "wgrad_direct"}


def _pass_key(case: dict, which: str) -> dict:
    """The case as a problem of pass ``which`` (backward keys carry no epilogue; bias means db
    for wgrad)."""
    if which == "forward":
        return dict(case)
    key = {k: v for k, v in case.items() if k not in ("activation", "residual", "bias")}
    return dict(key, bias=which == "wgrad" and bool(case.get("bias")), **{"pass": which})


@pytest.mark.parametrize("which", ["forward", "dgrad", "wgrad"])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_every_numpy_variant_matches_reference(case, layout, which):
    base = {"n": 2, "c": 4, "h": 7, "w": 6, "k": 6, "r": 3, "s": 3, "layout": layout}
    checked = 0
    for i, dtype in enumerate(("float32", "float16", "bfloat16")):
        problem = OP.problem(dict(base, dtype=dtype, **_pass_key(CASES[case], which)))
        for variant in variants("conv2d", "numpy"):
            if which not in variant.passes:
                assert not variant.supports(problem, DEV)
                continue
            assert variant.supports(problem, DEV)
            for params in variant.param_space(problem, DEV):
                res = check_variant(OP, problem, variant, params, BE, DEV, seed=case * 7 + i)
                assert res.ok, f"{variant.name}{params} {problem.short()}: {res.detail}"
                checked += 1
    assert checked >= 3 * 2


def test_poisoned_output_is_fully_written():
    problem = OP.problem(n=1, c=3, h=5, w=5, k=2, r=3, s=3, pad=[2, 0, 0, 2], stride=2,
                         dtype="float32", layout="NCHW")
    for variant in variants("conv2d", "numpy"):
        if "forward" not in variant.passes:
            continue
        kern = variant.build(problem, next(iter(variant.param_space(problem, DEV))), DEV)
        rng = np.random.default_rng(0)
        inp = OP.make_inputs(problem, rng)
        y = np.full(OP.output_specs(problem)["y"].shape, np.nan, np.float32)
        kern(inp, {"y": y}, {})
        assert np.isfinite(y).all(), variant.name


def test_erf32_accuracy():
    import math

    x = np.linspace(-6, 6, 20001, dtype=np.float32)
    want = np.array([math.erf(float(v)) for v in x])
    assert np.max(np.abs(erf32(x) - want)) < 5e-7


def test_fast_len():
    assert [fast_len(n) for n in (1, 7, 17, 31, 58, 97, 230)] == [1, 8, 18, 32, 60, 100, 240]


def test_workspace_bytes_exact_for_im2col():
    v = next(v for v in variants("conv2d", "numpy") if v.name == "im2col_gemm")
    p = OP.problem(n=4, c=6, h=8, w=8, k=4, r=3, s=3, dtype="float16", layout="NHWC")
    assert v.workspace_bytes(p, {"chunk": 0}) == 4 * 6 * 6 * 9 * 6 * 4
    assert v.workspace_bytes(p, {"chunk": 1}) == 1 * 6 * 6 * 9 * 6 * 4


@pytest.mark.parametrize(("shape", "want"), [
    ({"c": 32, "k": 32, "h": 56, "w": 56, "r": 3, "s": 3, "pad": 1, "groups": 32}, "direct"),
    ({"c": 8, "k": 8, "h": 64, "w": 64, "r": 11, "s": 11, "pad": 5}, "fft"),
    ({"c": 64, "k": 64, "h": 28, "w": 28, "r": 3, "s": 3, "pad": 1}, "im2col_gemm"),
])
def test_cpu_default_heuristic_by_shape(shape, want):
    problem = OP.problem(dict(n=2, dtype="float32", layout="NHWC", **shape))
    assert OP.default_choice(problem, "numpy", DEV).variant == want


def test_cpu_timing_picks_different_winners_by_shape():
    """Real speed differences: depthwise favours tap loops, a 1x1-free 11x11 favours FFT."""
    from dnnctl.ops.check import prepare

    def winner(shape):
        problem = OP.problem(dict(n=2, dtype="float32", layout="NHWC", **shape))
        prep = prepare(OP, problem, BE, np.random.default_rng(0), with_reference=False)
        best = {}
        for variant in variants("conv2d", "numpy"):
            if not variant.supports(problem, DEV):
                continue  # the backward variants
            kern = variant.build(problem, variant.default_params(problem, DEV), DEV)
            ts = BE.time(lambda k=kern: k(prep.inputs, prep.outputs, {}), warmup_ms=2,
                         budget_ms=80, flush_l2=False)
            # the fastest run: a CI machine's other test worker only ever slows a run down
            best[variant.name] = float(np.min(ts))
        return min(best, key=best.get)

    depthwise = winner({"c": 32, "k": 32, "h": 56, "w": 56, "r": 3, "s": 3, "pad": 1,
                        "groups": 32})
    big = winner({"c": 8, "k": 8, "h": 64, "w": 64, "r": 11, "s": 11, "pad": 5})
    assert depthwise != big
