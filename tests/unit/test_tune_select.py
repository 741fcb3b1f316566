"""Winner selection (ties within measured noise go to the preferred candidate) and search
strategies replayed on recorded timings, with no worker and no timer."""

from __future__ import annotations

import math

import pytest

from dnnctl.backends.registry import get_backend
from dnnctl.ops import registry
from dnnctl.plan.schema import Timing
from dnnctl.tune.candidates import Candidate, Space, enumerate_space
from dnnctl.tune.results import Result
from dnnctl.tune.select import Retimed, combine_rounds, decide, leaders
from dnnctl.tune.strategies import STRATEGIES, get_strategy
from dnnctl.tune.strategies.local import neighbours
from dnnctl.tune.timer import TimingPolicy, summarize

A, B, C, D = (Candidate.of("v", {"i": i}) for i in range(4))
ORDER = {A: 0, B: 1, C: 2, D: 3}


def ok(c: Candidate, med: float, spread: float = 0.0) -> Result:
    return Result(c, "ok", Timing(med, med - spread / 2, med + spread / 2, 100))


def rt(c: Candidate, rounds: tuple[float, ...]) -> Retimed:
    med = sorted(rounds)[len(rounds) // 2]
    return Retimed(c, Timing(med, min(rounds), max(rounds), 100 * len(rounds)), rounds)


def test_clear_win_goes_to_the_fastest():
    res = {A: ok(A, 100), B: ok(B, 80), C: Result(C, "wrong")}
    d = decide(res, ORDER, default=A)
    assert d.winner == B and d.runner_up == (A, 100) and d.default == (A, 100)


def test_win_within_round_spread_is_a_tie_broken_by_preference():
    res = {A: ok(A, 100), B: ok(B, 98), C: ok(C, 120)}
    retimed = {A: rt(A, (99.0, 100.0, 102.0)), B: rt(B, (97.0, 98.0, 101.5)),
               C: rt(C, (119.0, 120.0, 121.0))}
    d = decide(res, ORDER, retimed=retimed, default=A, tie_floor=0.0, tie_cap=0.5)
    assert d.winner == A and d.tied == [A, B] and d.retimed
    assert d.runner_up == (B, 98.0)
    # the same numbers with tight rounds: B's 2% win is real
    tight = {A: rt(A, (100.0, 100.1, 100.2)), B: rt(B, (98.0, 98.1, 98.2)), C: retimed[C]}
    assert decide(res, ORDER, retimed=tight, default=A, tie_floor=0.0).winner == B


def test_floor_and_cap_bound_the_tie_window():
    res = {A: ok(A, 100.5), B: ok(B, 100.0)}
    assert decide(res, ORDER, tie_floor=0.01).winner == A  # a 0.5% win is never worth it
    assert decide(res, ORDER, tie_floor=0.001).winner == B
    noisy = {A: rt(A, (50.0, 200.0, 400.0)), B: rt(B, (100.0, 100.0, 100.0))}
    res = {A: ok(A, 200.0), B: ok(B, 100.0)}
    # A's huge spread does not let a 2x slower candidate win by preference
    assert decide(res, ORDER, retimed=noisy, tie_floor=0.01, tie_cap=0.03).winner == B


def test_failed_and_ineligible_candidates_never_win():
    res = {A: ok(A, 50), B: ok(B, 100), C: Result(C, "crashed"), D: Result(D, "timeout")}
    d = decide(res, ORDER, default=A, eligible={B, C, D})
    assert d.winner == B and d.default == (A, 50)
    assert decide({C: Result(C, "oom")}, ORDER) is None


def test_leaders_include_the_default():
    res = {A: ok(A, 300), B: ok(B, 100), C: ok(C, 110), D: ok(D, 120)}
    assert leaders(res, 2, default=A) == [B, C, A]
    assert leaders(res, 2, default=None) == [B, C]
    assert leaders(res, 5, default=A, eligible={B}) == [B, A]


def test_statistics():
    t = summarize([5.0, 1.0, 3.0, 2.0, 4.0, math.nan])
    assert (t.median_us, t.n) == (3.0, 5) and t.p20_us == pytest.approx(1.8)
    r = combine_rounds(A, [[1.0, 2.0, 3.0], [10.0, 11.0, 12.0]])
    assert r.round_medians == (2.0, 11.0) and r.spread == 9.0 and r.timing.n == 6
    with pytest.raises(Exception, match="tie_floor"):
        TimingPolicy().replace(tie_floor=0.5, tie_cap=0.1)


# ----------------------------------------------------------------------------- strategies


def _grid_space() -> tuple[Space, dict[Candidate, float]]:
    """matmul's numpy 'blocked' variant (block 32..512) plus 'numpy', with recorded times
    that have one minimum at block=128."""
    dev = get_backend("numpy").device(0)
    problem = registry.get_op("matmul").problem(m=4096, n=512, k=512, dtype="float32")
    space = enumerate_space(problem, "numpy", dev)
    times = {}
    for c in space.candidates:
        if c.variant == "blocked":
            times[c] = 100.0 + abs(math.log2(c.param_dict["block"] / 128)) * 40.0
        else:
            times[c] = 300.0
    return space, times


def _replay(name: str, space: Space, times: dict[Candidate, float], **kw) -> dict:
    strategy = get_strategy(name, **kw)
    results: dict[Candidate, Result] = {}
    for _ in range(1000):
        cand = strategy.next(space, results)
        if cand is None:
            break
        assert cand in space.order() and cand not in results
        results[cand] = ok(cand, times[cand])
    return results


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_finds_the_best_of_a_unimodal_space(name):
    space, times = _grid_space()
    best = min(times, key=times.get)
    results = _replay(name, space, times, max_evals=len(space))
    assert best in results
    assert space.default in results  # the baseline is always measured
    d = decide(results, space.order(), default=space.default)
    assert d.winner == best


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_respects_max_evals(name):
    space, times = _grid_space()
    assert len(_replay(name, space, times, max_evals=2)) == 2


def test_random_is_reproducible_and_local_is_frugal():
    space, times = _grid_space()
    a = list(_replay("random", space, times, seed=3, max_evals=4))
    assert a == list(_replay("random", space, times, seed=3, max_evals=4))
    assert a[0] == space.default
    local = _replay("local", space, times)
    assert len(local) < len(space)  # hill climbing does not need every candidate
    assert min(local, key=lambda c: times[c]) == min(times, key=times.get)


def test_local_neighbours_move_one_parameter_step():
    space, _ = _grid_space()
    b128 = Candidate.of("blocked", {"block": 128})
    near = neighbours(b128, space)
    assert Candidate.of("blocked", {"block": 64}) in near
    assert Candidate.of("blocked", {"block": 256}) in near
    assert Candidate.of("blocked", {"block": 512}) not in near
    assert any(c.variant == "numpy" for c in near)
    # another variant is entered at its own default parameters (blocked: block=128)
    assert neighbours(space.default, space) == [b128]


def test_unknown_strategy_is_a_usage_error():
    with pytest.raises(Exception, match="unknown strategy 'bayes'"):
        get_strategy("bayes")


def test_enumeration_puts_the_default_first_and_filters():
    dev = get_backend("numpy").device(0)
    problem = registry.get_op("conv2d").problem(n=2, c=4, h=20, w=20, k=4, r=9, s=9, pad=4,
                                                dtype="float32", layout="NCHW")
    space = enumerate_space(problem, "numpy", dev)
    default = registry.get_op("conv2d").default_choice(problem, "numpy", dev)
    assert space.candidates[0].choice == default
    assert len(set(space.candidates)) == len(space.candidates)
    small = enumerate_space(problem, "numpy", dev, max_workspace=0)
    assert all(space.workspace[c] == 0 for c in small.candidates)
    assert "im2col_gemm" in small.skipped and "workspace" in small.skipped["im2col_gemm"]


def test_upcoming_predicts_the_next_proposals():
    space, times = _grid_space()
    ex = get_strategy("exhaustive")
    assert ex.upcoming(space, {}, 3) == space.candidates[:3]
    assert get_strategy("exhaustive", max_evals=2).upcoming(space, {}, 5) == \
        space.candidates[:2]
    local = get_strategy("local")
    first = space.default
    results = {first: ok(first, times[first])}
    predicted = local.upcoming(space, results, 10)
    assert local.next(space, results) == predicted[0] and first not in predicted
    auto = get_strategy("auto")
    assert auto.limit(space) == len(space)  # a small space: exhaustive


def test_vendor_libraries_are_measured_right_after_the_default():
    """A vendor variant (a library: cuDNN, cuBLAS, SDPA) comes right after the default in
    the preference order and is the local search's first neighbour, so a run cut short by
    its budget has compared the default against the library. A test-only vendor variant on
    the numpy backend stands in for one (the real ones need torch with CUDA)."""
    from dnnctl.ops.registry import register_variant

    numpy_matmul = registry.get_variant("matmul", "numpy", "numpy")

    class Library(type(numpy_matmul)):
        name = "test_library"
        vendor = True
        doc = "test-only: numpy's matmul flagged as a vendor library"

    register_variant(Library)
    try:
        space, _ = _grid_space()
        names = [c.variant for c in space.candidates]
        assert names[0] == space.default.variant and names[1] == "test_library"
        assert neighbours(space.default, space)[0].variant == "test_library"
        local = get_strategy("local")
        first = {space.default: ok(space.default, 100.0)}
        assert local.next(space, first).variant == "test_library"
    finally:
        registry._VARIANTS[("matmul", "numpy")].pop("test_library")
        registry._GENERATION[0] += 1  # memos keyed by the registry forget the stand-in
