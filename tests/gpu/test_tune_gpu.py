"""The tuner on the GPU: tune small real problems on cuda:0 (worker subprocesses, build
helpers, CUDA-event timing), load the plan strictly, dispatch CuPy arrays through it and
check the results; an illegal memory access (a sticky CUDA error) is survived."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dnnctl
from dnnctl.ops import dispatch, registry
from dnnctl.ops.base import rel_norm_error
from dnnctl.plan import read_plan
from dnnctl.tune.tuner import TuneOptions, tune
from dnnctl.workloads import Workload

cp = pytest.importorskip("cupy")
HERE = Path(__file__).resolve().parent

MATMUL = {"m": 512, "n": 384, "k": 256, "dtype": "float16", "bias": True, "activation": "relu"}
SOFTMAX = {"rows": 1024, "cols": 1000, "dtype": "float16"}
CONV = {"n": 2, "c": 64, "h": 28, "w": 28, "k": 64, "r": 3, "s": 3, "pad": 1,
        "dtype": "float16", "layout": "NHWC", "bias": True, "activation": "relu"}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    out = tmp_path_factory.mktemp("tune") / "plan.yaml"
    wl = Workload("gpu-test")
    for op, key in (("matmul", MATMUL), ("softmax", SOFTMAX), ("conv2d", CONV)):
        wl.add(op, key)
    report = tune(wl, TuneOptions(device="cuda:0", output=out, strategy="random",
                                  max_evals=6, candidate_timeout_s=300))
    return report, out


def test_every_problem_is_planned_on_the_gpu(tuned):
    report, out = tuned
    assert [o.status for o in report.outcomes] == ["planned"] * 3, report.to_dict()
    sec = read_plan(out).sections[0]
    assert sec.device["backend"] == "cupy" and sec.device["compute_capability"]
    for e in sec.entries:
        assert e.stats.n >= 5 and 0 < e.stats.p20_us <= e.stats.median_us <= e.stats.p80_us
        assert e.tried >= 2 and e.max_rel_err is not None and e.max_rel_err < 1e-2
        assert e.default is not None and e.default.median_us > 0
    assert sec.tuning["l2_flush"] is True


def test_planned_dispatch_runs_the_winner_and_is_correct(tuned):
    _, out = tuned
    plan = dnnctl.load_plan(str(out), strict=True, device="cuda:0")
    rng = np.random.default_rng(0)
    mm = registry.get_op("matmul")
    p_mm = mm.problem(MATMUL)
    host = mm.make_inputs(p_mm, rng)
    dev = {k: cp.asarray(v) for k, v in host.items()}
    y = dnnctl.ops.matmul(dev["a"], dev["b"], bias=dev["bias"], activation="relu", plan=plan)
    ref = mm.reference(p_mm, {k: v.astype(np.float64) for k, v in host.items()}, {})["y"]
    assert isinstance(y, cp.ndarray)
    assert rel_norm_error(cp.asnumpy(y), ref) <= mm.tolerance(p_mm, "y")
    sm = registry.get_op("softmax")
    p_sm = sm.problem(SOFTMAX)
    x = sm.make_inputs(p_sm, rng)["x"]
    with dnnctl.use_plan(plan):
        s = dnnctl.ops.softmax(cp.asarray(x))
    ref = sm.reference(p_sm, {"x": x.astype(np.float64)}, {})["y"]
    assert rel_norm_error(cp.asnumpy(s), ref) <= sm.tolerance(p_sm, "y")
    st = plan.stats()
    assert st.hits == {p_mm: 1, p_sm: 1} and not st.misses
    sec = read_plan(out).sections[0]
    choice = sec.find(p_mm).choice
    assert any(k[0] == p_mm and k[3] == choice for k in dispatch._KERNELS)


def test_illegal_address_candidate_is_survived(tmp_path):
    # the repository root too, absolute: the child runs in tmp_path, where PYTHONPATH=. is not it
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE), str(HERE.parents[1]), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("DNNCTL_PLUGINS", None)
    proc = subprocess.run(
        [sys.executable, "-c", "from dnnctl.cli.app import main; main()", "tune", "--op",
         "toy_gpu_scale", "--key", "n=1000003", "--plugin", "_gpu_tune_plugin", "--device",
         "cuda:0", "--strategy", "exhaustive", "--candidate-timeout", "120", "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    p = json.loads(proc.stdout)["problems"][0]
    assert p["status"] == "planned" and p["tried"] == 4
    assert p["failed"]["crashed"] == 1 and p["failed"]["wrong"] == 1
    assert p["winner"]["variant"] == "good"


def test_host_ahead_times_the_gpu_work_alone():
    """A call whose host work (300 us of it) outlasts its kernel: the default sample is what
    an eager caller waits for, host time included; host_ahead's is the kernel's time."""
    import time

    from dnnctl.backends.registry import get_backend

    be = get_backend("cupy")
    x = cp.zeros(1 << 16, dtype=cp.float32)

    def call():
        time.sleep(3e-4)
        x.fill(1.0)

    eager = np.median(be.time(call, warmup_ms=5, budget_ms=20, flush_l2=False))
    alone = np.median(be.time(call, warmup_ms=5, budget_ms=20, flush_l2=False,
                              host_ahead=True))
    kernel = np.median(be.time(lambda: x.fill(1.0), warmup_ms=5, budget_ms=20,
                               flush_l2=False, host_ahead=True))
    assert eager > 250, eager
    assert alone < 50 and alone < 3 * kernel + 10, (alone, kernel)


def test_l2_flush_evicts_and_leaves_no_dirty_lines():
    """The flush reads (never writes) twice the L2: a 24 MB read that hits the L2 when
    repeated goes to DRAM again after a flush, and the flush buffer stays zeros."""
    from dnnctl.backends.registry import get_backend

    be = get_backend("cupy")
    x = cp.ones(6 << 20, dtype=cp.float32)  # 24 MB: fits the 50-60 MB L2 of Hopper
    out = cp.empty((), dtype=cp.float32)

    def read():
        cp.sum(x, out=out)

    hot = np.median(be.time(read, warmup_ms=5, budget_ms=20, flush_l2=False, host_ahead=True))
    cold = np.median(be.time(read, warmup_ms=5, budget_ms=20, flush_l2=True, host_ahead=True))
    assert cold > 1.2 * hot, (cold, hot)
    assert int(cp.count_nonzero(be._flush_buffer())) == 0
    assert float(out) == x.size


@pytest.mark.parametrize(("op", "key", "variants"), [
    ("conv2d", {**CONV, "bias": False, "activation": "none"}, ("torch_cudnn", "implicit_gemm")),
    ("conv2d", {**CONV, "bias": False, "activation": "none", "pass": "dgrad"},
     ("dgrad_torch_cudnn",)),
    ("conv2d", {**CONV, "bias": True, "activation": "none", "pass": "wgrad"},
     ("wgrad_torch_cudnn",)),
    ("attention", {"batch": 2, "heads_q": 4, "heads_kv": 4, "seq_q": 256, "seq_kv": 256,
                   "head_dim": 64, "head_dim_v": 64, "dtype": "float16", "layout": "BSHD"},
     ("torch_flash", "torch_cudnn")),
])
def test_a_library_called_through_torch_is_verified_and_timed_natively(op, key, variants):
    """The tuner's worker runs a via_torch vendor on torch views made once (native_io): it
    verifies against float64 and times, alone and re-timed beside our own kernels."""
    pytest.importorskip("torch")
    from dnnctl.backends.registry import require_backend
    from dnnctl.tune.timer import TimingPolicy
    from dnnctl.tune.worker import Evaluator

    be = require_backend("cupy")
    worker = Evaluator(be, be.device(0))
    problem = registry.get_op(op).problem(key)
    assert worker.handle({"cmd": "prepare", "op": op, "key": dict(problem.key),
                          "seed": 3})["status"] == "ok"
    policy = TimingPolicy(budget_ms=5.0, retime_rounds=2, retime_budget_ms=3.0).to_dict()
    ran = []
    for name in variants:
        variant = registry.get_variant(op, "cupy", name)
        if not variant.supports(problem, be.device(0)):
            continue
        default = getattr(variant, "default_params", None)  # the vendors have no params
        params = (default(problem, be.device(0)) if default else None) or {}
        res = worker.handle({"cmd": "eval", "op": op, "key": dict(problem.key),
                             "variant": name, "params": params, "policy": policy})
        assert res["status"] == "ok", res
        assert res["median_us"] > 0 and res["max_rel_err"] is not None
        ran.append({"variant": name, "params": params})
    assert ran and registry.get_variant(op, "cupy", ran[0]["variant"]).via_torch
    res = worker.handle({"cmd": "retime", "op": op, "key": dict(problem.key),
                         "candidates": ran, "policy": policy})
    assert res["status"] == "ok", res
    assert all(r["median_us"] > 0 for r in res["leaders"])
