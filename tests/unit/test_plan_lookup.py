"""Run-time plan use: exact hits, nearest fallback, misses, stale plans, strict mode,
record_misses, stats, and dispatch through dnnctl.ops with the real numpy conv2d."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from _plan_helpers import conv, entry, numpy_section, sample_plan

import dnnctl
from dnnctl.backends.registry import get_backend
from dnnctl.errors import StalePlanError
from dnnctl.ops import dispatch, registry
from dnnctl.ops.base import Choice
from dnnctl.plan import LoadedPlan, Plan, StalePlanWarning, load_plan, write_plan
from dnnctl.plan.loaded import key_distance
from dnnctl.workloads import read_workload

NP = get_backend("numpy")
DEV = NP.device(0)


def test_exact_hit_is_counted():
    plan = LoadedPlan(sample_plan())
    assert plan.lookup(conv(), "numpy", DEV) == Choice.of("im2col_gemm", {"chunk": 0})
    assert plan.lookup(conv(groups=16), "numpy", DEV) == Choice.of("direct", {"order": "image"})
    plan.lookup(conv(), "numpy", DEV)
    st = plan.stats()
    assert st.hits == {conv(): 2, conv(groups=16): 1} and not st.fallbacks and not st.misses
    assert st.to_dict()["hits"] == 3


def test_nearest_entry_of_same_op_and_categorical_fields():
    plan = LoadedPlan(sample_plan())
    # batch 4 is nearest to the n=2 entry (same dtype, layout, groups=1, filter 3x3)
    assert plan.lookup(conv(n=4), "numpy", DEV) == Choice.of("im2col_gemm", {"chunk": 0})
    assert plan.lookup(conv(n=4), "numpy", DEV) is not None  # memoized, still counted
    assert plan.lookup(conv(dtype="float16"), "numpy", DEV) is None  # other dtype: miss
    st = plan.stats()
    assert st.fallbacks == {conv(n=4): 2} and st.misses == {conv(dtype="float16"): 1}
    assert plan.explain(conv(n=4), "numpy", DEV)[0] == "fallback"
    assert plan.explain(conv(), "numpy", DEV)[0] == "hit"
    assert plan.explain(conv(dtype="float16"), "numpy", DEV) == ("miss", None, None)


def test_nearest_skips_entries_whose_params_do_not_fit_the_shape():
    # im2col chunk=8 needs chunk < n: the closer n=16 entry cannot serve n=8
    plan = LoadedPlan(Plan([numpy_section([
        entry(conv(n=16), "im2col_gemm", {"chunk": 8}),
        entry(conv(n=1), "direct", {"order": "tap"})])]))
    assert key_distance(conv(n=8), conv(n=16)) < key_distance(conv(n=8), conv(n=1))
    assert plan.lookup(conv(n=8), "numpy", DEV) == Choice.of("direct", {"order": "tap"})
    assert plan.lookup(conv(n=32), "numpy", DEV) == Choice.of("im2col_gemm", {"chunk": 8})


def test_key_distance_rules():
    assert key_distance(conv(), conv()) == 0.0
    assert key_distance(conv(), conv(layout="NHWC")) is None
    assert key_distance(conv(), conv(bias=True)) is None
    mm = registry.get_op("matmul").problem(m=64, n=64, k=64, dtype="float32")
    assert key_distance(conv(), mm) is None
    assert key_distance(conv(h=24), conv(h=12)) == pytest.approx(np.log2(25 / 13))


def _stale(path, **device_changes):
    write_plan(Plan([numpy_section([entry(conv(), "direct", {"order": "tap"})],
                                   **device_changes)]), path)


@pytest.mark.parametrize("changes,reason", [
    ({"name": "Some Other CPU"}, "name: plan 'Some Other CPU'"),
    ({"driver": "535.00"}, "driver: plan '535.00'"),
    ({"dnnctl": "0.0.1"}, "dnnctl: plan '0.0.1'"),
])
def test_plan_from_another_device_is_stale(tmp_path, changes, reason):
    path = tmp_path / "plan.yaml"
    _stale(path, **changes)
    with pytest.warns(StalePlanWarning, match=reason):
        plan = load_plan(path, device="cpu")
    assert plan.lookup(conv(), "numpy", DEV) is None  # never a wrong kernel: the fallback
    assert plan.stats().misses == {conv(): 1}
    with pytest.raises(StalePlanError, match="stale"):
        load_plan(path, device="cpu", strict=True)


def test_plan_made_with_other_kernels_is_stale(tmp_path):
    path = tmp_path / "plan.yaml"
    plan = Plan([numpy_section([entry(conv(), "direct", {"order": "tap"})])])
    plan.sections[0].kernels_digest = "sha256:" + "0" * 64
    write_plan(plan, path)
    with pytest.warns(StalePlanWarning, match="other kernels"):
        loaded = load_plan(path, device="cpu")
    assert loaded.lookup(conv(), "numpy", DEV) is None
    with pytest.raises(StalePlanError, match="kernels"):
        load_plan(path, device="cpu", strict=True)


def test_plan_without_a_section_for_this_backend_warns(tmp_path):
    cuda_variants = registry.variants("conv2d", "cupy")
    if not cuda_variants:
        pytest.skip("no CUDA conv2d variant registered")
    v = cuda_variants[0]
    gpu = entry(conv(), v.name, {k: vals[0] for k, vals in v.params.items()})
    gpu.runner_up = gpu.default = None
    path = tmp_path / "plan.yaml"
    write_plan(Plan([numpy_section([gpu], backend="cupy", name="NVIDIA H200",
                                   compute_capability="9.0")]), path)
    with pytest.warns(StalePlanWarning, match="no section for the numpy backend"):
        loaded = load_plan(path, device="cpu")
    assert loaded.lookup(conv(), "numpy", DEV) is None


def test_fresh_plan_loads_without_warning(tmp_path):
    path = tmp_path / "plan.yaml"
    write_plan(sample_plan(), path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = dnnctl.load_plan(str(path), strict=True, device="cpu")
    assert plan.section_for("numpy", DEV) is not None


def test_record_misses_writes_a_workload_and_adds_counts(tmp_path):
    path = tmp_path / "plan.yaml"
    misses = tmp_path / "misses.yaml"
    write_plan(sample_plan(), path)
    plan = load_plan(path, device="cpu", record_misses=misses)
    plan.lookup(conv(), "numpy", DEV)  # hit: not recorded
    for _ in range(3):
        plan.lookup(conv(n=4), "numpy", DEV)  # fallback
    plan.lookup(conv(dtype="float16"), "numpy", DEV)  # miss
    wl = read_workload(misses)
    assert {it.problem: it.count for it in wl.items} == {conv(n=4): 3, conv(dtype="float16"): 1}
    plan.save_misses()  # idempotent within one run
    assert {it.problem: it.count for it in read_workload(misses).items}[conv(n=4)] == 3
    again = load_plan(path, device="cpu", record_misses=misses)  # a second run of the app
    again.lookup(conv(n=4), "numpy", DEV)
    assert {it.problem: it.count for it in read_workload(misses).items}[conv(n=4)] == 4


def test_dispatch_runs_the_planned_variant(tmp_path):
    """The plan's choice (direct) differs from the heuristic's (im2col_gemm) and is run."""
    problem = conv()
    op = registry.get_op("conv2d")
    assert op.default_choice(problem, "numpy", DEV).variant == "im2col_gemm"
    path = tmp_path / "plan.yaml"
    write_plan(Plan([numpy_section([entry(problem, "direct", {"order": "image"})])]), path)
    plan = dnnctl.load_plan(str(path), device="cpu")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 16, 12, 12), dtype=np.float32)
    w = rng.standard_normal((16, 16, 3, 3), dtype=np.float32)
    y = dnnctl.ops.conv2d(x, w, padding=1, plan=plan)
    ref = op.reference(problem, {"x": x.astype(np.float64), "w": w.astype(np.float64)}, {})["y"]
    assert np.abs(y - ref).max() < 1e-4
    assert (problem, "numpy", 0, Choice.of("direct", {"order": "image"})) in dispatch._KERNELS
    with dnnctl.use_plan(plan):
        dnnctl.ops.conv2d(x, w, padding=1)
        dnnctl.ops.conv2d(x[:1], w, padding=1)  # n=1: nearest entry
    st = plan.stats()
    assert st.hits == {problem: 2} and st.fallbacks == {conv(n=1): 1}
