"""The run-time pipeline: a call signature validated once runs again without validation.

Every public op function goes through ``dispatch.call`` and its one signature -> Site cache.
These tests check, on the numpy backend and with torch CPU tensors, that a repeated call
gives the same result as the first (and as the ``out=`` form), that calls with another
dtype, a strided view or a wrong parameter vector are still rejected after a good call of
the same shape, that plan statistics are counted on every call, and the launch helpers of
the CUDA kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from _plan_helpers import numpy_section

import dnnctl
import dnnctl.backends.registry
from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops import dispatch, registry
from dnnctl.ops.base import Choice
from dnnctl.plan import Plan, PlanEntry, load_plan, write_plan

RNG = np.random.default_rng(7)
ops = dnnctl.ops


def rand(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape, dtype=np.float32).astype(dtype)


X3 = rand(2, 3, 40, dtype=np.float16)  # softmax / norms over the last axis: (6, 40) problems
X4 = rand(2, 6, 9, 10)  # NCHW
W40, B40 = rand(40, dtype=np.float16), rand(40, dtype=np.float16)
C6 = [rand(6) for _ in range(2)] + [np.abs(rand(6)) + 0.5, rand(6)]  # mean, w, var, b
A, B = rand(3, 5, 24, dtype=np.float16), rand(24, 7, dtype=np.float16)
BT = rand(7, 24, dtype=np.float16)
BIAS7 = rand(7, dtype=np.float16)
B10 = rand(10)
W4, BIAS4 = rand(4, 6, 3, 3), rand(4)

# (call, call with out=)
CASES: dict[str, tuple[Callable[[], Any], Callable[[Any], Any] | None]] = {
    "softmax": (lambda: ops.softmax(X3),
                lambda o: ops.softmax(X3, out=o)),
    "log_softmax": (lambda: ops.log_softmax(X3, axis=2),
                    lambda o: ops.log_softmax(X3, axis=2, out=o)),
    "layer_norm": (lambda: ops.layer_norm(X3, W40, B40, eps=1e-3),
                   lambda o: ops.layer_norm(X3, W40, B40, eps=1e-3, out=o)),
    "rms_norm": (lambda: ops.rms_norm(X3, W40),
                 lambda o: ops.rms_norm(X3, W40, out=o)),
    "relu_bias": (lambda: ops.relu(X4, C6[0]),
                  lambda o: ops.relu(X4, C6[0], out=o)),
    "leaky_nhwc": (lambda: ops.leaky_relu(X4, 0.2, B10, layout="NHWC"), None),
    "gelu_tanh": (lambda: ops.gelu(X3, "tanh"), lambda o: ops.gelu(X3, "tanh", out=o)),
    "batch_norm": (lambda: ops.batch_norm(X4, C6[0], C6[2], C6[1], C6[3]),
                   lambda o: ops.batch_norm(X4, C6[0], C6[2], C6[1], C6[3], out=o)),
    "batch_norm_weight_only": (lambda: ops.batch_norm(X4.reshape(2, 6, 90), C6[0], C6[2], C6[1]),
                               None),
    "group_norm": (lambda: ops.group_norm(X4, 3, eps=1e-4),
                   lambda o: ops.group_norm(X4, 3, eps=1e-4, out=o)),
    "max_pool": (lambda: ops.max_pool2d(X4, 3, 2, 1),
                 lambda o: ops.max_pool2d(X4, 3, 2, 1, out=o)),
    "avg_pool_nhwc": (lambda: ops.avg_pool2d(X4, 2, layout="NHWC"),
                      lambda o: ops.avg_pool2d(X4, 2, layout="NHWC", out=o)),
    "global_avg_pool": (lambda: ops.global_avg_pool2d(X4),
                        lambda o: ops.global_avg_pool2d(X4, out=o)),
    "matmul_fold": (lambda: ops.matmul(A, B, bias=BIAS7, activation="relu"), None),
    "matmul_trans_b": (lambda: ops.matmul(A[0], BT.T, activation="silu"), None),
    "matmul_batched_t": (lambda: ops.matmul(A, A.swapaxes(1, 2)), None),
    "conv2d": (lambda: ops.conv2d(X4, W4, BIAS4, padding=1, activation="relu"),
               None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_repeated_call_takes_the_fast_path_with_the_same_result(name: str) -> None:
    call, with_out = CASES[name]
    cache = dispatch._SITES
    cache.clear()
    first = call()
    assert len(cache) == 1, "the validated signature was not remembered"
    hit = next(iter(cache.values()))
    second = call()
    assert len(cache) == 1
    assert next(iter(cache.values())) is hit
    assert type(second) is np.ndarray and second.shape == first.shape
    assert second.dtype == first.dtype and second is not first
    np.testing.assert_array_equal(second, first)
    if with_out is not None:  # out= is another signature: one more site, the same numbers
        for _ in range(2):
            out = np.full_like(first, np.nan)
            assert with_out(out) is out
            np.testing.assert_array_equal(out, first)
        assert len(cache) == 2


def test_fast_path_results_match_the_reference() -> None:
    op = registry.get_op("softmax")
    p = op.problem(rows=6, cols=40, dtype="float16")
    ref = op.reference(p, {"x": X3.reshape(6, 40).astype(np.float64)}, {})["y"]
    for _ in range(3):
        y = ops.softmax(X3)
        assert y.shape == X3.shape
        assert np.abs(y.reshape(6, 40).astype(np.float64) - ref).max() < 2e-3
    mm = ops.matmul(A, B, bias=BIAS7, activation="relu")
    want = np.maximum(A.astype(np.float64) @ B.astype(np.float64) + BIAS7, 0)
    assert mm.shape == (3, 5, 7)
    assert np.abs(mm - want).max() < 2e-2 * np.abs(want).max()


def test_bad_input_is_rejected_after_a_good_call_of_the_same_shape() -> None:
    x = rand(4, 16)
    ops.softmax(x)
    ops.softmax(x)
    with pytest.raises(ShapeError, match="dtype float64"):
        ops.softmax(x.astype(np.float64))
    wide = rand(4, 32)
    with pytest.raises(ShapeError, match="C-contiguous"):
        ops.softmax(wide[:, ::2])  # same shape and dtype, strided
    with pytest.raises(ShapeError, match="out of range"):
        ops.softmax(x, axis=2)
    with pytest.raises(UsageError, match="axis=1.0 must be an int"):
        ops.softmax(x, axis=1.0)  # an int axis was seen; a float one is not the same call
    w = rand(16, dtype=np.float16)
    ops.layer_norm(x.astype(np.float16), w)
    with pytest.raises(ShapeError, match="weight has dtype float32"):
        ops.layer_norm(x.astype(np.float16), w.astype(np.float32))
    with pytest.raises(ShapeError, match=r"weight has shape \(8,\)"):
        ops.layer_norm(x.astype(np.float16), w[:8])
    b = rand(16)
    ops.relu(x, b, layout="NHWC")
    with pytest.raises(ShapeError, match="bias must be C-contiguous"):
        ops.relu(x, rand(32)[::2], layout="NHWC")
    mean, var = rand(3), np.abs(rand(3)) + 0.1
    x4 = rand(2, 3, 4, 4)
    ops.batch_norm(x4, mean, var)
    with pytest.raises(ShapeError, match="running_mean has dtype float16"):
        ops.batch_norm(x4, mean.astype(np.float16), var)
    a, bb = rand(8, 16, dtype=np.float16), rand(16, 4, dtype=np.float16)
    ops.matmul(a, bb)
    with pytest.raises(ShapeError, match="b has dtype float32"):
        ops.matmul(a, bb.astype(np.float32))


def test_strided_matmul_operand_is_copied_on_every_call() -> None:
    dispatch._SITES.clear()
    big = rand(8, 32, dtype=np.float16)
    a, b = big[:, ::2], rand(16, 4, dtype=np.float16)  # (8, 16), not contiguous, not a .T
    for step in range(2):
        big[:] = rand(8, 32, dtype=np.float16)  # new values: a remembered copy would be stale
        y = ops.matmul(a, b)
        want = a.astype(np.float64) @ b.astype(np.float64)
        assert np.abs(y - want).max() < 1e-2 * np.abs(want).max(), step
    site, = dispatch._SITES.values()
    assert site.prepare is not None  # the copy is made per call


def test_inplace_activation_fast_path_writes_into_x() -> None:
    x = rand(5, 7)
    want = np.maximum(x, 0)
    for _ in range(2):
        y = x.copy()
        assert ops.relu(y, inplace=True) is y
        np.testing.assert_array_equal(y, want)


def test_training_batch_norm_updates_running_stats_on_every_call() -> None:
    x4 = rand(4, 3, 5, 5)
    rm, rv = np.zeros(3, np.float32), np.ones(3, np.float32)
    means = x4.mean(axis=(0, 2, 3))
    for step in range(1, 4):
        y, save_mean, _ = ops.batch_norm(x4, rm, rv, training=True, momentum=0.5,
                                         return_stats=True)
        np.testing.assert_allclose(save_mean, means, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rm, means * (1 - 0.5 ** step), rtol=1e-5, atol=1e-6)
        assert y.shape == x4.shape
    y2 = ops.batch_norm(x4, training=True)  # no running statistics: made once, unused
    y3 = ops.batch_norm(x4, training=True)
    np.testing.assert_array_equal(y2, y3)


def _softmax_whole_plan(tmp_path) -> tuple[Any, Any, Any]:
    """(X3's softmax problem, the numpy device, a loaded plan whose entry picks
    numpy_whole), with no site made yet."""
    op = registry.get_op("softmax")
    problem = op.problem(rows=6, cols=40, dtype="float16")
    dev = dnnctl.backends.registry.get_backend("numpy").device(0)
    assert op.default_choice(problem, "numpy", dev).variant != "numpy_whole"
    path = tmp_path / "plan.yaml"
    write_plan(Plan([numpy_section([PlanEntry(problem, Choice.of("numpy_whole"))])]), path)
    dispatch._SITES.clear()
    return problem, dev, load_plan(str(path), device="cpu")


def test_plan_hits_are_counted_on_the_fast_path(tmp_path) -> None:
    problem, _, plan = _softmax_whole_plan(tmp_path)
    for _ in range(3):
        ops.softmax(X3, plan=plan)
    with dnnctl.use_plan(plan):
        ops.softmax(X3)
    ops.softmax(X3)  # no plan: the default heuristic, not counted
    assert plan.stats().hits == {problem: 4}
    assert (problem, "numpy", 0, Choice.of("numpy_whole")) in dispatch._KERNELS


def test_a_rebound_plan_section_is_seen_by_the_sites_that_kept_its_entry(tmp_path) -> None:
    """A site keeps a plan's exact entry after its first call (no lookup on later ones);
    binding another section to the plan makes it look again."""
    problem, dev, plan = _softmax_whole_plan(tmp_path)
    for _ in range(2):
        ops.softmax(X3, plan=plan)
    site = next(s for s in dispatch._SITES.values() if s.op.name == "softmax")
    assert site.planned[2].choice == Choice.of("numpy_whole")
    rows = Choice.of("numpy_rows", {"chunk_rows": 16})
    plan.bind_section(numpy_section([PlanEntry(problem, rows)]), dev)
    ops.softmax(X3, plan=plan)
    assert site.planned[2].choice == rows
    assert (problem, "numpy", 0, rows) in dispatch._KERNELS
    assert plan.stats().hits == {problem: 1}  # (the new section's entry, counted anew)


def test_site_cache_is_bounded() -> None:
    cache = dispatch._Sites()
    cache.limit = 3
    for i in range(5):
        cache.put(i, object())
    assert len(cache) <= 3 and 4 in cache


# ----------------------------------------------------------------------------- launches


class _Recorder:
    """A launchable that records its calls (what the emulator / CuPy would be given)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        self.calls.append((grid, block, tuple(args), shared_mem))


def test_launch_passes_numpy_scalars_to_non_cupy_functions() -> None:
    fn = _Recorder()
    run = mc.Launch(fn, (3, 2), (128,), 1024)
    assert run.handle is None  # not a CuPy kernel: called as given
    dims = run.consts(np.int32(5), np.int64(7), None)
    assert dims == (np.int32(5), np.int64(7), None)
    eps = run.f32(1e-5)
    assert isinstance(eps, np.float32) and run.f32(1e-5) is eps  # converted once
    assert run.f32(0.0) == 0 and np.signbit(run.f32(-0.0))  # zeros are not memoized
    run(("x", *dims, eps))
    assert fn.calls == [((3, 2), (128,), ("x", 5, 7, None, np.float32(1e-5)), 1024)]
    assert mc.launch(type("M", (), {"get_function": lambda self, n: fn})(), "k", 4, 64).grid \
        == (4,)


def test_traced_launches_record_and_restore() -> None:
    fn = _Recorder()
    run = mc.Launch(fn, (1,), (32,))
    with mc.traced_launches() as log:
        run((1, np.int32(2)))
    run((3,))
    assert log == [(fn, (1,), (32,), (1, np.int32(2)), 0)]
    assert len(fn.calls) == 2


def test_flat_io_kernels_are_marked() -> None:
    """Kernel classes that read only pointers say so (the fast path skips reshapes)."""
    from dnnctl.ops._memory_common import PairKernel  # gap, pool2d, nhwc_tile
    from dnnctl.ops._memory_rows import RowKernel
    from dnnctl.ops.activation.cuda_variants import _ActKernel
    from dnnctl.ops.batch_norm.cuda_exact import _ExactKernel, _StreamKernel
    from dnnctl.ops.batch_norm.cuda_variants import _BnKernel
    from dnnctl.ops.group_norm.cuda_variants import _GnKernel
    from dnnctl.ops.matmul.gemm_launch import GemmKernel

    for cls in (RowKernel, _ActKernel, GemmKernel, _BnKernel, _GnKernel, PairKernel,
                _ExactKernel, _StreamKernel):
        assert cls.flat_io is True, cls.__name__


class Foreign:
    """A DLPack tensor of another library (CPU), like a torch tensor on the CPU."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self.a.__dlpack_device__()


def from_dlpack(y: Any) -> Foreign:
    """How the producer's module takes results back (as torch.from_dlpack would)."""
    return Foreign(np.from_dlpack(y))


def test_dlpack_tensors_run_through_the_native_fast_path() -> None:
    dispatch._SITES.clear()
    want = ops.softmax(X3)
    for _ in range(2):
        y = ops.softmax(Foreign(X3))
        assert isinstance(y, Foreign)
        np.testing.assert_array_equal(y.a, want)
    assert len(dispatch._SITES) == 1  # the converted NumPy array's signature
    mm = ops.matmul(Foreign(A), Foreign(B), bias=Foreign(BIAS7))
    assert isinstance(mm, Foreign)
    np.testing.assert_array_equal(mm.a, ops.matmul(A, B, bias=BIAS7))


# ----------------------------------------------------------------------------- torch (CPU)


def test_torch_cpu_tensors_run_on_the_numpy_backend_by_memory() -> None:
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(X3.copy())
    dispatch._SITES.clear()
    for _ in range(2):
        y = ops.softmax(x)
        assert isinstance(y, torch.Tensor) and y.dtype == torch.float16
        np.testing.assert_array_equal(y.numpy(), ops.softmax(X3))
    bf = torch.randn(4, 40).to(torch.bfloat16)
    got = ops.layer_norm(bf, torch.ones(40, dtype=torch.bfloat16))
    assert got.dtype == torch.bfloat16
    want = torch.nn.functional.layer_norm(bf.double(), (40,))
    assert (got.double() - want).abs().max() < 3e-2
    xr = torch.from_numpy(X4.copy())
    assert ops.relu(xr, inplace=True) is xr and float(xr.min()) >= 0
    y4 = ops.conv2d(torch.from_numpy(X4), torch.from_numpy(W4), torch.from_numpy(BIAS4),
                    padding=1, activation="relu")
    np.testing.assert_allclose(y4.numpy(), ops.conv2d(X4, W4, BIAS4, padding=1,
                                                      activation="relu"), rtol=1e-6)
    g = torch.randn(3, 5, requires_grad=True)  # autograd inputs are read, never recorded
    assert isinstance(ops.softmax(g), torch.Tensor)


def test_torch_autograd_checks_are_worked_out_per_signature() -> None:
    """requires_grad is part of a torch tensor's signature: a site whose tensors need no
    gradient checks nothing per call (a written one still has its version bumped); the same
    shapes with a tensor that requires grad are another site, which warns and refuses."""
    torch = pytest.importorskip("torch")
    dispatch._SITES.clear()
    x = torch.randn(3, 5)
    ops.softmax(x)
    site, = dispatch._SITES.values()
    assert site.autograd is None
    before = x._version
    ops.relu(x, inplace=True)
    assert x._version == before + 1
    dispatch._WARNED.discard("relu")
    g = torch.randn(3, 5, requires_grad=True)
    with pytest.warns(UserWarning, match="do not record autograd"):
        ops.relu(g)
    with pytest.raises(UsageError, match="requires grad"):
        ops.relu(torch.tanh(g), inplace=True)


def test_mixed_kinds_and_masked_arrays_are_refused() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(ShapeError, match="mix array kinds"):
        ops.matmul(A, torch.from_numpy(B))
    masked = np.ma.masked_array(rand(3, 4), mask=np.eye(3, 4, dtype=bool))
    with pytest.raises(ShapeError, match="masked arrays"):
        ops.softmax(masked)
    with pytest.raises(ShapeError, match="expected an array"):
        ops.softmax([[1.0, 2.0]])


def test_default_choice_is_made_once_per_problem_until_the_registry_changes(monkeypatch):
    """The validating path (``dispatch.run``) asks for the default on every call: the
    heuristic runs once per (problem, backend, device, determinism), and again after a
    plugin registers a variant (which may change the pick)."""
    op = registry.get_op("softmax")
    problem = dispatch.problem_of(op, {"rows": 7, "cols": 33, "dtype": "float32",
                                       "log": False, "pass": "backward"})
    be = dnnctl.backends.registry.get_backend("numpy")
    dev = be.device(0)
    asked = []
    real = type(op).default_choice

    def spy(self, *args):
        asked.append(args[0])
        return real(self, *args)

    monkeypatch.setattr(type(op), "default_choice", spy)
    first = dispatch.default_choice(op, problem, "numpy", dev, False)
    again = dispatch.default_choice(op, problem, "numpy", dev, False)
    assert again is first and len(asked) == 1
    dispatch.default_choice(op, problem, "numpy", dev, True)  # determinism: its own entry
    assert len(asked) == 2
    monkeypatch.setattr(registry, "_GENERATION", [registry.generation() + 1])  # a plugin
    assert dispatch.default_choice(op, problem, "numpy", dev, False) == first
    assert len(asked) == 3
    y = rand(7, 33)
    ops.softmax_backward(ops.softmax(y), rand(7, 33))  # a new Site asks the same memo


def _attention_plan(tmp_path: Any, problem: Any, variant: str, **params: Any) -> Any:
    path = tmp_path / f"{variant}-{problem['pass']}.yaml"
    write_plan(Plan([numpy_section([PlanEntry(problem, Choice.of(variant, params))])]), path)
    return load_plan(str(path), device="cpu")


def test_adopting_kernel_outputs_are_taken_not_copied(tmp_path, monkeypatch) -> None:
    """A kernel marked ``adopts`` (here the numpy ``whole`` attention, which rounds its
    float32 result once) is called without outputs and its own arrays are returned: numpy
    callers get them as they are, torch CPU callers as tensors over the same memory; the
    numbers equal the copying path's (``blocked``) within the op's tolerance and the
    validating path's bit for bit."""
    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 4, 9, 16)).astype(np.float16)
    k = rng.standard_normal((2, 2, 12, 16)).astype(np.float16)
    v = rng.standard_normal((2, 2, 12, 16)).astype(np.float16)
    op = registry.get_op("attention")
    problem = op.problem(batch=2, heads_q=4, heads_kv=2, seq_q=9, seq_kv=12, head_dim=16,
                         dtype="float16", causal="top_left")
    whole = _attention_plan(tmp_path, problem, "whole")
    assert dispatch.adopting(dispatch.kernel_for(problem, dnnctl.backends.registry.get_backend(
        "numpy"), dnnctl.backends.registry.get_backend("numpy").device(0), Choice.of("whole")))
    dispatch._SITES.clear()
    seen: list[Any] = []
    real = dispatch.Site._adopt

    def spy(self: Any, made: Any, outs: Any, kouts: Any, flat: bool) -> None:
        seen.append({n: a for n, a in made.items()})
        real(self, made, outs, kouts, flat)

    monkeypatch.setattr(dispatch.Site, "_adopt", spy)
    out, lse = dnnctl.ops.attention(q, k, v, causal=True, return_lse=True, plan=whole)
    assert len(seen) == 1 and seen[0]["out"] is out and seen[0]["lse"] is lse
    assert out.dtype == np.float16 and out.flags.c_contiguous and lse.dtype == np.float32
    ref = op.reference(problem, {"q": q, "k": k, "v": v}, {})
    assert np.linalg.norm(out - ref["out"]) / np.linalg.norm(ref["out"]) < 4e-3
    again = dnnctl.ops.attention(q, k, v, causal=True, return_lse=True, plan=whole)
    np.testing.assert_array_equal(again[0], out)
    assert again[0] is not out  # a fresh array per call, never a cached one
    blocked = dnnctl.ops.attention(q, k, v, causal=True, plan=_attention_plan(
        tmp_path, problem, "blocked", block_q=64, block_kv=64))
    np.testing.assert_allclose(blocked.astype(np.float32), out.astype(np.float32), atol=2e-3)
    # the validating path adopts too
    bound = dispatch.bind(q, k, v)
    res = dispatch.run("attention", dict(problem.key), bound, ("q", "k", "v"), {"scale": None},
                       plan=whole)
    np.testing.assert_array_equal(res["out"], out)
    torch = pytest.importorskip("torch")
    t, tl = dnnctl.ops.attention(*(torch.from_numpy(x) for x in (q, k, v)), causal=True,
                                 return_lse=True, plan=whole)
    assert isinstance(t, torch.Tensor) and isinstance(tl, torch.Tensor)
    np.testing.assert_array_equal(t.numpy(), out)
    # backward: dq, dk, dv adopted as well
    dq, dk, dv = dnnctl.ops.attention_backward(np.ones_like(out), q, k, v, out, lse,
                                               causal=True, plan=_attention_plan(
                                                   tmp_path, op.problem({**dict(problem.key),
                                                                         "pass": "backward"}),
                                                   "whole"))
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert dq.flags.c_contiguous and dk.dtype == np.float16


def test_adoption_errors_name_the_output() -> None:
    from dnnctl.ops.base import TensorSpec

    specs = {"y": TensorSpec((2, 3), "float16"), "s": TensorSpec((2,), "float32")}
    good = {"y": np.zeros((2, 3), np.float16), "s": np.zeros(2, np.float32)}
    assert dispatch.adoption_error(specs, good) is None
    assert "did not return output 's'" in dispatch.adoption_error(specs, {"y": good["y"]})
    assert "(3, 2) float16, expected (2, 3)" in dispatch.adoption_error(
        specs, {**good, "y": np.zeros((3, 2), np.float16)})
    assert "float64" in dispatch.adoption_error(specs, {**good, "s": np.zeros(2)})
    assert "not C-contiguous" in dispatch.adoption_error(
        specs, {**good, "y": np.zeros((3, 2), np.float16).T})
    assert "not a dict" in dispatch.adoption_error(specs, None)
