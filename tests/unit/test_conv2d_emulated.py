"""conv2d CUDA variants run end to end on the CPU: the real kernels/conv2d/*.cu compiled by g++
against a small CUDA shim (one std::thread per CUDA thread, __syncthreads as a barrier,
__shared__ as block-wide statics), launched through each variant's own build() with the
exact grids and argument lists used on the GPU; cuBLAS and cuFFT replaced by numpy
implementations of their documented semantics (column-major strided-batched GEMM,
cufftPlanMany advanced layout). Checked against the float64 reference with poisoned outputs.

Skipped where g++ (C++20) or CUDA's cuda_fp16.h is unavailable, or with DNNCTL_EMU_TESTS=0.
About 20 s on a cold compile cache, 2 s warm.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from dnnctl.backends.base import DeviceInfo
from dnnctl.backends.registry import get_backend
from dnnctl.ops.base import rel_norm_error
from dnnctl.ops.check import check_variant
from dnnctl.ops.conv2d import _cuda
from dnnctl.ops.conv2d.op import default_params, geometry
from dnnctl.ops.registry import get_op, get_variant
from dnnctl.resources import kernels_dir

OP = get_op("conv2d")
DEV = DeviceInfo(backend="cupy", index=0, name="H200 (emulated)", compute_capability="9.0",
                 sm_count=132, smem_per_block_optin=232448)
CACHE = Path(tempfile.gettempdir()) / "dnnctl_conv2d_emu"

SHIM = r"""
#pragma once
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>
struct emu_dim3 { unsigned x, y, z; };
extern thread_local emu_dim3 threadIdx, blockIdx;
extern emu_dim3 blockDim, gridDim;
extern std::barrier<>* emu_bar;
inline void __syncthreads() { emu_bar->arrive_and_wait(); }
inline float __expf(float x) { return std::exp(x); }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
namespace emu {
template <typename... A, size_t... I>
void call(void (*k)(A...), void** argv, std::index_sequence<I...>) {
  k(*reinterpret_cast<std::remove_reference_t<A>*>(argv[I])...);
}
template <typename... A>
void launch(void (*k)(A...), const unsigned* g, const unsigned* b, void** argv) {
  gridDim = {g[0], g[1], g[2]};
  blockDim = {b[0], b[1], b[2]};
  const unsigned nt = b[0] * b[1] * b[2];
  std::barrier<> bar(nt);
  emu_bar = &bar;
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < nt; ++t)
    ts.emplace_back([=, &bar] {
      threadIdx = {t % b[0], (t / b[0]) % b[1], t / (b[0] * b[1])};
      for (unsigned z = 0; z < g[2]; ++z)
        for (unsigned y = 0; y < g[1]; ++y)
          for (unsigned x = 0; x < g[0]; ++x) {
            blockIdx = {x, y, z};
            call(k, argv, std::index_sequence_for<A...>{});
            bar.arrive_and_wait();  // a block ends before the next starts
          }
    });
  for (auto& th : ts) th.join();
}
template <typename... A>
int sizes(void (*)(A...), int* out) {
  int i = 0;
  if (out) ((out[i++] = (int)sizeof(std::remove_reference_t<A>)), ...);
  return (int)sizeof...(A);
}
}  // namespace emu
"""


def _cuda_include() -> Path | None:
    for base in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", "/usr"):
        if base and (Path(base) / "include" / "cuda_fp16.h").is_file():
            return Path(base) / "include"
    return None


def _toolchain() -> Path:
    if os.environ.get("DNNCTL_EMU_TESTS") == "0":
        pytest.skip("CPU-emulator kernel tests switched off (DNNCTL_EMU_TESTS=0)")
    inc = _cuda_include()
    if shutil.which("g++") is None or inc is None:
        pytest.skip("needs g++ and CUDA's cuda_fp16.h for the CPU emulation")
    return inc


class EmuFunction:
    def __init__(self, lib: ctypes.CDLL, name: str):
        self.fn = getattr(lib, f"emu_launch_{name}")
        count = getattr(lib, f"emu_sizes_{name}")
        sizes = (ctypes.c_int * count(None))()
        count(sizes)
        self.sizes, self.name = list(sizes), name

    def __call__(self, grid, block, args, shared_mem=0):
        grid = tuple(int(v) for v in grid) + (1,) * (3 - len(grid))
        block = tuple(int(v) for v in block) + (1,) * (3 - len(block))
        assert len(args) == len(self.sizes), f"{self.name}: {len(args)} args"
        assert grid[1] <= 65535 and grid[2] <= 65535 and min(grid) >= 1, grid
        assert 1 <= block[0] * block[1] * block[2] <= 1024, block
        keep, argv = [], (ctypes.c_void_p * len(args))()
        for i, (a, size) in enumerate(zip(args, self.sizes)):
            if isinstance(a, np.ndarray):
                assert size == 8, f"{self.name} arg {i}: array for a {size}-byte parameter"
                keep.append(ctypes.c_void_p(a.__array_interface__["data"][0]))
            else:  # numpy scalars only: CuPy would have to guess a Python number's C type
                assert isinstance(a, np.generic) and a.nbytes == size, (self.name, i, a)
                keep.append(ctypes.create_string_buffer(a.tobytes()))
            argv[i] = ctypes.addressof(keep[-1])
        self.fn((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), argv)


class EmulatedRuntime:
    """The CudaRuntime interface over numpy arrays and g++-compiled kernels."""

    xp = np

    def __init__(self, cuda_inc: Path):
        self.inc = cuda_inc
        CACHE.mkdir(parents=True, exist_ok=True)
        (CACHE / "emu_shim.h").write_text(SHIM)

    def function(self, source, defines, name):
        path = kernels_dir() / source
        defs = [f"-D{k}={int(v) if isinstance(v, bool) else v}" for k, v in
                sorted(defines.items())]
        text = SHIM + path.read_text() + "".join(
            p.read_text() for p in sorted((kernels_dir() / "include").rglob("*.cuh")))
        key = hashlib.sha256((text + name + " ".join(defs)).encode()).hexdigest()[:16]
        so = CACHE / f"{path.stem}-{name}-{key}.so"
        if not so.exists():
            cpp = so.with_suffix(f".{os.getpid()}.cpp")
            cpp.write_text(
                f'#include "emu_shim.h"\n#include "{path}"\n'
                "thread_local emu_dim3 threadIdx, blockIdx; emu_dim3 blockDim, gridDim;\n"
                "std::barrier<>* emu_bar;\n"
                f'extern "C" void emu_launch_{name}(const unsigned* g, const unsigned* b, '
                f"void** a) {{ emu::launch(&{name}, g, b, a); }}\n"
                f'extern "C" int emu_sizes_{name}(int* o) {{ return emu::sizes(&{name}, o); }}\n')
            cmd = ["g++", "-std=c++20", "-O0", "-shared", "-fPIC", "-pthread", "-w",
                   f"-I{CACHE}", f"-I{kernels_dir() / 'include'}", f"-I{self.inc}",
                   "-DDNNCTL_HEADERS=0", *defs, str(cpp), "-o", f"{so}.{os.getpid()}.tmp"]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode:
                if "barrier" in res.stderr and "No such file" in res.stderr:
                    pytest.skip("g++ without C++20 <barrier>")
                raise AssertionError(f"g++ failed for {source} {defs}:\n{res.stderr[-4000:]}")
            os.replace(f"{so}.{os.getpid()}.tmp", so)
        return EmuFunction(ctypes.CDLL(str(so)), name)

    def ptr(self, arr):
        return arr.__array_interface__["data"][0]

    @staticmethod
    def _cm(arr, off, rows, cols, ld):  # column-major view, bounds checked as cuBLAS needs
        flat = arr.reshape(-1)
        assert ld >= max(1, rows) and off >= 0
        assert off + rows - 1 + (cols - 1) * ld < flat.size, "GEMM operand out of bounds"
        return np.lib.stride_tricks.as_strided(flat[off:], (rows, cols),
                                               (flat.itemsize, ld * flat.itemsize))

    def gemm(self, ta, tb, m, n, k, a, a_off, lda, sa, b, b_off, ldb, sb, c, c_off, ldc, sc,
             batch, compute, beta=0.0):
        assert a.dtype == b.dtype and compute in (_cuda.CUBLAS_COMPUTE_32F,
                                                  _cuda.CUBLAS_COMPUTE_32F_FAST_TF32)
        op = {0: lambda x: x, 1: lambda x: x.T, 2: lambda x: x.conj().T}
        acc = np.complex128 if c.dtype == np.complex64 else np.float64
        for i in range(batch):
            A = self._cm(a, a_off + i * sa, *((m, k) if ta == 0 else (k, m)), lda).astype(acc)
            B = self._cm(b, b_off + i * sb, *((k, n) if tb == 0 else (n, k)), ldb).astype(acc)
            view = self._cm(c, c_off + i * sc, m, n, ldc)
            prev = view.astype(acc) * beta if beta else 0.0
            view[...] = (op[ta](A) @ op[tb](B) + prev).astype(c.dtype)

    def fft_plan(self, shape, inembed, istride, idist, onembed, ostride, odist, kind, batch):
        return dict(shape=shape, inembed=inembed, istride=istride, idist=idist,
                    onembed=onembed, ostride=ostride, odist=odist, kind=kind, batch=batch)

    def fft_exec(self, plan, src, dst, direction):
        n0, n1 = plan["shape"]
        fwd = plan["kind"] == _cuda.CUFFT_R2C
        ishape = (n0, n1) if fwd else (n0, n1 // 2 + 1)
        oshape = (n0, n1 // 2 + 1) if fwd else (n0, n1)

        def index(dims, embed, stride, dist):
            y, x = np.meshgrid(np.arange(dims[0]), np.arange(dims[1]), indexing="ij")
            b = np.arange(plan["batch"])[:, None, None]
            return b * dist + (y * embed[1] + x) * stride

        data = src.reshape(-1)[index(ishape, plan["inembed"], plan["istride"], plan["idist"])]
        if fwd:
            out = np.fft.rfft2(data.astype(np.float64))
        else:  # cuFFT's inverse is unnormalized
            out = np.fft.irfft2(data.astype(np.complex128), s=(n0, n1)) * (n0 * n1)
        oidx = index(oshape, plan["onembed"], plan["ostride"], plan["odist"])
        assert oidx.max() < dst.size and np.unique(oidx).size == oidx.size
        dst.reshape(-1)[oidx] = out.astype(dst.dtype)


@pytest.fixture(scope="module")
def runtime():
    return EmulatedRuntime(_toolchain())


CASES = [
    ("direct", dict(n=2, c=6, h=8, w=9, k=10, r=3, s=3, dilation=2, pad=[2, 1, 0, 2],
                    groups=2, bias=True, activation="gelu"), "float16", "NHWC"),
    ("direct", dict(n=1, c=5, h=9, w=7, k=3, r=3, s=2, stride=2, pad=1, residual=True),
     "float32", "NCHW"),
    ("depthwise", dict(n=2, c=8, h=11, w=7, k=16, r=3, s=3, stride=2, pad=[1, 0, 0, 1],
                       groups=8, bias=True, activation="relu"), "float16", "NHWC"),
    ("depthwise", dict(n=1, c=16, h=9, w=10, k=16, r=5, s=5, pad=2, groups=16,
                       residual=True, activation="silu"), "bfloat16", "NCHW"),
    ("depthwise_planes", dict(n=3, c=5, h=7, w=6, k=5, r=3, s=3, stride=2, pad=[1, 0, 0, 1],
                              groups=5, bias=True, activation="relu"), "float32", "NCHW"),
    ("depthwise_planes", dict(n=2, c=7, h=6, w=8, k=7, r=5, s=3, pad=[2, 1], dilation=[1, 2],
                              groups=7, residual=True, activation="silu"), "float16", "NCHW"),
    ("im2col_gemm", dict(n=3, c=8, h=6, w=5, k=12, r=3, s=3, pad=1, groups=2, bias=True),
     "bfloat16", "NHWC"),
    ("im2col_gemm", dict(n=2, c=9, h=5, w=6, k=7, r=1, s=1, residual=True,
                         activation="relu"), "float32", "NCHW"),
    ("winograd", dict(n=2, c=5, h=9, w=7, k=6, r=3, s=3, pad=[1, 0, 2, 1], bias=True),
     "float16", "NCHW"),
    ("winograd", dict(n=1, c=8, h=10, w=11, k=4, r=3, s=3, pad=1, residual=True, tf32=True),
     "float32", "NHWC"),
    ("fft", dict(n=2, c=4, h=9, w=8, k=6, r=4, s=3, dilation=[1, 2], pad=[2, 1, 1, 2],
                 groups=2, bias=True, activation="relu"), "float32", "NCHW"),
    ("fft", dict(n=1, c=3, h=12, w=11, k=5, r=5, s=5, stride=2, pad=2, residual=True),
     "float16", "NHWC"),
    # MobileNetV2 / V3 epilogues: conv (BN folded) + relu6 / hardswish
    ("depthwise", dict(n=2, c=16, h=9, w=8, k=16, r=3, s=3, stride=2, pad=1, groups=16,
                       bias=True, activation="relu6"), "float16", "NHWC"),
    ("direct", dict(n=1, c=6, h=7, w=8, k=9, r=3, s=3, pad=1, bias=True,
                    activation="hardswish"), "float32", "NCHW"),
    ("im2col_gemm", dict(n=2, c=8, h=5, w=6, k=12, r=1, s=1, bias=True, activation="relu6"),
     "float16", "NHWC"),
    # the vectorized stand-alone epilogue: 8 channels per access (NHWC K % 8 == 0), 8 pixels
    # of one channel (NCHW P*Q % 8 == 0)
    ("im2col_gemm", dict(n=2, c=8, h=5, w=3, k=16, r=3, s=3, pad=1, bias=True,
                         residual=True, activation="silu"), "float16", "NHWC"),
    ("im2col_gemm", dict(n=2, c=6, h=4, w=6, k=5, r=3, s=3, pad=1, bias=True,
                         residual=True, activation="gelu"), "bfloat16", "NCHW"),
    # act(conv + bias + residual), a ResNet block's end: the run-time flag of every kernel
    # with the shared epilogue, and the stand-alone epilogue (vector and scalar)
    *[(name, dict(key, residual=True, residual_before_act=True), dtype, layout)
      for name, key, dtype, layout in (
          ("direct", dict(n=1, c=5, h=9, w=7, k=3, r=3, s=2, stride=2, pad=1,
                          activation="relu"), "float32", "NCHW"),
          ("depthwise", dict(n=2, c=8, h=11, w=7, k=8, r=3, s=3, pad=1, groups=8, bias=True,
                             activation="relu6"), "float16", "NHWC"),
          ("depthwise_planes", dict(n=2, c=7, h=6, w=8, k=7, r=3, s=3, pad=1, groups=7,
                                    activation="silu"), "float16", "NCHW"),
          ("im2col_gemm", dict(n=2, c=8, h=5, w=3, k=16, r=3, s=3, pad=1, bias=True,
                               activation="relu"), "float16", "NHWC"),
          ("im2col_gemm", dict(n=2, c=9, h=5, w=6, k=7, r=1, s=1, bias=True,
                               activation="gelu"), "float32", "NCHW"),
          ("winograd", dict(n=2, c=5, h=9, w=7, k=6, r=3, s=3, pad=1, bias=True,
                            activation="relu"), "float16", "NCHW"),
          ("fft", dict(n=1, c=3, h=12, w=11, k=5, r=5, s=5, pad=2, activation="silu"),
           "float32", "NCHW"),
      )],
]


@pytest.mark.parametrize(("name", "key", "dtype", "layout"), CASES,
                         ids=[f"{c[0]}-{c[2]}-{c[3]}" for c in CASES])
def test_cuda_variant_on_cpu_emulation(runtime, name, key, dtype, layout):
    variant = get_variant("conv2d", "cupy", name)
    problem = OP.problem(dict(key, dtype=dtype, layout=layout))
    assert variant.supports(problem, DEV)
    space = list(variant.param_space(problem, DEV))
    picks = [variant.default_params(problem, DEV), space[len(space) // 2]]
    be = get_backend("numpy")
    with _cuda.use_runtime(runtime):
        for params in picks:
            res = check_variant(OP, problem, variant, params, be, DEV, seed=11)
            assert res.ok, f"{name}{params} {problem.short()}: {res.detail}"


# ----------------------------------------------------------------------------- nhwc_implicit_gemm

ROOT = Path(__file__).resolve().parents[2]

NHWC_CASES = [
    (dict(n=2, c=12, h=7, w=6, k=20, r=3, s=3, stride=2, pad=[1, 0, 1, 2], bias=True,
          residual=True, activation="relu"), "float16",
     dict(bm=32, bn=32, bk=32, warps=4, stages=3, splitk=1)),
    (dict(n=1, c=40, h=5, w=4, k=33, r=3, s=3, pad=1, groups=1, residual=True, tf32=True),
     "float32",
     dict(bm=16, bn=64, bk=32, warps=4, stages=2, splitk=2)),
    (dict(n=2, c=3, h=11, w=13, k=8, r=7, s=7, stride=2, pad=3, bias=True), "float32",
     None),
]


@pytest.mark.parametrize(("key", "dtype", "params"), NHWC_CASES,
                         ids=[f"{c[1]}-{i}" for i, c in enumerate(NHWC_CASES)])
def test_nhwc_implicit_gemm_on_cpu_emulation(runtime, monkeypatch, key, dtype, params):
    """Transposes (this file's emulation) around implicit_gemm (tools/cuda_emu)."""
    if not (ROOT / "tools" / "cuda_emu").is_dir():
        pytest.skip("tools/cuda_emu not available")
    from dnnctl.backends import registry as base

    monkeypatch.syspath_prepend(str(ROOT))
    from tools.cuda_emu.emu import EmuBackend

    emu = EmuBackend()
    monkeypatch.setitem(base._BACKENDS, "cupy", emu)
    variant = get_variant("conv2d", "cupy", "nhwc_implicit_gemm")
    problem = OP.problem(dict(key, dtype=dtype, layout="NCHW"))
    assert variant.supports(problem, DEV)
    params = params or variant.default_params(problem, DEV)
    assert variant.check_params(params) is None and variant.valid_params(problem, params, DEV)
    with _cuda.use_runtime(runtime):
        res = check_variant(OP, problem, variant, params, emu, DEV, seed=5)
    assert res.ok, f"{params} {problem.short()}: {res.detail}"
    assert res.max_rel_err < OP.tolerance(problem, "y") / 2


@pytest.mark.parametrize("params", [dict(pb=4, threads=128, vec=2),
                                    dict(pb=16, threads=128, vec=1)])
def test_depthwise_planes_blocks_span_images(runtime, params):
    """15 planes (3 images x 5 channels): blocks start mid-image, the last one is partial,
    and with pb=16 one block holds every plane (channel index wraps twice)."""
    variant = get_variant("conv2d", "cupy", "depthwise_planes")
    problem = OP.problem(dict(n=3, c=5, h=6, w=6, k=5, r=3, s=3, pad=1, groups=5, bias=True,
                              residual=True, dtype="float32", layout="NCHW"))
    assert variant.valid_params(problem, params, DEV)
    with _cuda.use_runtime(runtime):
        res = check_variant(OP, problem, variant, params, get_backend("numpy"), DEV, seed=3)
    assert res.ok, f"{params}: {res.detail}"


# ----------------------------------------------------------------------------- backward

BWD_SHAPES = [
    dict(n=2, c=6, h=9, w=8, k=4, r=3, s=3, stride=2, pad=[1, 0, 2, 1]),  # stride 2, asym
    dict(n=1, c=4, h=7, w=9, k=6, r=3, s=2, dilation=2, pad=2, groups=2),  # dilation, g=2
    dict(n=2, c=6, h=7, w=5, k=12, r=3, s=3, stride=2, pad=1, groups=6),  # depthwise x2
    dict(n=1, c=5, h=6, w=7, k=3, r=1, s=1),  # 1x1 identity: the GEMM alone
    dict(n=3, c=5, h=5, w=6, k=7, r=1, s=1, stride=2),  # 1x1 stride 2: phases with no tap
]
BWD_CASES = [(name, i, dtype, layout)
             for name, dw_only in (("dgrad_direct", False), ("wgrad_direct", False),
                                   ("dgrad_depthwise", True), ("wgrad_depthwise", True),
                                   ("dgrad_im2col_gemm", False), ("wgrad_im2col_gemm", False))
             for i, shape in enumerate(BWD_SHAPES)
             if (shape.get("groups", 1) == shape["c"]) == dw_only
             for dtype, layout in (("float32", "NCHW"), ("float16", "NHWC"),
                                   ("bfloat16", "NCHW"))]


@pytest.mark.parametrize(("name", "shape", "dtype", "layout"), BWD_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}" for c in BWD_CASES])
def test_cuda_backward_variant_on_cpu_emulation(runtime, name, shape, dtype, layout):
    """Every CUDA dgrad / wgrad variant (db included) on stride 2, dilation 2, groups 1 / 2 /
    C, odd sizes and N=1, at its default parameters and at a chunked / split setting."""
    which = name.split("_")[0]
    variant = get_variant("conv2d", "cupy", name)
    key = dict(BWD_SHAPES[shape], dtype=dtype, layout=layout, bias=which == "wgrad",
               **{"pass": which})
    problem = OP.problem(key)
    assert variant.supports(problem, DEV), variant.supports(problem, DEV).reason
    space = list(variant.param_space(problem, DEV))
    first = default_params(variant, problem, DEV)
    picks = [first] + [p for p in space[1:2] if p != first]
    with _cuda.use_runtime(runtime):
        for params in picks:
            res = check_variant(OP, problem, variant, params, get_backend("numpy"), DEV,
                                seed=shape)
            assert res.ok, f"{name}{params} {problem.short()}: {res.detail}"


@contextlib.contextmanager
def _split(rows_per_chunk: int):
    """The column sums' row split fixed at ``rows_per_chunk`` (small inputs, several chunks)."""
    old = _cuda.colsum_split
    _cuda.colsum_split = lambda rows, cols: (rows_per_chunk, -(-rows // rows_per_chunk))
    try:
        yield
    finally:
        _cuda.colsum_split = old


def test_colsum_split_fills_the_gpu_and_depends_on_the_shape_alone():
    for rows, cols in ((12608, 768), (12608, 3072), (64 * 56 * 56, 64), (7, 5), (1, 4096)):
        per, chunks = _cuda.colsum_split(rows, cols)
        assert per % 8 == 0 and per >= _cuda.COLSUM_MIN_ROWS
        assert (chunks - 1) * per < rows <= chunks * per
        if rows >= 64 * _cuda.COLSUM_MIN_ROWS:  # big enough: about COLSUM_BLOCKS blocks
            assert chunks * -(-cols // 32) >= _cuda.COLSUM_BLOCKS * 0.9
    assert _cuda.colsum_split(12608, 768) == (296, 43)


@pytest.mark.parametrize(("layout", "hw"), [("NCHW", (1, 3)), ("NHWC", (1, 3)),
                                            ("NCHW", (5, 4)), ("NHWC", (7, 6))])
def test_conv_bias_grad_walks_rows_across_images_on_cpu_emulation(runtime, layout, hw):
    """db = dy summed over N*P*Q (kernels/conv2d/bias_grad.cu through BiasGrad), in chunks
    that cut images apart and run the unrolled loop and the tail; P*Q below the block's 8
    row lanes (one step of a lane crosses several images) and above; both layouts."""
    from dnnctl.ops.conv2d.cuda_backward import BiasGrad

    h, w = hw
    n, k = 24, 40
    g = geometry(OP.problem(dict(n=n, c=8, h=h, w=w, k=k, r=1, s=1, dtype="float16",
                                 layout=layout, bias=True, **{"pass": "wgrad"})))
    dy = np.random.default_rng(7).standard_normal(
        (n, h, w, k) if layout == "NHWC" else (n, k, h, w)).astype(np.float16)
    with _split(67), _cuda.use_runtime(runtime):
        grad = BiasGrad(runtime, g)
        partial = np.zeros(grad.chunks * k, np.float32)
        db = np.zeros(k, np.float16)
        grad(dy, db, partial)
    assert grad.chunks == -(-n * h * w // 67) > 1
    want = dy.astype(np.float64).sum(axis=(0, 1, 2) if layout == "NHWC" else (0, 2, 3))
    assert rel_norm_error(db.astype(np.float64), want) < 4e-3


@pytest.mark.parametrize("activation", ["none", "relu", "gelu", "silu"])
def test_matmul_backward_prepass_on_cpu_emulation(runtime, activation):
    """kernels/conv2d/bias_grad.cu as matmul_backward's fused pre-pass: dy * act'(pre) and
    the column sums (several row chunks, each running the unrolled loop and its tail; a
    column tail past 32) against float64."""
    import ml_dtypes

    from dnnctl.ops.matmul import backward as mb
    from dnnctl.ops.matmul.op import activation_ref

    rng = np.random.default_rng(4)
    m, n = 2 * 67 + 5, 45
    dy = rng.standard_normal((m, n)).astype(ml_dtypes.bfloat16)
    pre = rng.standard_normal((m, n)).astype(ml_dtypes.bfloat16)
    with _split(67), _cuda.use_runtime(runtime):  # three chunks, the last partial
        dyp, dbias = mb._prepass_cuda(dy, pre, activation, True, np)
    p64 = pre.astype(np.float64)
    h = 1e-6
    deriv = (activation_ref(p64 + h, activation) - activation_ref(p64 - h, activation)) / (2 * h)
    want = dy.astype(np.float64) * deriv
    assert rel_norm_error(dyp.astype(np.float64), want) < 8e-3
    assert rel_norm_error(dbias.astype(np.float64), want.sum(axis=0)) < 8e-3
