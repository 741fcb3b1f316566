"""batch_norm ``train_persist`` (one cooperative launch, x read once) on the GPU: against
float64 on fresh inputs with poisoned outputs, repeated calls (the grid barrier's counter
keeps growing), a user's side stream, and a CUDA-graph capture replayed on new data.

    PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_bn_persist_gpu.py
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA build of torch and a GPU", allow_module_level=True)
pytest.importorskip("cupy")

import dnnctl.ops as dops  # noqa: E402
from dnnctl.ops.base import Choice  # noqa: E402
from dnnctl.ops.dispatch import problem_of  # noqa: E402
from dnnctl.ops.registry import get_op, get_variant  # noqa: E402

pytestmark = pytest.mark.gpu
DT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# (n, h, w, c, dtype, activation, residual, params)
CASES = [
    (64, 28, 28, 128, "float16", "none", False, {"block": 256, "vec": 8, "rows": 12}),
    (64, 7, 7, 2048, "float16", "relu", False, {"block": 512, "vec": 8, "rows": 16}),
    (64, 14, 14, 1024, "float16", "none", False, {"block": 256, "vec": 8, "rows": 24}),
    (8, 14, 14, 96, "bfloat16", "relu", True, {"block": 256, "vec": 8, "rows": 4}),
    (3, 5, 7, 24, "float32", "none", False, {"block": 256, "vec": 4, "rows": 2}),
    (2, 1, 1, 16384, "float16", "relu", False, {"block": 256, "vec": 8, "rows": 2}),
    (1, 3, 3, 40, "float32", "relu", True, {"block": 512, "vec": 2, "rows": 4}),
]


def _plan(n, h, w, c, dtype, act, res, params, pass_="forward"):
    """A plan whose one entry runs the persistent variant of the pass on this key."""
    from dnnctl.plan import LoadedPlan, Plan, PlanEntry, Section, kernels_digest
    from dnnctl.torch.kernels import device_of

    key = dict(n=n, c=c, h=h, w=w, dtype=dtype, layout="NHWC", training=True,
               activation=act, residual=res, **{"pass": pass_})
    problem = problem_of(get_op("batch_norm"), key)
    _, dev = device_of(torch.empty(1, device="cuda"))
    name = "train_persist" if pass_ == "forward" else "bwd_persist"
    v = get_variant("batch_norm", "cupy", name)
    assert v.supports(problem, dev), v.supports(problem, dev).reason
    assert v.valid_params(problem, params, dev), params
    section = Section(dev.fingerprint(), kernels_digest(), "2026-12-07T00:00:00Z", {},
                      [PlanEntry(problem, Choice.of(name, params))])
    return LoadedPlan(Plan([section]))


def _inputs(n, h, w, c, dtype, res, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(n, h, w, c, device="cuda", generator=g) * 2 + 3).to(DT[dtype])
    z = torch.randn(n, h, w, c, device="cuda", generator=g).to(DT[dtype]) if res else None
    wt = torch.randn(c, device="cuda", generator=g) * 0.5 + 1
    bs = torch.randn(c, device="cuda", generator=g)
    rm = torch.randn(c, device="cuda", generator=g)
    rv = torch.rand(c, device="cuda", generator=g) + 0.5
    return x, z, wt, bs, rm, rv


def _want(x, z, wt, bs, rm, rv, act):
    """float64: y, then the running statistics after the update (momentum 0.1)."""
    xd = x.double().permute(0, 3, 1, 2)
    rmd, rvd = rm.double().clone(), rv.double().clone()
    y = torch.nn.functional.batch_norm(xd, rmd, rvd, wt.double(), bs.double(), training=True,
                                       momentum=0.1, eps=1e-5)
    if z is not None:
        y = y + z.double().permute(0, 3, 1, 2)
    if act == "relu":
        y = y.relu()
    return y.permute(0, 2, 3, 1), rmd, rvd


def _call(x, z, wt, bs, rm, rv, act, plan):
    return dops.batch_norm(x, rm, rv, wt, bs, training=True, layout="NHWC", plan=plan,
                           activation=act, residual=z)


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:5])) + f"-{c[5]}"
                         + ("-res" if c[6] else ""))
def test_matches_float64_repeatedly_and_on_a_side_stream(case):
    n, h, w, c, dtype, act, res, params = case
    plan = _plan(*case)
    tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}[dtype]
    for seed in range(3):  # the barrier's counter grows call after call
        x, z, wt, bs, rm, rv = _inputs(n, h, w, c, dtype, res, seed)
        y_want, rm_want, rv_want = _want(x, z, wt, bs, rm, rv, act)
        stream = torch.cuda.Stream() if seed == 2 else torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            y = _call(x, z, wt, bs, rm, rv, act, plan)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        assert torch.isfinite(y).all()
        assert _rel(y, y_want) <= tol, (seed, _rel(y, y_want))
        assert _rel(rm, rm_want) <= 1e-5 and _rel(rv, rv_want) <= 1e-4


def test_persist_is_deterministic():
    case = CASES[0]
    plan = _plan(*case)
    x, z, wt, bs, rm, rv = _inputs(*case[:4], case[4], case[6], 7)
    y1 = _call(x, z, wt, bs, rm.clone(), rv.clone(), case[5], plan)
    y2 = _call(x, z, wt, bs, rm.clone(), rv.clone(), case[5], plan)
    assert torch.equal(y1, y2)


@pytest.mark.parametrize("case", [CASES[0], CASES[3]], ids=["fp16", "bf16-relu-res"])
def test_captured_call_replays_on_new_inputs(case):
    n, h, w, c, dtype, act, res, params = case
    plan = _plan(*case)
    static = list(_inputs(n, h, w, c, dtype, res, 0))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            _call(*static, act, plan)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = _call(*static, act, plan)
    for seed in (1, 2):
        new = _inputs(n, h, w, c, dtype, res, seed)
        for t, v in zip(static, new):
            if t is not None:
                t.copy_(v)
        rm0, rv0 = static[4].clone(), static[5].clone()
        graph.replay()
        torch.cuda.synchronize()
        x, z, wt, bs = static[:4]
        y_want, rm_want, rv_want = _want(x, z, wt, bs, rm0, rv0, act)
        tol = {"float16": 2e-3, "bfloat16": 1e-2}[dtype]
        assert _rel(y, y_want) <= tol
        assert _rel(static[4], rm_want) <= 1e-5


def test_a_layer_too_large_for_the_chip_is_not_taken():
    from dnnctl.torch.kernels import device_of

    _, dev = device_of(torch.empty(1, device="cuda"))
    v = get_variant("batch_norm", "cupy", "train_persist")
    big = problem_of(get_op("batch_norm"), dict(n=64, c=64, h=112, w=112, dtype="float16",
                                                layout="NHWC", training=True))
    assert not v.supports(big, dev)


# ----------------------------------------------------------------------------- backward

BWD_CASES = [
    (64, 28, 28, 128, "float16", "none", False, {"block": 256, "vec": 8, "rows": 12}),
    (64, 7, 7, 2048, "float16", "none", False, {"block": 256, "vec": 8, "rows": 24}),
    (64, 14, 14, 256, "float16", "relu", True, {"block": 256, "vec": 8, "rows": 8}),
    (8, 14, 14, 96, "bfloat16", "relu", False, {"block": 256, "vec": 8, "rows": 4}),
    (3, 5, 7, 24, "float32", "none", False, {"block": 256, "vec": 4, "rows": 2}),
    (2, 1, 1, 16384, "float16", "relu", True, {"block": 256, "vec": 8, "rows": 2}),
]


@pytest.mark.parametrize("case", BWD_CASES, ids=lambda c: "x".join(map(str, c[:5]))
                         + f"-{c[5]}" + ("-res" if c[6] else ""))
def test_backward_matches_float64_autograd(case):
    n, h, w, c, dtype, act, res, params = case
    plan = _plan(*case, pass_="backward")
    tol = {"float32": 1e-5, "float16": 4e-3, "bfloat16": 2e-2}[dtype]
    for seed in range(2):
        x, z, wt, bs, _, _ = _inputs(n, h, w, c, dtype, res, seed)
        dy = torch.randn_like(x)
        xd = x.double().requires_grad_()
        wd, bd = wt.double().requires_grad_(), bs.double().requires_grad_()
        zd = None if z is None else z.double().requires_grad_()
        xn = xd.permute(0, 3, 1, 2)
        y = torch.nn.functional.batch_norm(xn, None, None, wd, bd, training=True, eps=1e-5)
        if zd is not None:
            y = y + zd.permute(0, 3, 1, 2)
        if act == "relu":
            y = y.relu()
        y.permute(0, 2, 3, 1).backward(dy.double())
        mean = x.double().mean((0, 1, 2))
        invstd = (x.double().var((0, 1, 2), unbiased=False) + 1e-5).rsqrt()
        got = dops.batch_norm_backward(dy, x, mean.float(), invstd.float(), weight=wt,
                                       layout="NHWC", plan=plan, bias=bs, activation=act,
                                       residual=z)
        torch.cuda.synchronize()
        assert _rel(got[0], xd.grad) <= tol, ("dx", seed, _rel(got[0], xd.grad))
        assert _rel(got[1], wd.grad) <= 1e-3 and _rel(got[2], bd.grad) <= 1e-3
        if res:
            assert _rel(got[3], zd.grad) <= tol


def test_backward_is_deterministic_and_captures():
    case = BWD_CASES[2]
    n, h, w, c, dtype, act, res, params = case
    plan = _plan(*case, pass_="backward")
    x, z, wt, bs, _, _ = _inputs(n, h, w, c, dtype, res, 3)
    dy = torch.randn_like(x)
    mean = x.float().mean((0, 1, 2))
    invstd = (x.float().var((0, 1, 2), unbiased=False) + 1e-5).rsqrt()
    args = [dy, x, mean, invstd, wt, bs, z]

    def call(dy, x, mean, invstd, wt, bs, z):
        return dops.batch_norm_backward(dy, x, mean, invstd, weight=wt, layout="NHWC",
                                        plan=plan, bias=bs, activation=act, residual=z)

    first = call(*args)
    again = call(*args)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call(*args)
    new_dy = torch.randn_like(dy)
    dy.copy_(new_dy)
    graph.replay()
    torch.cuda.synchronize()
    want = call(*args)
    assert all(torch.equal(a, b) for a, b in zip(captured, want))
