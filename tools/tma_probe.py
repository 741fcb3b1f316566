#!/usr/bin/env python3
"""Can an NVRTC kernel launched through CuPy use Hopper TMA? (dev tool, needs an sm_90 GPU)

    PYTHONPATH=. python3 tools/tma_probe.py

Steps, each reported: (1) cuTensorMapEncodeTiled from cuda-bindings (``cuda.bindings.driver``)
encodes a 2-D tensor map over a CuPy buffer; (2) the 128-byte map is copied to device memory
and a kernel reads a 64 x 64 fp16 box with cp.async.bulk.tensor through a pointer to it
(fence.proxy.tensormap before use); (3) the map is passed by value as a __grid_constant__
parameter (a NumPy structured scalar as the CuPy argument); (4) the same through dnnctl's own
path (dnnctl.backends.tma.encode by ctypes, dnnctl.backends.cuda.Launch passing the map by
value), which the wgmma_tma matmul uses. Prints one line per step.
"""

from __future__ import annotations

import numpy as np

SRC = r"""
#include <cuda_fp16.h>
struct __align__(64) TMap { unsigned long long opaque[16]; };

__device__ void tma_box(const void* map, __half* out, int c0, int c1) {
  __shared__ __align__(128) __half tile[64 * 64];
  __shared__ __align__(8) unsigned long long bar;
  const unsigned b = (unsigned)__cvta_generic_to_shared(&bar);
  const unsigned t = (unsigned)__cvta_generic_to_shared(tile);
  if (threadIdx.x == 0) {
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" :: "l"(map) : "memory");
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(b));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(b), "r"(8192));
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];" :: "r"(t), "l"(map), "r"(c0), "r"(c1), "r"(b)
                 : "memory");
  }
  asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n"
               " @!p bra W;\n}" :: "r"(b) : "memory");
  for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) out[i] = tile[i];
}

extern "C" __global__ void tma_global(const TMap* map, __half* out) { tma_box(map, out, 64, 128); }
extern "C" __global__ void tma_param(const __grid_constant__ TMap map, __half* out) {
  tma_box(&map, out, 64, 128);
}
"""


def main() -> int:
    import cupy as cp

    try:
        from cuda.bindings import driver as cu
    except ImportError as exc:
        print(f"1 encode: cuda-bindings not importable ({exc})")
        return 1
    rows, cols = 512, 256
    src = cp.arange(rows * cols, dtype=cp.float32).reshape(rows, cols).astype(cp.float16)
    want = cp.asnumpy(src[128:192, 64:128])
    u64, u32 = cu.cuuint64_t, cu.cuuint32_t  # plain ints are refused (TypeError)
    res = cu.cuTensorMapEncodeTiled(
        cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, src.data.ptr,
        [u64(cols), u64(rows)], [u64(cols * 2)], [u32(64), u32(64)], [u32(1), u32(1)],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    err, tmap = res[0], res[1]
    words = np.array([int(x) for x in tmap.opaque], dtype=np.uint64)
    print(f"1 encode: {err}, {words.size} words")
    mod = cp.RawModule(code=SRC, options=("-arch=sm_90a", "--std=c++17"))
    out = cp.zeros((64, 64), dtype=cp.float16)
    try:
        dmap = cp.asarray(words)
        mod.get_function("tma_global")((1,), (128,), (dmap, out))
        cp.cuda.runtime.deviceSynchronize()
        print(f"2 global-memory map: box equal = {bool((cp.asnumpy(out) == want).all())}")
    except Exception as exc:  # a probe: report and go on
        print(f"2 global-memory map: {type(exc).__name__}: {exc}"[:300])
    out.fill(0)
    try:
        scalar = np.zeros((), dtype=np.dtype([("opaque", np.uint64, (16,))], align=True))
        scalar["opaque"] = words
        mod.get_function("tma_param")((1,), (128,), (scalar[()], out))
        cp.cuda.runtime.deviceSynchronize()
        print(f"3 __grid_constant__ map: box equal = {bool((cp.asnumpy(out) == want).all())}")
    except Exception as exc:
        print(f"3 __grid_constant__ map: {type(exc).__name__}: {exc}"[:300])
    out.fill(0)
    try:  # the path the wgmma_tma kernels use: ctypes encoder + Launch's by-value slot
        from dnnctl.backends import cuda as seam
        from dnnctl.backends import tma

        spec = tma.MapSpec("float16", (cols, rows), (cols * 2,), (64, 64), tma.SWIZZLE_NONE)
        seam.launch(mod, "tma_param", 1, 128)((tma.encode(spec, src.data.ptr), out))
        cp.cuda.runtime.deviceSynchronize()
        print(f"4 dnnctl encoder + Launch: box equal = {bool((cp.asnumpy(out) == want).all())}")
    except Exception as exc:
        print(f"4 dnnctl encoder + Launch: {type(exc).__name__}: {exc}"[:300])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
