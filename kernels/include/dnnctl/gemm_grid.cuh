// dnnctl GEMM grid: where one block of a tiled, batched, split-K GEMM works and where its
// results go. Grid: x = output tiles (grouped raster), z = batch * splits; split kz reduces
// k in [kz * kchunk, min(K, (kz + 1) * kchunk)). Shared by the matmul and convolution GEMMs.
// Include as <dnnctl/gemm_grid.cuh>.
#pragma once
#include <dnnctl/epilogue.cuh>

namespace dnnctl {

// Block -> (tile_m, tile_n), grouped by 8 tile rows so that blocks running together share
// A rows and B columns in L2.
__device__ __forceinline__ void tile_coords(int pid, int tiles_m, int tiles_n, int& tm,
                                            int& tn) {
  const int group = 8 * tiles_n;
  const int first_m = (pid / group) * 8;
  const int rows = min(tiles_m - first_m, 8);
  tm = first_m + (pid % group) % rows;
  tn = (pid % group) / rows;
}

// This block's batch bz and split kz, the origin (m0, n0) of its BM x BN tile, and its k
// range [k_begin, k_end): ktiles k-tiles of BK (none when the split is empty).
struct SplitKTile {
  int bz, kz, m0, n0, k_begin, k_end, ktiles;
};

template <int BM, int BN, int BK>
__device__ __forceinline__ SplitKTile split_k_tile(int M, int N, int K, int splits,
                                                   int kchunk) {
  SplitKTile t;
  t.bz = (int)blockIdx.z / splits;
  t.kz = (int)blockIdx.z % splits;
  int tm, tn;
  tile_coords((int)blockIdx.x, (M + BM - 1) / BM, (N + BN - 1) / BN, tm, tn);
  t.m0 = tm * BM;
  t.n0 = tn * BN;
  t.k_begin = t.kz * kchunk;
  t.k_end = min(K, t.k_begin + kchunk);
  t.ktiles = t.k_end > t.k_begin ? (t.k_end - t.k_begin + BK - 1) / BK : 0;
  return t;
}

// Offset of the block's fp32 slab of M x N partial sums in the split-K workspace: one slab
// per (split, batch) where every split keeps its own (OUT_PARTIAL, OUT_FUSED), one per batch
// where the splits add into it (OUT_ATOMIC).
template <int OUT_MODE>
__device__ __forceinline__ long long slab_offset(const SplitKTile& t, int batch, int M, int N) {
  const bool per_split = OUT_MODE == OUT_PARTIAL || OUT_MODE == OUT_FUSED;
  return (long long)(per_split ? t.kz * batch + t.bz : t.bz) * M * N;
}

// Sets the epilogue of one GEMM batch (fields: dnnctl/epilogue.cuh): output c at c_off with
// leading dimension ldc, bias at bias_off, residual at the output's index, fp32 slab at
// ws_off; pq and img_stride place the NCHW conv output (OUT_LAYOUT 1) only. (Filled in place:
// an Epilogue returned by value costs the mma kernels registers.)
template <class E, typename T>
__device__ __forceinline__ void init_epilogue(E& e, T* c, const T* bias, const T* res,
                                              float* ws, int m, int n, long long ldc,
                                              long long c_off, long long bias_off,
                                              long long ws_off, long long pq = 1,
                                              long long img_stride = 0) {
  e = E{c, bias, res, ws, m, n, ldc, c_off, bias_off, ws_off, pq, img_stride};
}

}  // namespace dnnctl
