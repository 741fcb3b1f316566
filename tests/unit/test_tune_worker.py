"""The worker's request handlers (run in-process on the numpy backend) and its helpers."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from dnnctl.backends.registry import get_backend
from dnnctl.ops.base import rel_norm_error
from dnnctl.tune.timer import TimingPolicy
from dnnctl.tune.worker import Evaluator, classify, healthy, rel_err_xp

KEY = {"n": 1, "c": 4, "h": 12, "w": 12, "k": 4, "r": 3, "s": 3, "pad": 1, "dtype": "float32",
       "layout": "NCHW"}
POLICY = TimingPolicy.for_backend("numpy").replace(warmup_ms=0.5, budget_ms=2.0,
                                                   retime_budget_ms=1.0, retime_rounds=2)


def _cases():
    rng = np.random.default_rng(0)
    r = rng.standard_normal((5, 7))
    o = r + 1e-3 * rng.standard_normal((5, 7))
    nan_r, nan_o = r.copy(), o.copy()
    nan_r[0, 0] = nan_o[0, 0] = np.nan
    inf_o = o.copy()
    inf_o[1, 1] = np.inf
    inf_r, same_inf = r.copy(), o.copy()
    inf_r[2, 2] = same_inf[2, 2] = np.inf
    wrong_inf = o.copy()
    wrong_inf[2, 2] = -np.inf
    return [(o.astype(np.float16), r), (nan_o, nan_r), (o, nan_r), (inf_o, r),
            (same_inf, inf_r), (wrong_inf, inf_r), (np.zeros(3), np.zeros(3)),
            (np.ones(3), np.zeros(3)), (np.ones(3), np.zeros(4)),
            (r.astype(ml_dtypes.bfloat16), r)]


@pytest.mark.parametrize("out,ref", _cases())
def test_device_error_metric_matches_the_reference_metric(out, ref):
    a = rel_err_xp(np, out, np.asarray(ref, dtype=np.float64))
    b = rel_norm_error(out, ref)
    assert a == b or (math.isfinite(a) and a == pytest.approx(b, rel=1e-12))


def test_failures_are_classified():
    assert classify(MemoryError()) == "oom"
    assert classify(RuntimeError("cudaErrorMemoryAllocation: out of memory")) == "oom"
    assert classify(type("OutOfMemoryError", (Exception,), {})("x")) == "oom"
    assert classify(RuntimeError("cudaErrorIllegalAddress: an illegal memory access")) == \
        "crashed"
    assert healthy(get_backend("numpy"))


def test_evaluator_protocol_on_numpy():
    be = get_backend("numpy")
    ev = Evaluator(be, be.device(0))
    assert ev.handle({"cmd": "hello"})["fingerprint"]["backend"] == "numpy"
    assert ev.handle({"cmd": "nope"})["status"] == "error"
    with pytest.raises(RuntimeError, match="prepare"):
        ev.handle({"cmd": "eval", "op": "conv2d", "key": KEY, "variant": "direct",
                   "params": {"order": "tap"}, "policy": POLICY.to_dict()})
    assert ev.handle({"cmd": "prepare", "op": "conv2d", "key": KEY, "seed": 3})["status"] == "ok"
    good = ev.handle({"cmd": "eval", "op": "conv2d", "key": KEY, "variant": "direct",
                      "params": {"order": "tap"}, "policy": POLICY.to_dict()})
    assert good["status"] == "ok" and good["n"] >= 3 and good["max_rel_err"] < 1e-5
    assert good["p20_us"] <= good["median_us"] <= good["p80_us"]
    rt = ev.handle({"cmd": "retime", "op": "conv2d", "key": KEY, "policy": POLICY.to_dict(),
                    "candidates": [{"variant": "direct", "params": {"order": "tap"}},
                                   {"variant": "fft", "params": {"size": "fast"}}]})
    assert rt["status"] == "ok" and [len(d["round_medians"]) for d in rt["leaders"]] == [2, 2]
    built = ev.handle({"cmd": "build", "op": "conv2d", "key": KEY, "variant": "fft",
                       "params": {"size": "exact"}})
    assert built["status"] == "ok"
    bad = ev.handle({"cmd": "build", "op": "conv2d", "key": KEY, "variant": "winograd9",
                     "params": {}})
    assert bad["status"] == "error" and "winograd9" in bad["detail"]


def test_adopting_kernels_are_verified_and_timed_on_what_they_return(monkeypatch):
    """The numpy ``whole`` attention adopts its outputs (allocates and returns them): the
    worker calls it as the pipeline does, checks the returned arrays against the float64
    reference and times that call; a wrongly shaped adoption is a 'wrong' candidate."""
    be = get_backend("numpy")
    ev = Evaluator(be, be.device(0))
    key = {"batch": 1, "heads_q": 2, "heads_kv": 1, "seq_q": 5, "seq_kv": 7, "head_dim": 8,
           "dtype": "float16", "causal": "bottom_right"}
    assert ev.handle({"cmd": "prepare", "op": "attention", "key": key, "seed": 1})["status"] \
        == "ok"
    good = ev.handle({"cmd": "eval", "op": "attention", "key": key, "variant": "whole",
                      "params": {}, "policy": POLICY.to_dict()})
    assert good["status"] == "ok" and good["max_rel_err"] < 4e-3 and good["n"] >= 3
    rt = ev.handle({"cmd": "retime", "op": "attention", "key": key, "policy": POLICY.to_dict(),
                    "candidates": [{"variant": "whole", "params": {}},
                                   {"variant": "blocked",
                                    "params": {"block_q": 64, "block_kv": 64}}]})
    assert rt["status"] == "ok"
    from dnnctl.ops import registry

    variant = registry.get_variant("attention", "numpy", "whole")
    real = variant.build

    def transposed(problem, params, device):  # returns out as a strided view
        kern = real(problem, params, device)

        def k(inputs, outputs, attrs):
            made = kern(inputs, outputs, attrs)
            return {**made, "out": made["out"].swapaxes(2, 3)}

        k.adopts = True
        return k

    monkeypatch.setattr(variant, "build", transposed)
    bad = ev.handle({"cmd": "eval", "op": "attention", "key": key, "variant": "whole",
                     "params": {}, "policy": POLICY.to_dict()})
    assert bad["status"] == "wrong" and "adopted output 'out'" in bad["detail"]
