#!/usr/bin/env python3
"""Read bandwidth of batch_norm's NHWC channel reductions (fp16 64x56x56x256): sums of x
alone (the training forward's statistics) and of x and dy (the backward's), over tile width
(TX 16-byte lanes per row), loads in flight (U), block size and blocks per SM; the copy
bandwidth of the same tensor in the same run is the ceiling.

    python3 tools/nhwc_reduce_probe.py
"""
import itertools

import cupy as cp
import numpy as np

SRC = r'''
#include <cuda_fp16.h>
template<int BLOCK, int TX, int U, int TWO>
__global__ void __launch_bounds__(BLOCK) red(const uint4* __restrict__ x, const uint4* __restrict__ y,
    float* part, long long M, int CV) {
  // CV: 16-byte vectors per row; block covers TX vectors (tile blockIdx.y) x RB rows
  constexpr int RB = BLOCK / TX;
  const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
  const int cv = blockIdx.y * TX + tx;
  float s[8]; float q[8];
  for (int i = 0; i < 8; ++i) { s[i] = 0.f; q[i] = 0.f; }
  const long long stride = (long long)gridDim.x * RB;
  for (long long r0 = (long long)blockIdx.x * RB + ty; r0 < M; r0 += stride * U) {
    uint4 a[U], b[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      long long r = r0 + u * stride;
      if (r < M) { a[u] = __ldg(x + r * CV + cv); if (TWO) b[u] = __ldg(y + r * CV + cv); }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      long long r = r0 + u * stride;
      if (r < M) {
        const __half* h = reinterpret_cast<const __half*>(&a[u]);
        const __half* g = reinterpret_cast<const __half*>(&b[u]);
#pragma unroll
        for (int i = 0; i < 8; ++i) { float v = __half2float(h[i]); if (TWO) { float d = __half2float(g[i]); s[i] += d; q[i] += d * v; } else { s[i] += v; q[i] += v * v; } }
      }
    }
  }
  float t = 0.f; for (int i = 0; i < 8; ++i) t += s[i] + q[i];
  part[(blockIdx.y * gridDim.x + blockIdx.x) * BLOCK + threadIdx.x] = t;
}
'''
M, C = 64 * 56 * 56, 256
CV = C // 8
x = cp.random.standard_normal(M * C, dtype=cp.float32).astype(cp.float16)
y = cp.random.standard_normal(M * C, dtype=cp.float32).astype(cp.float16)
flush = cp.empty(256 << 20, dtype=cp.uint8)
sms = cp.cuda.Device().attributes["MultiProcessorCount"]
names = []
confs = []
for BLOCK, TX, U, TWO in itertools.product((256, 512), (8, 32), (1, 2, 4, 8), (0, 1)):
    names.append(f"red<{BLOCK},{TX},{U},{TWO}>")
    confs.append((BLOCK, TX, TWO))
mod = cp.RawModule(code=SRC, options=("-std=c++17",), name_expressions=names)
part = cp.empty((64 << 20) // 4, dtype=cp.float32)
def tm(f, n=15):
    ts = []
    for _ in range(n):
        flush.fill(1)
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        f()
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b) * 1e3)
    return sorted(ts)[n // 2]
# copy ceiling
dst = cp.empty_like(x)
tc = tm(lambda: cp.copyto(dst, x))
print(f"copy {x.nbytes/1e6:.0f} MB: {tc:.1f} us, {2*x.nbytes/tc/1e3:.0f} GB/s (r+w)")
res = []
for name, (BLOCK, TX, TWO) in zip(names, confs):
    k = mod.get_function(name)
    tiles = CV // TX
    for bps in (2, 4, 8):
        if BLOCK * bps > 2048:
            continue
        S = max(1, sms * bps // tiles)
        t = tm(lambda k=k, S=S, tiles=tiles, BLOCK=BLOCK: k(
            (S, tiles), (BLOCK,), (x, y, part, np.int64(M), np.int32(CV))))
        nb = x.nbytes * (2 if TWO else 1)
        res.append((TWO, nb / t / 1e3, t, name, bps))
for two in (0, 1):
    rs = sorted([r for r in res if r[0] == two], key=lambda r: -r[1])
    print(f"== {'x,dy' if two else 'x'} read")
    for r in rs[:8] + rs[-3:]:
        print(f"  {r[3]:22s} bps={r[4]}  {r[2]:7.1f} us  {r[1]:6.0f} GB/s")
    for tx in (8, 32):
        b = max((r for r in rs if f",{tx}," in r[3]), key=lambda r: r[1])
        print(f"  best TX={tx}: {b[3]} bps={b[4]} {b[1]:.0f} GB/s")
