"""The replay path (dnnctl.backends.replay) on the CPU, through the stub GPU of
benchmarks/stub_gpu.py: torch CPU tensors take the torch CUDA route up to the driver's
launch. A site records its second call; from the third on, the C++ Program's parameter
blocks must be exactly what the Python path packs for the same call (the outputs' new
addresses aside), and a call the recording does not fit goes back to Python."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dnnctl.backends import cuda, replay  # noqa: E402
from dnnctl.ops import dispatch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
if not (ROOT / "benchmarks" / "stub_gpu.py").is_file():
    pytest.skip("benchmarks/ not available (installed wheel)", allow_module_level=True)
sys.path.insert(0, str(ROOT / "benchmarks"))

import stub_gpu  # noqa: E402


@pytest.fixture(scope="module")
def ext():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DNNCTL_REPLAY", "1")
        mod = replay.module(wait=None)
        if mod is None:
            pytest.skip(f"the replay extension is not built here: {replay.failure()}")
        yield mod


@pytest.fixture()
def stub(ext):
    with stub_gpu.installed():
        yield


def _site(op):
    sites = [s for s in dispatch._SITES.values() if s.op.name == op and s.programs]
    assert sites, f"no site of {op} recorded a program ({dispatch.REFUSED.get(op)})"
    return sites[-1]


def _python_blocks(site, call):
    """The parameter blocks the Python path packs for ``call`` (programs off), and its
    result."""
    saved = site.programs
    site.programs = None
    rec = cuda.Recorder()
    try:
        with cuda.recording(rec):
            res = call()
    finally:
        site.programs = saved
    return [cuda.param_layout(args)[0] for launch, args in rec.launches
            if not isinstance(launch, replay.AtenCall)], res


def _tensors(res):
    return [r for r in (res if isinstance(res, tuple) else (res,)) if r is not None]


def _swap(block: bytes, old: int, new: int) -> bytes:
    return block.replace(struct.pack("<Q", old), struct.pack("<Q", new))


def _check_same(site, arrays, call):
    want, res_py = _python_blocks(site, call)
    prog = next(p for p in site.programs.values() if p)
    res_c, blocks = prog.dry(arrays)
    assert len(blocks) == len(want) == prog.launches
    outs_py, outs_c = _tensors(res_py), _tensors(res_c)
    assert len(outs_py) == len(outs_c)
    for a, b in zip(outs_py, outs_c, strict=True):
        assert a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
    for got, exp in zip(blocks, want, strict=True):
        for a, b in zip(outs_py, outs_c, strict=True):
            if a.data_ptr() != b.data_ptr():
                exp = _swap(exp, a.data_ptr(), b.data_ptr())
        assert got == exp
    return res_c


def _run3(call):
    for _ in range(3):
        res = call()
    return res


def test_softmax_layer_norm_and_activation_replay_the_python_blocks(stub):
    import dnnctl.ops as ops

    x = torch.randn(64, 768, dtype=torch.float16)
    w = torch.randn(768, dtype=torch.float16)
    b = torch.randn(768, dtype=torch.float16)
    # (the op functions' call arrays: out= last)
    cases = [("softmax", (x, None), lambda: ops.softmax(x)),
             ("layer_norm", (x, w, b, None), lambda: ops.layer_norm(x, w, b)),
             ("rms_norm", (x, w, None, None), lambda: ops.rms_norm(x, w))]
    for op, arrays, call in cases:
        _run3(call)
        site = _site(op)
        res = _check_same(site, arrays, call)
        assert res.shape == x.shape


def test_training_batch_norm_replays_with_running_statistics_written_in_place(stub):
    import dnnctl.ops as ops

    n, c, h, w = 4, 32, 8, 8
    x = torch.randn(n, h, w, c, dtype=torch.float16)
    rm, rv = torch.zeros(c), torch.ones(c)
    wt, bs = torch.randn(c), torch.randn(c)

    def call():
        return ops.batch_norm(x, rm, rv, wt, bs, training=True, layout="NHWC",
                              return_stats=True, activation="relu")

    _run3(call)
    site = _site("batch_norm")
    # x, running_mean, running_var, weight, bias, out, residual, new_running (2)
    arrays = (x, rm, rv, wt, bs, None, None, None, None)
    res = _check_same(site, arrays, call)
    assert isinstance(res, tuple) and len(res) == 3
    assert res[0].shape == x.shape and res[1].shape == (c,)
    before = rm._version
    call()  # the replayed call bumps the running statistics' versions, as torch does
    assert rm._version > before


class _CudnnPlan:
    """Every conv2d problem on torch_cudnn with ``fuse`` (its conv through torch)."""

    def __init__(self, fuse):
        self.fuse = fuse

    def lookup(self, problem, backend, device):
        from dnnctl.ops.base import Choice

        return Choice("torch_cudnn", (("fuse", self.fuse),)) if problem.op == "conv2d" else None


def test_a_convolution_through_torch_replays_its_library_call_and_epilogue(stub):
    from dnnctl.ops.conv2d.function import conv2d_channels_last

    cl = torch.channels_last
    x = torch.randn(2, 8, 6, 6, dtype=torch.bfloat16).contiguous(memory_format=cl)
    w = torch.randn(16, 8, 3, 3, dtype=torch.bfloat16).contiguous(memory_format=cl)
    b = torch.randn(16, dtype=torch.bfloat16)
    plan = _CudnnPlan(0)

    def call():
        return conv2d_channels_last(x, w, b, (1, 1), (1, 1), (1, 1), 1, "relu", plan=plan)

    _run3(call)
    site = _site("conv2d")
    prog = next(p for p in site.programs.values() if p)
    assert (prog.torch_calls, prog.launches) == (1, 1)  # cuDNN's call, then the epilogue
    res = _check_same(site, (x, w, b, None), call)
    # the stub's epilogue launches nothing: both results are the convolution, computed by
    # torch (on the CPU here) from the C++ Program and from Python alike
    assert res.shape == (2, 6, 6, 16) and res.is_contiguous()
    assert torch.equal(res, torch.nn.functional.conv2d(x, w, None, 1, 1).permute(0, 2, 3, 1))
    x2 = torch.randn(2, 8, 6, 6, dtype=torch.bfloat16).contiguous(memory_format=cl)
    got = site.programs[id(site._pick(plan, build=False)[0])]((x2, w, b, None))
    assert torch.equal(got, torch.nn.functional.conv2d(x2, w, None, 1, 1).permute(0, 2, 3, 1))


def test_a_convolution_on_a_padded_copy_is_not_replayed(stub):
    from dnnctl.ops.conv2d.function import conv2d_channels_last

    cl = torch.channels_last
    x = torch.randn(1, 8, 6, 6, dtype=torch.bfloat16).contiguous(memory_format=cl)
    w = torch.randn(8, 8, 3, 3, dtype=torch.bfloat16).contiguous(memory_format=cl)
    plan = _CudnnPlan(0)
    dispatch.REFUSED.pop("conv2d", None)
    # asymmetric padding: torch's call reads F.pad's copy, which no replay would make
    _run3(lambda: conv2d_channels_last(x, w, None, (1, 1), (0, 1, 0, 1), (1, 1), 1, None,
                                       plan=plan))
    assert dispatch.REFUSED["conv2d"] == "a padded copy of x"


def test_a_less_aligned_call_goes_back_to_python(stub):
    import dnnctl.ops as ops

    big = torch.randn(64 * 768 + 1, dtype=torch.float16)
    x = big[:64 * 768].view(64, 768)
    _run3(lambda: ops.softmax(x))
    site = _site("softmax")
    prog = next(p for p in site.programs.values() if p)
    shifted = big[1:].view(64, 768)  # 2 bytes off: the recorded vector width cannot run
    assert prog.dry((x, None))[0] is not None
    assert prog.dry((shifted, None))[0] is None
    assert prog.dry((x,))[0] is None  # another number of arrays
    y = ops.softmax(shifted)  # the Python path takes it
    assert y.shape == (64, 768)


def test_a_recording_with_a_copy_is_refused():
    rec = cuda.Recorder()
    with cuda.recording(rec):
        cuda.copy(np.zeros(4, np.float32), np.ones(4, np.float32))  # the emulator's copy
    rec.refuse("a copy")
    rec.refuse("a later thing")
    assert rec.foreign == "a copy"
    with pytest.raises(replay.Unreplayable, match="a copy"):
        replay.program(None, (), (), (), rec, [0], False)


def test_param_layout_matches_the_launch_layout():
    args = (np.int32(3), 0x1000, np.float32(1.5), None, np.int64(-2))
    block, offsets, kinds = cuda.param_layout(args)
    assert offsets == [0, 8, 16, 24, 32]
    assert kinds == "iPfPq"
    assert struct.unpack_from("<i", block, 0)[0] == 3
    assert struct.unpack_from("<Q", block, 8)[0] == 0x1000
    assert struct.unpack_from("<f", block, 16)[0] == 1.5
    assert struct.unpack_from("<Q", block, 24)[0] == 0
    assert struct.unpack_from("<q", block, 32)[0] == -2


def test_switch(monkeypatch):
    monkeypatch.setenv("DNNCTL_REPLAY", "0")
    assert not replay.enabled()
    monkeypatch.setenv("DNNCTL_REPLAY", "1")
    assert replay.enabled()
    monkeypatch.delenv("DNNCTL_REPLAY")
    assert replay.enabled() == (replay.DEFAULT == "1")


def _steps(model, *inputs, n=5):
    names = []
    for _ in range(n):
        y = model(*inputs)
        names.append(y.grad_fn.name())
        y.float().sum().backward()
    return names


def test_a_patched_training_batch_norm_moves_to_the_cpp_node(stub):
    import dnnctl.torch as dt
    from dnnctl.torch import native

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.b1, self.b2 = torch.nn.BatchNorm2d(16), torch.nn.BatchNorm2d(16)

        def forward(self, x, r):
            return torch.relu(self.b2(torch.relu(self.b1(x))) + r)

    m = Block()
    cl = torch.channels_last
    x = torch.randn(2, 16, 8, 8, dtype=torch.float16).contiguous(memory_format=cl)
    r = torch.randn(2, 16, 8, 8, dtype=torch.float16).contiguous(memory_format=cl)
    x.requires_grad_()
    r.requires_grad_()
    dt.patch(m, backward="dnnctl")
    before = m.b1.running_mean._version
    names = _steps(m, x, r)
    # both passes record on their second call; the third forward finds both Programs
    assert names[:2] == ["_BatchNormTrainInPlaceBackward"] * 2
    assert names[3:] == ["DnnctlBackward_batch_norm_train_native"] * 2
    assert sum(1 for v in native._TABLE.values() if v.__class__ is not int) == 2
    assert m.b1.running_mean._version >= before + 5  # bumped by each call, both paths
    assert int(m.b1.num_batches_tracked) == 5
    # the C++ node's gradients: x's shape and layout, fp32 parameters, the residual's
    assert x.grad.shape == x.shape and x.grad.stride() == x.stride()
    assert r.grad.shape == r.shape and r.grad.stride() == r.stride()
    assert m.b1.weight.grad.shape == (16,) and m.b1.weight.grad.dtype == torch.float32
    y = m(x, r)
    assert y.grad_fn.name() == "DnnctlBackward_batch_norm_train_native"
    # a backward that must be differentiable leaves the Programs for torch's formulas
    (gx,) = torch.autograd.grad((y.float() ** 2).sum(), x, create_graph=True)
    assert gx.requires_grad and gx.shape == x.shape
    with native.suspended():  # the Python path again, on demand
        assert m(x, r).grad_fn.name() == "_BatchNormTrainInPlaceBackward"


def test_an_aliased_residual_stays_on_the_python_path(stub):
    import dnnctl.torch as dt

    class Same(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm2d(8)

        def forward(self, x):
            return torch.relu(self.bn(x) + x)  # x is also the residual: a recording of
            # one cannot tell its two parameters apart, so it is refused

    m = Same()
    x = torch.randn(2, 8, 4, 4, dtype=torch.float16).contiguous(
        memory_format=torch.channels_last).requires_grad_()
    dt.patch(m, backward="dnnctl")
    assert set(_steps(m, x)) == {"_BatchNormTrainInPlaceBackward"}
    assert "inside tensors" in dispatch.REFUSED.get("batch_norm", "")


def test_the_cpp_node_backward_with_create_graph_takes_torchs_formulas():
    """No stub here: the numpy backend runs the kernels' CPU variants, and the C++ node is
    made from CPU Programs only under the stub, so this checks the Python fallback the node
    calls with create_graph=True, which must itself give a differentiable gradient."""
    from dnnctl.torch import native

    x = torch.randn(2, 4, 3, 3, dtype=torch.float64, requires_grad=True)
    w = torch.rand(4, dtype=torch.float64, requires_grad=True)
    b = torch.rand(4, dtype=torch.float64, requires_grad=True)
    mean = x.detach().mean((0, 2, 3))
    invstd = (x.detach().var((0, 2, 3), unbiased=False) + 1e-5).rsqrt()
    grad = torch.randn_like(x)
    with torch.enable_grad():
        out = native._differentiable_backward(grad, x, w, b, mean, invstd, None, None,
                                              (True, True, True, False), 1e-5, 0, "relu")
    assert out[0].shape == x.shape and out[3] is None
    assert out[0].requires_grad  # differentiable: torch's formulas


def _spy_site(monkeypatch, call):
    """(site, arrays) of the last dispatch-site call ``call()`` makes."""
    seen = []
    orig = dispatch.Site.__call__

    def spy(self, arrays, plan):
        seen.append((self, arrays))
        return orig(self, arrays, plan)

    monkeypatch.setattr(dispatch.Site, "__call__", spy)
    call()
    monkeypatch.setattr(dispatch.Site, "__call__", orig)
    return seen[-1]


def _r(*shape, dtype=torch.float16, fmt=None, positive=False):
    t = torch.randn(*shape).to(dtype)
    t = t.abs() + 0.5 if positive else t
    return t.contiguous(memory_format=fmt) if fmt is not None else t


_CL = torch.channels_last
FAMILY = {
    # every memory-family kernel the default heuristics pick for these calls: the Program's
    # parameter blocks must be the Python path's
    "log_softmax": lambda o, a: o.log_softmax(a[0]),
    "softmax_backward": lambda o, a: o.softmax_backward(a[0], a[1]),
    "log_softmax_backward": lambda o, a: o.log_softmax_backward(a[0], a[1]),
    "layer_norm_backward": lambda o, a: o.layer_norm_backward(a[0], a[1], a[2]),
    "rms_norm_backward": lambda o, a: o.rms_norm_backward(a[0], a[1], a[2]),
    "gelu": lambda o, a: o.gelu(a[0]),
    "silu + bias": lambda o, a: o.silu(a[3], bias=a[4]),
    "relu_backward": lambda o, a: o.activation_backward("relu", a[0], a[1]),
    "batch_norm inference NCHW fp32": lambda o, a: o.batch_norm(
        a[5], a[6], a[7], a[8], a[9]),
    "batch_norm training NCHW fp32": lambda o, a: o.batch_norm(
        a[5], a[6], a[7], a[8], a[9], training=True, return_stats=True),
    "batch_norm_backward NHWC fp16 + relu": lambda o, a: o.batch_norm_backward(
        a[10], a[11], a[12], a[13], a[8], layout="NHWC", bias=a[9], activation="relu"),
    "group_norm NHWC": lambda o, a: o.group_norm(a[11], 4, a[8], a[9], layout="NHWC"),
    "group_norm_backward NHWC": lambda o, a: o.group_norm_backward(
        a[10], a[11], 4, a[8], layout="NHWC"),
}
# sites that recompute the forward's statistics in a ``prepare`` of their own (work beyond
# launches into the call's arrays): never recorded, always the Python path
PYTHON_ONLY = {"layer_norm_backward", "rms_norm_backward", "group_norm_backward NHWC"}


@pytest.mark.parametrize("case", list(FAMILY))
def test_the_memory_family_replays_the_python_blocks(stub, monkeypatch, case):
    import dnnctl.ops as ops

    torch.manual_seed(0)
    a = [_r(64, 257), _r(64, 257), _r(257), _r(4, 16, 9, 9), _r(16),
         _r(4, 16, 9, 9, dtype=torch.float32), torch.zeros(16), torch.ones(16),
         _r(16, dtype=torch.float32), _r(16, dtype=torch.float32),
         _r(4, 9, 9, 16), _r(4, 9, 9, 16), _r(16, dtype=torch.float32),
         _r(16, dtype=torch.float32, positive=True)]

    def call():
        return FAMILY[case](ops, a)

    for _ in range(3):
        call()
    site, arrays = _spy_site(monkeypatch, call)
    if case in PYTHON_ONLY:  # (a prepare of the site's own: no kernel of it records)
        assert site.prepare is not None and not any(site.programs.values())
        return
    if not any(site.programs.values()):
        pytest.fail(f"{case}: no Program ({dispatch.REFUSED.get(site.op.name)})")
    _check_same(site, arrays, call)


def test_a_batch_norm_whose_backward_is_torchs_takes_the_node_with_a_python_backward(stub):
    import dnnctl.torch as dt
    from dnnctl.torch import native
    from dnnctl.torch.grad_plan import paths_summary

    bn = torch.nn.BatchNorm2d(16)  # no ReLU: the default sends its backward to torch
    x = torch.randn(2, 16, 8, 8, dtype=torch.float16).contiguous(
        memory_format=torch.channels_last).requires_grad_()
    dt.patch(bn)
    names = _steps(bn, x, n=native.TRIES + 2)
    # no backward Program was ever recorded: after the last look the forward is C++ and
    # the node's backward calls torch's kernels from Python
    assert names[-1] == "DnnctlBackward_batch_norm_train_native"
    nodes = [v for v in native._TABLE.values() if v.__class__ is not int]
    assert len(nodes) == 1 and not nodes[0].own_backward
    before = paths_summary()["batch_norm/backward"]["torch"]
    bn(x).float().sum().backward()
    assert paths_summary()["batch_norm/backward"]["torch"] == before + 1
    assert x.grad.shape == x.shape and bn.weight.grad.shape == (16,)


def test_the_batch_norm_call_orders_are_one_list(ext, monkeypatch):
    """The op functions hand their arrays to the call site in CALL_ARRAYS' order, and the
    C++ node's slots are named the same: a change to one is caught here."""
    import dnnctl.ops as ops
    from dnnctl.ops.batch_norm import backward_function as bf
    from dnnctl.ops.batch_norm import function as ff

    seen = {}

    def spy(name):
        def call(spec, arrays, scalars, plan=None):
            seen[name] = arrays
            raise RuntimeError("spied")
        return call

    t = {n: np.zeros(1) for n in ff.CALL_ARRAYS + bf.CALL_ARRAYS}
    monkeypatch.setattr(ff, "call", spy("fwd"))
    monkeypatch.setattr(bf, "call", spy("bwd"))
    with pytest.raises(RuntimeError, match="spied"):
        ops.batch_norm(t["x"], t["running_mean"], t["running_var"], t["weight"], t["bias"],
                       out=t["out"], residual=t["residual"],
                       new_running=(t["new_mean"], t["new_var"]))
    with pytest.raises(RuntimeError, match="spied"):
        ops.batch_norm_backward(t["dy"], t["x"], t["save_mean"], t["save_invstd"],
                                t["weight"], bias=t["bias"], residual=t["residual"])
    assert [a is t[n] for a, n in zip(seen["fwd"], ff.CALL_ARRAYS, strict=True)] == [True] * 9
    assert [a is t[n] for a, n in zip(seen["bwd"], bf.CALL_ARRAYS, strict=True)] == [True] * 7
    assert ext.BN_FORWARD_SLOTS == ff.CALL_ARRAYS
    assert ext.BN_BACKWARD_SLOTS == bf.CALL_ARRAYS


def test_fused_convolutions_go_straight_to_their_programs(stub):
    import dnnctl.torch as dt
    from dnnctl.torch import native
    from dnnctl.torch.fuse import FusedConv

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
            self.c2, self.b2 = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8)

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            return torch.relu(self.b2(self.c2(y)) + x)

    torch.manual_seed(0)
    model = Block().eval().to(torch.bfloat16).to(memory_format=torch.channels_last)
    dt.patch(model, _CudnnPlan(0))
    x = torch.randn(2, 8, 6, 6, dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    import gc

    convs = {id(model.c1), id(model.c2)}  # (the fused modules live in the traced forward)
    fused = [m for m in gc.get_objects()
             if type(m) is FusedConv and id(m._modules["conv"]) in convs]
    assert len(fused) == 2
    with torch.no_grad():
        for _ in range(4):
            model(x)
        assert all(any(v.__class__ is not int for v in m._direct.sites.values())
                   for m in fused)
        got = model(x)
        with native.suspended():
            want = model(x)
    # (the stub's epilogues launch nothing: what is compared is torch's convolutions, the
    # second one reading the first's result, through the Programs and through Python)
    assert got.shape == want.shape and got.stride() == want.stride()
    assert torch.equal(got, want)
    with torch.enable_grad():  # a call that records autograd takes the Python path
        y = model(x.detach().requires_grad_())
    assert y.requires_grad
    import copy

    clone = copy.deepcopy(fused[0])  # a copy's shortcuts start empty (sites are per process)
    assert not clone._direct.sites and fused[0]._direct.sites


def test_norms_go_straight_to_their_programs(stub):
    """A patched LayerNorm and RMSNorm in inference run their sites' Programs (native.Direct)
    once recorded: the same results as the Python path."""
    import dnnctl.torch as dt
    from dnnctl.torch import native

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(32), torch.nn.RMSNorm(32)).eval()
    dt.patch(model, None)
    x = torch.randn(3, 5, 32)
    directs = []
    for m in model:
        fwd = m.forward
        directs.append(next(a for a in fwd.args if isinstance(a, native.Direct)))
    with torch.no_grad():
        for _ in range(4):
            model(x)
        assert all(any(v.__class__ is not int for v in d.sites.values()) for d in directs)
        got = model(x)
        with native.suspended():
            want = model(x)
    # (the stub's launches compute nothing: both outputs are the allocations' contents;
    # what is compared is that both paths return a result of the call's layout)
    assert got.shape == want.shape == x.shape and got.stride() == want.stride()
