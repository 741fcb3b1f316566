"""conv2d CUDA variants without a GPU: support answers, parameter spaces, exact workspaces,
the row-major -> cuBLAS mapping, the default heuristic, and every kernel source compiling
with NVRTC under the exact defines build() produces (skipped when libnvrtc is missing)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from _nvrtc_helpers import BuildRecorder, nvrtc

from dnnctl.backends.base import DeviceInfo
from dnnctl.ops.conv2d import _cuda
from dnnctl.ops.conv2d.cuda_base import Workspace, align
from dnnctl.ops.conv2d.op import default_params, preference
from dnnctl.ops.registry import get_op, get_variant, variants
from dnnctl.resources import kernels_dir

OP = get_op("conv2d")
H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=232448)
MINE = ("direct", "im2col_gemm", "winograd", "fft", "depthwise")

PROBLEMS = [
    dict(n=2, c=16, h=10, w=12, k=24, r=3, s=3, pad=1),
    dict(n=1, c=13, h=9, w=11, k=10, r=3, s=3, stride=2, pad=[1, 0, 0, 1], bias=True),
    dict(n=2, c=32, h=9, w=9, k=48, r=3, s=3, pad=1, groups=2, dilation=2),
    dict(n=2, c=32, h=17, w=15, k=64, r=5, s=5, pad=2, groups=32, activation="relu"),
    dict(n=4, c=64, h=7, w=9, k=72, r=1, s=1, residual=True),
    dict(n=1, c=3, h=33, w=31, k=16, r=7, s=7, stride=2, pad=3),
    dict(n=256, c=64, h=56, w=56, k=64, r=3, s=3, pad=1),
]


def problem(i: int, dtype: str = "float16", layout: str = "NHWC"):
    return OP.problem(dict(PROBLEMS[i], dtype=dtype, layout=layout))


def test_my_cuda_variants_are_registered_with_sources():
    names = {v.name for v in variants("conv2d", "cupy")}
    assert set(MINE) <= names
    for name in MINE:
        v = get_variant("conv2d", "cupy", name)
        assert (kernels_dir() / v.source).is_file(), v.source


@pytest.mark.parametrize(("name", "idx", "needle"), [
    ("winograd", 3, "3x3"), ("winograd", 1, "stride 1"), ("winograd", 2, "stride 1"),
    ("depthwise", 0, "not depthwise"), ("fft", 4, "1x1"),
])
def test_supports_says_why_not(name, idx, needle):
    ans = get_variant("conv2d", "cupy", name).supports(problem(idx), H200)
    assert not ans and needle in ans.reason


def test_bf16_needs_ampere():
    old = DeviceInfo(backend="cupy", index=0, name="V100", compute_capability="7.0")
    ans = get_variant("conv2d", "cupy", "direct").supports(problem(0, "bfloat16"), old)
    assert not ans and "8.0" in ans.reason


@pytest.mark.parametrize(("dtype", "layout"), list(itertools.product(
    ("float32", "float16", "bfloat16"), ("NCHW", "NHWC"))))
def test_default_params_are_in_the_space(dtype, layout):
    for name in MINE:
        v = get_variant("conv2d", "cupy", name)
        for i in range(len(PROBLEMS)):
            p = problem(i, dtype, layout)
            if not v.supports(p, H200):
                continue
            space = list(v.param_space(p, H200))
            assert space, f"{name} supports {p.short()} with no parameters"
            d = default_params(v, p, H200)
            assert d in space and v.check_params(d) is None, (name, p.short(), d)
    assert get_variant("conv2d", "cupy", "direct").supports(problem(3, dtype, layout), H200)


def test_depthwise_parameter_spaces_by_layout():
    v = get_variant("conv2d", "cupy", "depthwise")
    nhwc = list(v.param_space(problem(3, "float16", "NHWC"), H200))
    nchw = list(v.param_space(problem(3, "float16", "NCHW"), H200))
    assert all(p["th"] == p["tw"] == 0 and p["cb"] > 0 for p in nhwc)
    assert {p["vec"] for p in nhwc} == {1, 2, 4, 8}  # 16-byte fp16 vectors allowed
    assert all(p["vec"] == 1 and p["cb"] == 0 and p["threads"] == p["th"] * p["tw"] // p["tq"]
               for p in nchw)
    fp32 = list(v.param_space(problem(3, "float32", "NHWC"), H200))
    assert max(p["vec"] for p in fp32) == 4  # never more than 16 bytes per access


def test_workspace_bytes_are_exact():
    im2col = get_variant("conv2d", "cupy", "im2col_gemm")
    p = problem(0)  # n=2, c=16, 10x12 -> 10x12, 3x3, fp16
    assert im2col.workspace_bytes(p, {"chunk": 0, "vec": 8}) == align(2 * 120 * 16 * 9 * 2)
    assert im2col.workspace_bytes(p, {"chunk": 1, "vec": 8}) == align(1 * 120 * 16 * 9 * 2)
    assert im2col.workspace_bytes(problem(4, layout="NCHW"), {"chunk": 0, "vec": 1}) == 0
    wino = get_variant("conv2d", "cupy", "winograd")
    # F(4x4): 36 positions, tiles 3x3 per image, U/V fp32 even for fp16 I/O, M fp32
    want = align(36 * 24 * 16 * 4) + align(36 * 18 * 16 * 4) + align(36 * 18 * 24 * 4)
    assert wino.workspace_bytes(p, {"tile": 4, "chunk": 0}) == want
    # F(2x2) keeps U/V in fp16: 16 positions, 5x6 tiles per image
    want = align(16 * 24 * 16 * 2) + align(16 * 60 * 16 * 2) + align(16 * 60 * 24 * 4)
    assert wino.workspace_bytes(p, {"tile": 2, "chunk": 0}) == want
    fft = get_variant("conv2d", "cupy", "fft")
    hf, wf = 12, 14  # padded 12x14 is already 2^a3^b5^c7^d
    f = hf * (wf // 2 + 1)
    want = (align(max(24 * 16, 2 * 16, 2 * 24) * hf * wf * 4) + align(f * 24 * 16 * 8)
            + align(f * 2 * 16 * 8) + align(f * 2 * 24 * 8))
    assert fft.workspace_bytes(p, {"size": "smooth", "chunk": 0}) == want


def test_workspace_allocation_matches_its_size():
    ws = Workspace([("a", 3, np.float16), ("b", 5, np.complex64), ("c", 1, np.float32)])
    parts = ws.allocate(np)
    assert ws.nbytes == 3 * 256
    assert parts["a"].dtype == np.float16 and parts["a"].size == 3
    assert parts["b"].dtype == np.complex64 and parts["b"].size == 5
    ptr = {k: v.__array_interface__["data"][0] for k, v in parts.items()}
    assert ptr["b"] - ptr["a"] == 256 and ptr["c"] - ptr["b"] == 256


class ColumnMajorBlas:
    """cuBLAS strided-batched GEMM semantics in numpy (column-major, op N/T/C)."""

    def __init__(self):
        self.calls = []

    @staticmethod
    def view(arr, off, rows, cols, ld):
        flat = arr.reshape(-1)
        assert ld >= max(1, rows) and off + rows - 1 + (cols - 1) * ld < flat.size
        return np.lib.stride_tricks.as_strided(flat[off:], (rows, cols),
                                               (flat.itemsize, ld * flat.itemsize))

    def gemm(self, ta, tb, m, n, k, a, a_off, lda, sa, b, b_off, ldb, sb, c, c_off, ldc, sc,
             batch, compute):
        self.calls.append((ta, tb, compute))
        op = {0: lambda x: x, 1: lambda x: x.T, 2: lambda x: x.conj().T}
        for i in range(batch):
            A = op[ta](self.view(a, a_off + i * sa, *((m, k) if ta == 0 else (k, m)), lda))
            B = op[tb](self.view(b, b_off + i * sb, *((k, n) if tb == 0 else (n, k)), ldb))
            self.view(c, c_off + i * sc, m, n, ldc)[...] = A @ B


@pytest.mark.parametrize(("a_trans", "b_trans", "conj"), [
    (False, False, False), (True, False, False), (False, True, False), (True, True, False),
    (False, True, True)])
def test_gemm_rowmajor_maps_onto_column_major_cublas(a_trans, b_trans, conj):
    rng = np.random.default_rng(0)
    m, n, k, batch = 5, 7, 3, 2
    dt = np.complex128 if conj else np.float64
    A = rng.standard_normal((batch, m, k)) + (1j * rng.standard_normal((batch, m, k))
                                              if conj else 0)
    B = rng.standard_normal((batch, k, n)) + (1j * rng.standard_normal((batch, k, n))
                                              if conj else 0)
    a_st = np.ascontiguousarray(A.transpose(0, 2, 1) if a_trans else A).astype(dt)
    b_st = np.ascontiguousarray(np.conj(B).transpose(0, 2, 1) if conj else
                                (B.transpose(0, 2, 1) if b_trans else B)).astype(dt)
    # C rows of 11 with a 2-element offset: ld and offsets must be honoured
    c = np.zeros(2 + batch * m * 11, dt)
    blas = ColumnMajorBlas()
    _cuda.gemm_rowmajor(blas, m, n, k, a_st, 0, a_st.shape[2], a_st[0].size, a_trans,
                        b_st, 0, b_st.shape[2], b_st[0].size, b_trans,
                        c, 2, 11, m * 11, batch=batch, tf32=True, b_conj=conj)
    got = np.stack([c[2 + i * m * 11:2 + (i + 1) * m * 11].reshape(m, 11)[:, :n]
                    for i in range(batch)])
    np.testing.assert_allclose(got, A @ B, rtol=1e-12)
    assert blas.calls[0][2] == _cuda.CUBLAS_COMPUTE_32F_FAST_TF32


def test_default_choice_on_the_gpu_by_shape():
    """The cost model's pick is always a supported variant with legal parameters; the
    fallback order (preference) still answers the backward passes and excludes winograd
    where it cannot run."""
    for idx in range(len(PROBLEMS)):
        for dtype, layout in (("float32", "NCHW"), ("float16", "NHWC"), ("float16", "NCHW")):
            p = problem(idx, dtype, layout)
            ch = OP.default_choice(p, "cupy", H200)
            v = get_variant("conv2d", "cupy", ch.variant)
            assert v.supports(p, H200) and v.check_params(ch.param_dict) is None
            assert v.valid_params(p, ch.param_dict, H200)
    assert OP.default_choice(problem(3), "cupy", H200).variant == "depthwise"
    assert "winograd" not in preference(problem(2), "cupy")  # dilation 2


# ----------------------------------------------------------------------------- NVRTC


def test_every_kernel_build_compiles_with_nvrtc():
    nvrtc_compile = nvrtc()
    import os

    rec = BuildRecorder()
    picks = [(0, "float16", "NHWC"), (1, "float32", "NCHW"), (3, "bfloat16", "NHWC"),
             (3, "float32", "NCHW"), (4, "bfloat16", "NCHW")]
    with _cuda.use_runtime(rec):
        for name in MINE:
            v = get_variant("conv2d", "cupy", name)
            for idx, dtype, layout in picks:
                p = problem(idx, dtype, layout)
                if v.supports(p, H200):
                    v.build(p, default_params(v, p, H200), H200)
    sources = rec.builds
    assert {s for s, _ in sources} >= {"conv2d/direct.cu", "conv2d/im2col.cu",
                                       "conv2d/winograd.cu", "conv2d/fft.cu",
                                       "conv2d/depthwise.cu", "conv2d/epilogue.cu"}
    cuda_inc = os.environ.get("CUDA_HOME", "/usr/local/cuda") + "/include"
    for src, defs in sorted(sources):
        opts = ["-arch=sm_90a", "--std=c++17", f"-I{kernels_dir() / 'include'}",
                f"-I{cuda_inc}", "-DDNNCTL_HEADERS=0x0",
                *(f"-D{k}={int(v) if isinstance(v, bool) else v}" for k, v in defs)]
        ok, log = nvrtc_compile(kernels_dir() / src, opts, [])
        assert ok, f"{src} {defs}:\n{log}"
    assert len(sources) >= 12


# ----------------------------------------------------------------------------- nhwc_implicit_gemm


def test_nhwc_implicit_gemm_support_params_and_workspace():
    v = get_variant("conv2d", "cupy", "nhwc_implicit_gemm")
    ig = get_variant("conv2d", "cupy", "implicit_gemm")
    assert v.params == ig.params
    ans = v.supports(problem(0, "float16", "NHWC"), H200)
    assert not ans and "already NHWC" in ans.reason
    ans = v.supports(problem(3, "float16", "NCHW"), H200)  # depthwise: implicit_gemm says no
    assert not ans and "implicit_gemm" in ans.reason and "depthwise" in ans.reason
    plain = OP.problem(dict(PROBLEMS[4], dtype="float16", layout="NCHW"))
    assert not v.supports(plain, H200) and "gemm_1x1" in v.supports(plain, H200).reason
    p = OP.problem(dict(PROBLEMS[1], dtype="float32", layout="NCHW", tf32=True, residual=True))
    assert v.supports(p, H200)
    inner = OP.problem(dict(PROBLEMS[1], dtype="float32", layout="NHWC", tf32=True))
    params = v.default_params(p, H200)
    assert params == ig.default_params(inner, H200)
    assert list(v.param_space(p, H200)) == list(ig.param_space(inner, H200))
    # x, w and y in NHWC, each 256-byte aligned, plus the inner GEMM's split-K slabs
    xb, wb, yb = 1 * 13 * 9 * 11 * 4, 10 * 13 * 9 * 4, 1 * 10 * 4 * 5 * 4  # P, Q = 4, 5
    for prm in list(v.param_space(p, H200))[:40]:
        assert v.workspace_bytes(p, prm) == (align(xb) + align(wb) + align(yb)
                                             + ig.workspace_bytes(inner, prm))


def test_transpose_kernel_compiles_with_nvrtc():
    nvrtc_compile = nvrtc()
    import os

    cuda_inc = os.environ.get("CUDA_HOME", "/usr/local/cuda") + "/include"
    for code in _cuda.DTYPE_CODE.values():
        opts = ["-arch=sm_90a", "--std=c++17", f"-I{kernels_dir() / 'include'}",
                f"-I{cuda_inc}", "-DDNNCTL_HEADERS=0x0", f"-DDNNCTL_DTYPE={code}"]
        ok, log = nvrtc_compile(kernels_dir() / "conv2d/transpose.cu", opts, [])
        assert ok, log


# ----------------------------------------------------------------------------- depthwise_planes


def _dw(n, c, h, stride=1, dtype="float32", layout="NCHW", **kw):
    return OP.problem(dict(n=n, c=c, h=h, w=h, k=c, r=3, s=3, stride=stride, pad=1, groups=c,
                           dtype=dtype, layout=layout, **kw))


def test_depthwise_planes_support_and_defaults():
    v = get_variant("conv2d", "cupy", "depthwise_planes")
    assert "multiplier" in v.supports(problem(3, "float32", "NCHW"), H200).reason  # k = 2c
    assert "NHWC" in v.supports(_dw(2, 32, 14, layout="NHWC"), H200).reason
    assert "48 KB" in v.supports(_dw(1, 32, 112), H200).reason  # 112x112 fp32 = 49 KB
    p = _dw(32, 576, 14)
    assert v.default_params(p, H200) == {"pb": 8, "threads": 256, "vec": 4}
    # 960 planes of 7x7: two per block keep 480 blocks in the grid, 128 threads for 98 outputs
    assert v.default_params(_dw(1, 960, 7), H200) == {"pb": 2, "threads": 128, "vec": 1}
    assert v.default_params(_dw(32, 144, 56, dtype="float16"), H200) == {
        "pb": 1, "threads": 256, "vec": 8}
    for prm in v.param_space(_dw(4, 96, 28, stride=2, dtype="bfloat16"), H200):
        assert prm["vec"] <= 8 and 4 * prm["pb"] * (28 * 28 + 9) <= 48 * 1024


def test_depthwise_planes_builds_compile_with_nvrtc():
    nvrtc_compile = nvrtc()
    import os

    rec = BuildRecorder()
    v = get_variant("conv2d", "cupy", "depthwise_planes")
    with _cuda.use_runtime(rec):
        for p in (_dw(32, 576, 14, stride=2), _dw(2, 24, 56, dtype="float16", bias=True),
                  _dw(1, 13, 9, dtype="bfloat16", residual=True)):
            for prm in (v.default_params(p, H200), list(v.param_space(p, H200))[-1]):
                v.build(p, prm, H200)
    cuda_inc = os.environ.get("CUDA_HOME", "/usr/local/cuda") + "/include"
    assert len(rec.builds) >= 4
    for src, defs in sorted(rec.builds):
        opts = ["-arch=sm_90a", "--std=c++17", f"-I{kernels_dir() / 'include'}",
                f"-I{cuda_inc}", "-DDNNCTL_HEADERS=0x0", *(f"-D{k}={v}" for k, v in defs)]
        ok, log = nvrtc_compile(kernels_dir() / src, opts, [])
        assert ok, f"{src} {defs}:\n{log}"


def test_default_heuristic_matches_the_logged_h200_winners():
    """Shapes of benchmarks/logs/2026-12-02-round2-conv.md whose measured winner was clear
    (batch 32, bias): the cost model picks the winning variant."""
    def pick(**key):
        return OP.default_choice(OP.problem(dict(key, bias=True)), "cupy", H200).variant

    r3 = dict(n=32, c=64, h=56, w=56, k=64, r=3, s=3, pad=1)
    # implicit_gemm_wgmma 43.6 us vs implicit_gemm 49.8 us
    assert pick(**r3, dtype="float16", layout="NHWC") == "implicit_gemm_wgmma"
    # nhwc_implicit_gemm (tf32) 135 us: the best of the row
    assert pick(**r3, dtype="float32", layout="NCHW", tf32=True) == "nhwc_implicit_gemm"
    one = dict(n=32, c=64, h=56, w=56, k=64, r=1, s=1)
    assert pick(**one, dtype="float32", layout="NCHW", tf32=True) == "gemm_1x1"  # 29.9 us
    dw = dict(n=32, c=576, h=14, w=14, k=576, r=3, s=3, pad=1, groups=576)
    assert pick(**dw, dtype="float32", layout="NCHW") == "depthwise_planes"  # 26.3 us
    assert pick(**dw, dtype="float16", layout="NHWC") == "depthwise"


