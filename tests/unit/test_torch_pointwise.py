"""Pointwise fusion (dnnctl.torch.pointwise): which chains of a traced graph become one
kernel, and what the generated code computes. The code's Python rendering runs element by
element on CPU tensors against the torch ops it replaces (the CUDA rendering of the same
statements is checked on a GPU by tests/gpu/test_pointwise_gpu.py)."""

from __future__ import annotations

import copy
import operator

import pytest

torch = pytest.importorskip("torch")
from _pointwise_cases import CASES, Rope, inputs  # noqa: E402
from _torch_models import LlamaBlock, ViTBlock  # noqa: E402
from torch import fx, nn  # noqa: E402

import dnnctl.torch as dt  # noqa: E402
from dnnctl.errors import UsageError  # noqa: E402
from dnnctl.torch import pointwise as pw  # noqa: E402
from dnnctl.torch import pointwise_render as pr  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# the rendering computes in float64 and rounds each value through float32 to its dtype;
# torch's CPU ops compute in float32: an ulp of float32 apart at most, which a rounding to
# float16 / bfloat16 can make one ulp of those
TOL = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def _fused(module: nn.Module) -> tuple[fx.GraphModule, list[str]]:
    gm = fx.symbolic_trace(module)
    return gm, pw.fuse_pointwise(gm)


def _calls(gm: fx.GraphModule, args: list) -> list[tuple[pw.FusedPointwise, tuple]]:
    """Each fused group's module with the arguments one run of gm gave it."""
    seen: list[tuple[pw.FusedPointwise, tuple]] = []
    handles = [m.register_forward_pre_hook(lambda m, a: seen.append((m, a)))
               for m in gm.modules() if isinstance(m, pw.FusedPointwise)]
    with torch.no_grad():
        gm(*args)
    for h in handles:
        h.remove()
    return seen


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_generated_code_matches_the_ops(case, dtype):
    name, module, shapes, perm = case
    gm, lines = _fused(copy.deepcopy(module))
    assert lines, f"{name}: nothing fused"
    args = inputs(shapes, perm, dtype, "cpu")
    with torch.no_grad():
        want = module(*args)
        got = gm(*args)  # on CPU each group runs its own ops: the model's result exactly
    for w, g in zip(want if isinstance(want, tuple) else (want,),
                    got if isinstance(got, tuple) else (got,)):
        assert torch.equal(w, g)
    calls = _calls(gm, args)
    assert calls
    for mod, a in calls:
        ref = mod.sub(*a)
        out = pr.run_python(mod._prog, a)
        assert out is not None, f"{name}: the kernel would not run"
        assert (out.shape, out.stride(), out.dtype) == (ref.shape, ref.stride(), ref.dtype)
        torch.testing.assert_close(out.double(), ref.double(), rtol=TOL[ref.dtype],
                                   atol=TOL[ref.dtype])
        assert mod.kernel_launches == 0  # CPU tensors: the ops, never a launch


def test_rotary_groups_and_what_they_read():
    """q's and k's rotations are a group each (seven ops); the tables' casts have a view as
    their user (unsqueeze) and stay ops of their own, read by both groups; the transposed q
    is read through its strides (no copy made)."""
    gm = fx.symbolic_trace(Rope())
    groups = pw.find_groups(gm.graph)
    assert len(groups) == 2
    for g in groups:
        ops = [pw._op_name(n) for n in g.members]
        assert sorted(ops) == ["add", "cat", "mul", "mul", "neg", "slice", "slice"]
        tensors = {n.name for n in g.inputs if not n.name.startswith("floordiv")}
        assert tensors == {g.members[0].args[0].name, "unsqueeze_1", "unsqueeze_3"}
    lines = pw.fuse_pointwise(gm)
    assert len(lines) == 2 and all("7 ops" in line for line in lines)
    assert len([n for n in gm.graph.nodes if n.op == "call_method" and n.target == "to"]) == 2


def test_a_cast_read_by_two_chains_is_computed_in_both():
    class Tables(nn.Module):  # the benchmark LLaMA layer's form: cast, then straight in
        def forward(self, q, k, cos):
            c = cos.to(q.dtype)
            return q * c + 1.0, k * c - 1.0

    gm = fx.symbolic_trace(Tables())
    groups = pw.find_groups(gm.graph)
    assert len(groups) == 2 and all(
        [pw._op_name(n) for n in g.members][0] == "cast" for g in groups)
    pw.fuse_pointwise(gm)
    assert not [n for n in gm.graph.nodes if n.op == "call_method" and n.target == "to"]


class _Shared(nn.Module):
    """a * b has a user that is no elementwise op (a matmul): computed once by torch, read by
    the group, not recomputed inside it."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = a * b
        return torch.sigmoid(p) + 1.0, p @ b.t()


def test_a_value_with_another_user_is_read_not_recomputed():
    gm = fx.symbolic_trace(_Shared())
    (group,) = pw.find_groups(gm.graph)
    assert [pw._op_name(n) for n in group.members] == ["sigmoid", "add"]
    assert [n.name for n in group.inputs] == ["mul"]


class _NotFused(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple:
        lone = x + y  # one op: nothing to gain
        alpha = torch.add(x, y, alpha=2.0) * 3  # alpha: not taken; the mul is alone
        stepped = x[..., ::2] * 2  # a strided slice: not taken
        return lone, alpha, stepped


def test_single_ops_and_unsupported_forms_stay_as_they_are():
    gm = fx.symbolic_trace(_NotFused())
    assert pw.find_groups(gm.graph) == []
    assert pw.fuse_pointwise(gm) == []


def test_integer_and_float64_values_run_the_ops():
    gm, lines = _fused(Rope())
    assert lines
    args64 = inputs([(1, 2, 3, 4), (1, 2, 3, 4), (3, 4), (3, 4)], None, torch.float64, "cpu")
    for mod, a in _calls(gm, args64):
        assert pr.run_python(mod._prog, a) is None  # float64: the kernel does not take it

    class Ints(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * 2 + 1) * 3

    gm, lines = _fused(Ints())
    assert lines
    x = torch.arange(6).reshape(2, 3)
    for mod, a in _calls(gm, [x]):
        assert pr.run_python(mod._prog, a) is None
    assert torch.equal(gm(x), Ints()(x))


def test_grad_and_cpu_calls_run_the_ops():
    gm, _ = _fused(Rope())
    args = inputs([(1, 2, 3, 4), (1, 2, 3, 4), (3, 4), (3, 4)], None, torch.float32, "cpu")
    args[0].requires_grad_(True)
    q, _k = gm(*args)
    q.sum().backward()  # autograd through the group's own ops
    ref = args[0].detach().clone().requires_grad_(True)
    q2, _ = Rope()(ref, *args[1:])
    q2.sum().backward()
    assert torch.equal(args[0].grad, ref.grad)


def test_patch_fuses_in_inference_only_and_can_be_turned_off():
    torch.manual_seed(0)
    model = LlamaBlock().eval()
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        want = model(x)
        report = dt.patch(model)
        got = model(x)
    assert len(report.pointwise) == 2 and "one kernel for" in report.summary()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    dt.unpatch(model)
    assert not dt.patch(model, pointwise=False).pointwise
    dt.unpatch(model)
    model.train()
    assert not dt.patch(model).pointwise  # training: autograd needs the ops
    dt.unpatch(model)
    with pytest.raises(UsageError, match="pointwise must be True or False"):
        dt.patch(model, pointwise="yes")


def test_patched_copy_and_vit_block():
    torch.manual_seed(0)
    model = ViTBlock().eval()
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        want = model(x)
        dt.patch(model)
        twin = copy.deepcopy(model)
        torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(twin(x), want, rtol=1e-5, atol=1e-5)


def test_scalarish_nodes_are_not_group_members():
    class Shapes(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            n = x.shape[-1] // 2 + 1  # python int arithmetic, not a tensor op
            return (x[..., :n] * 2.0).neg()

    gm = fx.symbolic_trace(Shapes())
    (group,) = pw.find_groups(gm.graph)
    assert all(n.target is not operator.add for n in group.members)
    pw.fuse_pointwise(gm)
    x = torch.randn(3, 6)
    assert torch.equal(gm(x), Shapes()(x))
    (mod, a), = _calls(gm, [x])
    torch.testing.assert_close(pr.run_python(mod._prog, a), Shapes()(x))


class _InPlaceBetween(nn.Module):
    """x is changed in place between y's op and the chain's end: y must be what x was."""

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        y = x * 2.0
        x.add_(r)
        return torch.sigmoid(y) + x


def test_an_in_place_op_inside_the_span_keeps_the_ops():
    gm = fx.symbolic_trace(_InPlaceBetween())
    assert pw.find_groups(gm.graph) == []
    x, r = torch.randn(4, 5), torch.randn(4, 5)
    want = _InPlaceBetween()(x.clone(), r)
    pw.fuse_pointwise(gm)
    assert torch.equal(gm(x.clone(), r), want)


# the kernel header's names as plain C++ (bfloat16 as its 16 bits, rounded to nearest even),
# so the CUDA rendering compiles and runs on the CPU
_HOST_HEADER = r"""
#pragma once
#include <cmath>
#include <math.h>
#include <cstring>
#include <cstdint>
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(x)
struct __half { uint16_t bits; };  // (float16 cases are left to the GPU tests)
struct __nv_bfloat16 { uint16_t bits; };
struct dim3 { unsigned x, y, z; };
static dim3 blockIdx, blockDim, threadIdx, gridDim;
namespace dnnctl {
inline float to_float(float v) { return v; }
inline float to_float(__nv_bfloat16 v) { uint32_t u = (uint32_t)v.bits << 16; float f; memcpy(&f, &u, 4); return f; }
template <typename T> T from_float(float v);
template <> inline float from_float<float>(float v) { return v; }
template <> inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) { uint32_t u; memcpy(&u, &v, 4); u += 0x7FFF + ((u >> 16) & 1); return __nv_bfloat16{(uint16_t)(u >> 16)}; }
}
inline float rsqrtf(float x){return 1/std::sqrt(x);}
inline float __int_as_float(int){return INFINITY;}
"""


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_cuda_rendering_runs_on_the_host(case, dtype, tmp_path):
    """The CUDA source itself, compiled by the host's C++ compiler with the grid walked in a
    loop, against the ops: the index arithmetic in the kernel's own integer type, its
    branches, its C expressions and its roundings."""
    import ctypes
    import re
    import shutil
    import subprocess

    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler on this machine")
    name, module, shapes, perm = case
    gm, _ = _fused(copy.deepcopy(module))
    (tmp_path / "dnnctl").mkdir()
    (tmp_path / "dnnctl" / "common.cuh").write_text(_HOST_HEADER)
    for k, (mod, a) in enumerate(_calls(gm, inputs(shapes, perm, dtype, "cpu"))):
        sig, params, key = mod._prog.signature(a)
        src = pr.cuda_source(key)
        params_c = re.search(r"pointwise\((.*)\) \{", src).group(1)
        names = [p.split()[-1] for p in params_c.split(", ")]
        src = src.replace('extern "C" __global__ void __launch_bounds__(256) pointwise(',
                          "static void body(")
        src += (f'extern "C" void run({params_c}) {{ blockDim.x = 32; gridDim.x = 3;\n'
                "  for (unsigned b = 0; b < 3; ++b) for (unsigned t = 0; t < 32; ++t) {\n"
                f"    blockIdx.x = b; threadIdx.x = t; body({', '.join(names)}); }} }}\n")
        (tmp_path / f"k{k}.cpp").write_text(src)
        lib_path = tmp_path / f"k{k}.so"
        subprocess.run([cxx, "-std=c++17", "-O1", "-shared", "-fPIC", f"-I{tmp_path}",
                        str(tmp_path / f"k{k}.cpp"), "-o", str(lib_path)], check=True,
                       capture_output=True)
        lib = ctypes.CDLL(str(lib_path))
        index = ctypes.c_uint if key[5] == "unsigned" else ctypes.c_longlong
        out = torch.empty_strided(sig.out_shape, sig.out_stride, dtype=sig.out_dtype)
        out.fill_(float("nan"))
        args = [ctypes.c_void_p(t.data_ptr()) for t in a if isinstance(t, torch.Tensor)]
        args += [ctypes.c_void_p(out.data_ptr()), index(sig.numel)]
        args += [index(v) if kind == "i" else ctypes.c_float(v)
                 for v, kind in zip(params, key[3])]
        lib.run.argtypes = [type(x) for x in args]
        lib.run(*args)
        ref = mod.sub(*a)
        torch.testing.assert_close(out, ref, rtol=TOL[ref.dtype], atol=TOL[ref.dtype])


def test_compiled_fullgraph_traces_the_ops():
    """torch.compile(fullgraph=True) of a fused graph: no graph break, the ops traced."""
    gm, _ = _fused(Rope())
    args = inputs([(1, 2, 3, 4), (1, 2, 3, 4), (3, 4), (3, 4)], None, torch.float32, "cpu")
    compiled = torch.compile(gm, backend="eager", fullgraph=True)
    with torch.no_grad():
        for w, g in zip(Rope()(*args), compiled(*args)):
            assert torch.equal(w, g)


class _Blocks(nn.Module):
    """A chain that starts inside a no_grad block and ends after it (a teacher's target
    mixed with the student's output): the block's edge splits it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            t = torch.sigmoid(x) * 2.0
        return (x + t).neg()


def test_a_grad_mode_block_edge_splits_a_chain():
    from dnnctl.torch.trace import symbolic_trace

    gm = symbolic_trace(_Blocks(), {})
    for g in pw.find_groups(gm.graph):
        names = [pw._op_name(n) for n in g.members]
        assert not ({"sigmoid", "neg"} <= set(names)), names
    pw.fuse_pointwise(gm)
    x = torch.randn(3, 4, requires_grad=True)
    gm(x).sum().backward()
    ref = x.detach().clone().requires_grad_(True)
    _Blocks()(ref).sum().backward()
    assert torch.equal(x.grad, ref.grad)
