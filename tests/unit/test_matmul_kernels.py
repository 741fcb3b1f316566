"""Host side of the tiled GEMM kernels (no GPU): tile / warp / vector rules, parameter spaces,
exact workspace sizes, supports() reasons, default parameters of the matmul and conv2d
tensor-core variants; and, where g++ and the CUDA headers exist, a few kernels executed on
the CPU emulator (tools/cuda_emu) through the variants' own build()."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from _emu_helpers import emu_fixture, needs_emu

from dnnctl.backends.base import DeviceInfo
from dnnctl.ops.base import rel_norm_error
from dnnctl.ops.matmul.cupy_variants import matmul_desc
from dnnctl.ops.matmul.gemm_launch import (
    MATH_MMA16,
    MATH_SIMT,
    MATH_TF32,
    GemmDesc,
    TileConfig,
    split_plan,
    tile_config,
    tile_ok,
    vec_for,
    warp_layout,
)
from dnnctl.ops.registry import get_op, get_variant

H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=227 * 1024)
T4 = DeviceInfo(backend="cupy", index=0, name="Tesla T4", compute_capability="7.5",
                sm_count=40, smem_per_block_optin=64 * 1024)
MM = get_op("matmul")
CONV = get_op("conv2d")


def mm(**kw):
    return MM.problem(dict({"dtype": "bfloat16"}, **kw))


# ----------------------------------------------------------------------------- helpers


def test_warp_layout_picks_squarest_legal_tiles():
    assert warp_layout(128, 128, 4, MATH_MMA16) == (2, 2)
    assert warp_layout(128, 256, 8, MATH_MMA16) == (2, 4)
    assert warp_layout(256, 128, 8, MATH_MMA16) == (4, 2)
    assert warp_layout(16, 128, 4, MATH_MMA16) == (1, 4)
    assert warp_layout(16, 32, 4, MATH_MMA16) is None  # no 16 x 16 warp tiles fit
    assert warp_layout(32, 32, 4, MATH_SIMT) == (2, 2)


def test_vec_for_largest_dividing_power_of_two():
    assert [vec_for(x, 2) for x in (64, 12, 6, 7)] == [8, 4, 2, 1]
    assert [vec_for(x, 4) for x in (64, 6, 9)] == [4, 2, 1]


def test_split_plan_never_leaves_empty_splits():
    for k in (1, 31, 32, 33, 100, 1000, 4096):
        for bk in (32, 64):
            for s in (1, 2, 3, 4, 8, 16):
                kchunk, splits = split_plan(k, bk, s)
                assert kchunk % bk == 0 and 1 <= splits <= s
                assert (splits - 1) * kchunk < k <= splits * kchunk


def test_smem_and_register_budget():
    big = TileConfig(MATH_MMA16, 256, 256, 64, 2, 4, 5)
    assert big.smem_bytes("float16") == 5 * 512 * 64 * 2
    assert not tile_ok(big, "float16", H200)  # 128 KB? no: 320 KB > 227 KB, and 256 acc
    ok = tile_config({"bm": 128, "bn": 128, "bk": 32, "warps": 4, "stages": 4}, MATH_MMA16)
    assert ok.acc_per_thread == 128 and ok.smem_bytes("bfloat16") == 65536
    assert tile_ok(ok, "bfloat16", H200)
    tf = tile_config({"bm": 128, "bn": 128, "bk": 32, "warps": 4, "stages": 4}, MATH_TF32)
    assert tf.smem_bytes("float32") == 131072


@pytest.mark.parametrize(("ta", "tb", "k", "want"), [
    (False, False, 64, (8, 8)), (False, False, 12, (4, 8)), (True, False, 64, (2, 8)),
    (False, True, 6, (2, 2)), (True, True, 7, (2, 1)),
])
def test_desc_vectors_divide_leading_dims(ta, tb, k, want):
    d = matmul_desc(mm(m=6, n=24, k=k, trans_a=ta, trans_b=tb))
    assert d.vecs() == want
    assert (d.lda, d.ldb) == ((6 if ta else k), (k if tb else 24))


def test_batch_stride_limits_vector_width():
    d = GemmDesc("float16", m=8, n=8, k=8, batch=2, a_kmajor=True, b_kmajor=False, lda=8,
                 ldb=8, ldc=8, sa=4, sb=64, sc=64)
    assert d.vecs() == (4, 8)


# ----------------------------------------------------------------------------- variants


@pytest.mark.parametrize("shape", [
    dict(m=4096, n=4096, k=4096), dict(m=16, n=11008, k=4096), dict(m=1, n=1, k=1),
    dict(m=77, n=33, k=1000, trans_a=True), dict(batch=12, m=128, n=64, k=128, trans_b=True),
])
@pytest.mark.parametrize("name", ["mma", "mma_atomic"])
def test_mma_space_respects_budgets(name, shape):
    v = get_variant("matmul", "cupy", name)
    p = mm(**shape)
    if not v.supports(p, H200):
        assert name == "mma_atomic"
        return
    space = list(v.param_space(p, H200))
    assert space
    for params in space:
        cfg = tile_config(params, MATH_MMA16)
        assert cfg is not None and tile_ok(cfg, "bfloat16", H200)
        assert cfg.acc_per_thread <= 128
        _, splits = split_plan(p["k"], params["bk"], params["splitk"])
        assert splits == params["splitk"]
        ws = v.workspace_bytes(p, params)
        slabs = p["batch"] * p["m"] * p["n"] * 4
        if name == "mma_atomic":
            assert ws == slabs
        elif splits == 1:
            assert ws == 0 and params["reduce"] == "fused"  # no duplicate of splitk=1
        else:
            tiles = -(-p["m"] // params["bm"]) * -(-p["n"] // params["bn"]) * p["batch"]
            counters = 4 * tiles if params["reduce"] == "fused" else 0
            assert ws == splits * slabs + counters
    default = v.default_params(p, H200)
    assert default in space


def test_large_square_space_is_tunable_size():
    v = get_variant("matmul", "cupy", "mma")
    space = list(v.param_space(mm(m=4096, n=4096, k=4096), H200))
    assert 20 <= len(space) <= 400
    assert all(p["splitk"] == 1 for p in space)  # the grid already fills 132 SMs
    assert all(p["bm"] * p["bn"] >= 64 * 64 for p in space)


def test_skinny_shapes_get_split_k_by_default():
    v = get_variant("matmul", "cupy", "mma")
    d = v.default_params(mm(m=16, n=4096, k=11008), H200)
    assert d["bm"] == 16 and d["splitk"] > 1
    assert v.default_params(mm(m=4096, n=4096, k=4096), H200)["splitk"] == 1


def test_supports_reasons():
    mma = get_variant("matmul", "cupy", "mma")
    simt = get_variant("matmul", "cupy", "simt")
    atomic = get_variant("matmul", "cupy", "mma_atomic")
    fp32 = MM.problem({"m": 64, "n": 64, "k": 64, "dtype": "float32"})
    assert "tf32" in mma.supports(fp32, H200).reason
    assert mma.supports(MM.problem({"m": 64, "n": 64, "k": 64, "dtype": "float32",
                                    "tf32": True}), H200)
    assert simt.supports(fp32, H200) and not simt.supports(mm(m=8, n=8, k=8), H200)
    assert "compute capability" in mma.supports(mm(m=8, n=8, k=8), T4).reason
    assert "split" in atomic.supports(mm(m=4096, n=4096, k=4096), H200).reason
    assert atomic.supports(mm(m=16, n=4096, k=4096), H200)


def test_default_choice_cuda_follows_the_cost_model():
    """Large products go to cuBLAS (675 vs 490 TFLOP/s measured); the pick is always the
    cheapest estimate (or a near-tie won by the fallback order)."""
    from dnnctl.ops.costmodel import TIE
    from dnnctl.ops.matmul.op import ranked

    big = MM.problem({"m": 4096, "n": 4096, "k": 4096, "dtype": "bfloat16"})
    assert MM.default_choice(big, "cupy", H200).variant == "cublas"
    for p in (big, mm(m=64, n=64, k=64), mm(m=16, n=4096, k=4096)):
        est = ranked(p, "cupy", H200)
        ch = MM.default_choice(p, "cupy", H200)
        mine = next(e for e in est if e.variant == ch.variant and e.params == ch.param_dict)
        assert mine.us <= est[0].us * (1 + TIE)


CONV_CASES = [
    dict(n=32, c=64, h=56, w=56, k=64, r=3, s=3, pad=1),
    dict(n=1, c=3, h=224, w=224, k=64, r=7, s=7, stride=2, pad=3),
    dict(n=1, c=512, h=7, w=7, k=512, r=3, s=3, pad=1),
    dict(n=2, c=13, h=9, w=11, k=10, r=3, s=3, pad=[1, 0, 0, 1], dilation=2, groups=1),
    dict(n=8, c=256, h=14, w=14, k=1024, r=1, s=1),
    dict(n=8, c=512, h=28, w=28, k=1024, r=1, s=1, stride=2),
    dict(n=2, c=32, h=9, w=9, k=48, r=3, s=3, pad=1, groups=2),
]


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "-".join(map(str, c.values())))
def test_conv_tensorcore_defaults_are_valid(case, dtype, layout):
    p = CONV.problem(dict(case, dtype=dtype, layout=layout))
    for name in ("implicit_gemm", "gemm_1x1"):
        v = get_variant("conv2d", "cupy", name)
        if not v.supports(p, H200):
            continue
        d = v.default_params(p, H200)
        assert d is not None and v.check_params(d) is None
        assert v.valid_params(p, d, H200)
        assert v.workspace_bytes(p, d) >= 0


def test_conv_supports_reasons():
    ig = get_variant("conv2d", "cupy", "implicit_gemm")
    g1 = get_variant("conv2d", "cupy", "gemm_1x1")
    base = dict(n=2, c=32, h=8, w=8, k=32, dtype="float16", layout="NHWC")
    dw = CONV.problem(dict(base, r=3, s=3, groups=32))
    assert "depthwise" in ig.supports(dw, H200).reason
    assert "1x1" in g1.supports(CONV.problem(dict(base, r=3, s=3)), H200).reason
    assert "padded" in g1.supports(CONV.problem(dict(base, r=1, s=1, pad=1)), H200).reason
    nchw_g = CONV.problem(dict(base, r=1, s=1, groups=2, layout="NCHW"))
    assert "groups" in g1.supports(nchw_g, H200).reason
    assert ig.supports(nchw_g, H200) and g1.supports(CONV.problem(dict(base, r=1, s=1)), H200)


def test_conv_split_workspace_is_exact():
    ig = get_variant("conv2d", "cupy", "implicit_gemm")
    p = CONV.problem(dict(n=1, c=512, h=7, w=7, k=512, r=3, s=3, pad=1, dtype="float16",
                          layout="NHWC"))
    params = {"bm": 64, "bn": 64, "bk": 32, "warps": 4, "stages": 4, "splitk": 8}
    assert ig.valid_params(p, params, H200)
    assert ig.workspace_bytes(p, params) == 8 * 49 * 512 * 4
    assert ig.workspace_bytes(p, dict(params, splitk=1)) == 0


# ----------------------------------------------------------------------------- emulator

ROOT = Path(__file__).resolve().parents[2]


emu = emu_fixture()


EMU_CASES = [
    ("matmul", "mma", dict(m=37, n=72, k=88, dtype="bfloat16", trans_a=True, bias=True,
                           activation="gelu"),
     dict(bm=32, bn=64, bk=32, warps=4, stages=3, splitk=1, reduce="fused")),
    ("matmul", "mma", dict(m=20, n=64, k=300, dtype="float16", trans_b=True),
     dict(bm=16, bn=64, bk=32, warps=4, stages=4, splitk=4, reduce="separate")),
    ("matmul", "mma", dict(batch=2, m=33, n=70, k=520, dtype="bfloat16", bias=True,
                           activation="silu"),
     dict(bm=32, bn=64, bk=32, warps=4, stages=3, splitk=4, reduce="fused")),
    ("matmul", "mma", dict(m=40, n=72, k=300, dtype="float16", trans_a=True, bias=True),
     dict(bm=32, bn=64, bk=32, warps=4, stages=2, splitk=1, reduce="fused", pipe="overlap")),
    # the split-K finish kernel's four-wide path (n % 4 == 0, bias and gelu; a batch) and
    # its one-element path (n odd)
    ("matmul", "mma", dict(batch=2, m=21, n=72, k=300, dtype="bfloat16", bias=True,
                           activation="gelu"),
     dict(bm=16, bn=64, bk=32, warps=4, stages=3, splitk=4, reduce="separate")),
    ("matmul", "mma", dict(m=21, n=71, k=300, dtype="float16", bias=True, activation="silu"),
     dict(bm=16, bn=64, bk=32, warps=4, stages=3, splitk=4, reduce="separate")),
    ("matmul", "mma_atomic", dict(batch=2, m=9, n=40, k=257, dtype="float16", bias=True),
     dict(bm=16, bn=64, bk=32, warps=4, stages=2, splitk=2)),
    ("matmul", "simt", dict(m=30, n=33, k=41, dtype="float32", activation="silu"),
     dict(bm=32, bn=32, bk=16, warps=4, stages=3, splitk=2, reduce="fused")),
    ("conv2d", "implicit_gemm", dict(n=2, c=12, h=7, w=6, k=20, r=3, s=3, stride=2,
                                     pad=[1, 0, 1, 2], dtype="float16", layout="NHWC",
                                     bias=True, residual=True, activation="relu"),
     dict(bm=32, bn=32, bk=32, warps=4, stages=3, splitk=1)),
    # odd channels in fp16 / bf16 NHWC: input and weight zero-padded (C 3 -> 4, 13 -> 16)
    ("conv2d", "implicit_gemm", dict(n=1, c=3, h=17, w=15, k=16, r=7, s=7, stride=2, pad=3,
                                     dtype="float16", layout="NHWC", bias=True),
     dict(bm=64, bn=32, bk=32, warps=4, stages=3, splitk=1)),
    ("conv2d", "implicit_gemm", dict(n=1, c=13, h=7, w=9, k=24, r=3, s=3, pad=1,
                                     dtype="bfloat16", layout="NHWC", activation="relu",
                                     residual=True),
     dict(bm=32, bn=32, bk=32, warps=4, stages=2, splitk=2)),
    ("conv2d", "implicit_gemm", dict(n=1, c=6, h=9, w=8, k=10, r=3, s=3, pad=2, dilation=2,
                                     dtype="bfloat16", layout="NCHW", bias=True),
     dict(bm=32, bn=32, bk=32, warps=4, stages=2, splitk=1)),
    ("conv2d", "gemm_1x1", dict(n=2, c=24, h=7, w=5, k=16, r=1, s=1, stride=2,
                                dtype="float16", layout="NCHW", bias=True, residual=True),
     dict(bm=16, bn=64, bk=32, warps=4, stages=2, splitk=1)),
]


@needs_emu
@pytest.mark.parametrize(("op", "name", "key", "params"), EMU_CASES,
                         ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(EMU_CASES)])
def test_kernels_on_cpu_emulator(emu, op, name, key, params):
    from dnnctl.ops.check import check_variant

    o = get_op(op)
    p = o.problem(key)
    v = get_variant(op, "cupy", name)
    dev = emu.device(0)
    assert v.supports(p, dev)
    res = check_variant(o, p, v, params, emu, dev, seed=11)
    assert res.ok, res.detail
    assert res.max_rel_err < o.tolerance(p, "y") / 2
    assert not math.isnan(res.max_rel_err) and np.isfinite(res.max_rel_err)


@needs_emu
def test_fused_split_k_counters_reset_between_launches(emu):
    """The last split of each tile zeroes its counter: one built kernel, two launches."""
    from dnnctl.ops.check import prepare

    p = MM.problem(dict(m=24, n=96, k=640, dtype="float16", bias=True, activation="relu"))
    v = get_variant("matmul", "cupy", "mma")
    params = dict(bm=16, bn=64, bk=32, warps=4, stages=3, splitk=4, reduce="fused")
    dev = emu.device(0)
    kern = v.build(p, params, dev)
    for seed in (1, 2, 3):
        prep = prepare(MM, p, emu, np.random.default_rng(seed))
        kern(prep.inputs, prep.outputs, {})
        err = rel_norm_error(prep.outputs["y"], prep.refs["y"])
        assert err < 1e-3, (seed, err)


def _numpy_cublas(transa, transb, m, n, k, alpha, a, a_type, lda, stride_a, b, b_type, ldb,
                  stride_b, beta, c, c_type, ldc, stride_c, batch, compute, algo=-1):
    """cublasGemmStridedBatchedEx's documented column-major semantics on host pointers (the
    emulator's arrays live in host memory), alpha = 1, beta = 0."""
    import ctypes

    from dnnctl.ops import codes
    from dnnctl.ops.base import np_dtype

    dt = {v: np_dtype(n_) for n_, v in codes.CUDA_R.items() if n_ != "complex64"}

    def view(addr, code, rows, cols, ld, stride):  # column-major rows x cols, per batch
        d = dt[code]
        size = stride * (batch - 1) + ld * (cols - 1) + rows
        flat = np.frombuffer((ctypes.c_char * (size * d.itemsize)).from_address(addr), d)
        return [np.lib.stride_tricks.as_strided(flat[i * stride:], (rows, cols),
                                                (d.itemsize, ld * d.itemsize))
                for i in range(batch)]

    av = view(a, a_type, *((m, k) if transa == 0 else (k, m)), lda, stride_a)
    bv = view(b, b_type, *((k, n) if transb == 0 else (n, k)), ldb, stride_b)
    cv = view(c, c_type, m, n, ldc, stride_c)
    for i in range(batch):
        aa = av[i].astype(np.float64)
        bb = bv[i].astype(np.float64)
        cv[i][...] = ((aa if transa == 0 else aa.T) @ (bb if transb == 0 else bb.T)).astype(
            cv[i].dtype)
    return None


@needs_emu
@pytest.mark.parametrize("key", [
    dict(m=24, n=72, k=40, dtype="bfloat16", bias=True, activation="silu"),
    dict(batch=2, m=9, n=36, k=20, dtype="float16", trans_a=True, activation="gelu"),
    dict(m=7, n=13, k=9, dtype="float32", bias=True, activation="relu"),  # odd n: 1-wide
], ids=["bf16-bias-silu", "fp16-batch-gelu", "fp32-odd"])
def test_cublas_in_place_epilogue_on_cpu_emulator(emu, monkeypatch, key):
    """cuBLAS's product in the output dtype, then bias + activation in place over it
    (gemm_epilogue_inplace, its vector widths by n): within the op's tolerance of the
    float64 reference, with cuBLAS replaced by numpy."""
    from dnnctl.backends import cublas
    from dnnctl.ops.check import check_variant

    monkeypatch.setattr(cublas, "gemm_strided_batched", _numpy_cublas)
    p = MM.problem(key)
    v = get_variant("matmul", "cupy", "cublas")
    assert v.workspace_bytes(p, {}) == 0  # no fp32 product any more
    res = check_variant(MM, p, v, {}, emu, emu.device(0), seed=5)
    assert res.ok, res.detail
    assert res.max_rel_err < MM.tolerance(p, "y") / 2


# ----------------------------------------------------------------------------- NVRTC


class _RecordingBackend:
    """Stands in for the cupy backend: records (source, defines) of every compile."""

    def __init__(self):
        self.builds = set()

    def compile_module(self, source, *, defines=None, name_expressions=(), options=(),
                       device=None):
        self.builds.add((source, tuple(sorted((defines or {}).items()))))
        rec = self

        class _Mod:
            def get_function(self, name):
                return rec

        return _Mod()

    xp = np


def test_representative_builds_compile_with_nvrtc(monkeypatch):
    """The kernels our variants ask for compile with NVRTC as the cupy backend runs it
    (tools/cuda_emu/compile_sweep.py covers every configuration of the spaces)."""
    import sys

    monkeypatch.syspath_prepend(str(ROOT))
    try:
        from tools.nvrtc_check import _libnvrtc, nvrtc_compile

        _libnvrtc()
    except (ImportError, SystemExit):
        pytest.skip("libnvrtc (pip install nvidia-cuda-nvrtc) or tools/nvrtc_check.py missing")
    from dnnctl.backends import registry as base

    rec = _RecordingBackend()
    monkeypatch.setitem(base._BACKENDS, "cupy", rec)
    builds = [
        ("matmul", "mma", dict(m=4096, n=4096, k=4096, dtype="bfloat16"), None),
        ("matmul", "mma", dict(m=16, n=4096, k=4096, dtype="float16", trans_b=True,
                               bias=True, activation="gelu"),
         dict(bm=16, bn=128, bk=64, warps=4, stages=4, splitk=4, reduce="fused")),
        ("matmul", "mma_atomic", dict(m=16, n=512, k=4096, dtype="bfloat16"), None),
        ("matmul", "mma", dict(m=64, n=64, k=64, dtype="float32", tf32=True, trans_a=True),
         None),
        ("matmul", "simt", dict(m=300, n=300, k=300, dtype="float32", bias=True), None),
        ("conv2d", "implicit_gemm", dict(n=8, c=64, h=28, w=28, k=64, r=3, s=3, pad=1,
                                         dtype="float16", layout="NHWC", residual=True), None),
        ("conv2d", "implicit_gemm", dict(n=2, c=3, h=32, w=32, k=16, r=7, s=7, stride=2, pad=3,
                                         dtype="bfloat16", layout="NCHW"), None),
        ("conv2d", "gemm_1x1", dict(n=4, c=256, h=14, w=14, k=512, r=1, s=1, stride=2,
                                    dtype="float16", layout="NCHW", bias=True), None),
    ]
    for op, name, key, params in builds:
        o, v = get_op(op), get_variant(op, "cupy", name)
        p = o.problem(key)
        v.build(p, params or v.default_params(p, H200), H200)
    assert {s for s, _ in rec.builds} >= {"gemm/gemm.cu", "gemm/epilogue.cu",
                                          "conv2d/implicit_gemm.cu", "conv2d/gemm_1x1.cu"}
    inc = Path(__import__("os").environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    from dnnctl.resources import kernels_dir

    for src, defs in sorted(rec.builds):
        opts = ["-arch=sm_90a", "--std=c++17", f"-I{kernels_dir() / 'include'}", f"-I{inc}",
                "-DDNNCTL_HEADERS=0x0", *(f"-D{k}={int(v)}" for k, v in defs)]
        ok, log = nvrtc_compile(kernels_dir() / src, opts, [])
        assert ok, f"{src} {dict(defs)}:\n{log}"
    sys.modules.pop("tools.nvrtc_check", None)
