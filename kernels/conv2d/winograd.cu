// conv2d "winograd" F(m x m, 3 x 3), m = TILE in {2, 4}, alpha = m + 2 (Lavin & Gray 2015):
//   y_tile = A^T [ (G g G^T) .* (B^T d B) ] A
// computed as filter transform -> input transform -> alpha^2 batched GEMMs (cuBLAS, over C)
// -> output transform with the fused epilogue. Transforms are computed in fp32; U and V are
// stored as uv_t (fp32, or the I/O type when UV_FP32 == 0), the GEMM result M is fp32.
//
// Orientation follows the layout so every pass is coalesced:
//   NHWC: U[a][K][C], V[a][T][C], M[a][T][K] = V U^T  (threads run along channels)
//   NCHW: U[a][K][C], V[a][C][T], M[a][K][T] = U V    (threads run along tiles)
// with a = alpha*alpha transform positions and T = nc * tiles_h * tiles_w tiles of the chunk
// of images n0 .. n0 + nc - 1.
// Defines: DNNCTL_DTYPE, NHWC (0/1), TILE (2/4), UV_FP32 (0/1), TF32_RN (0/1).
#include <dnnctl/conv_layout.cuh>

using namespace dnnctl;

#ifndef TILE
#define TILE 2
#endif
#ifndef UV_FP32
#define UV_FP32 1
#endif
#define ALPHA (TILE + 2)

#if UV_FP32
typedef float uv_t;
#else
typedef elem_t uv_t;
#endif

// ---- transform matrices
// out = L in L^T for L (ROWS x N) and in (N x N), in fp32: every transform has this form.
template <int ROWS, int N>
__device__ __forceinline__ void sandwich(const float (&L)[ROWS][N], const float (&in)[N][N],
                                         float (&out)[ROWS][ROWS]) {
  float t[ROWS][N];
#pragma unroll
  for (int i = 0; i < ROWS; ++i)
#pragma unroll
    for (int j = 0; j < N; ++j) {
      float acc = 0.f;
#pragma unroll
      for (int k = 0; k < N; ++k) acc += L[i][k] * in[k][j];
      t[i][j] = acc;
    }
#pragma unroll
  for (int i = 0; i < ROWS; ++i)
#pragma unroll
    for (int j = 0; j < ROWS; ++j) {
      float acc = 0.f;
#pragma unroll
      for (int k = 0; k < N; ++k) acc += t[i][k] * L[j][k];
      out[i][j] = acc;
    }
}

__device__ __forceinline__ void filter_tf(const float (&g)[3][3], float (&u)[ALPHA][ALPHA]) {
#if TILE == 2
  const float G[4][3] = {{1.f, 0.f, 0.f}, {.5f, .5f, .5f}, {.5f, -.5f, .5f}, {0.f, 0.f, 1.f}};
#else
  const float G[6][3] = {{1.f / 4, 0.f, 0.f},
                         {-1.f / 6, -1.f / 6, -1.f / 6},
                         {-1.f / 6, 1.f / 6, -1.f / 6},
                         {1.f / 24, 1.f / 12, 1.f / 6},
                         {1.f / 24, -1.f / 12, 1.f / 6},
                         {0.f, 0.f, 1.f}};
#endif
  sandwich(G, g, u);
}

__device__ __forceinline__ void input_tf(const float (&d)[ALPHA][ALPHA], float (&v)[ALPHA][ALPHA]) {
#if TILE == 2
  const float BT[4][4] = {{1.f, 0.f, -1.f, 0.f}, {0.f, 1.f, 1.f, 0.f}, {0.f, -1.f, 1.f, 0.f},
                          {0.f, 1.f, 0.f, -1.f}};
#else
  const float BT[6][6] = {{4.f, 0.f, -5.f, 0.f, 1.f, 0.f},  {0.f, -4.f, -4.f, 1.f, 1.f, 0.f},
                          {0.f, 4.f, -4.f, -1.f, 1.f, 0.f}, {0.f, -2.f, -1.f, 2.f, 1.f, 0.f},
                          {0.f, 2.f, -1.f, -2.f, 1.f, 0.f}, {0.f, 4.f, 0.f, -5.f, 0.f, 1.f}};
#endif
  sandwich(BT, d, v);
}

__device__ __forceinline__ void output_tf(const float (&m)[ALPHA][ALPHA], float (&o)[TILE][TILE]) {
#if TILE == 2
  const float AT[2][4] = {{1.f, 1.f, 1.f, 0.f}, {0.f, 1.f, -1.f, -1.f}};
#else
  const float AT[4][6] = {{1.f, 1.f, 1.f, 1.f, 1.f, 0.f},
                          {0.f, 1.f, -1.f, 2.f, -2.f, 0.f},
                          {0.f, 1.f, 1.f, 4.f, 4.f, 0.f},
                          {0.f, 1.f, -1.f, 8.f, -8.f, 1.f}};
#endif
  sandwich(AT, m, o);
}

// TF32_RN: the GEMM will run on TF32 tensor cores; store U and V already rounded to TF32
// (nearest, ties away, as cvt.rna) so whatever conversion the GEMM applies is exact.
#ifndef TF32_RN
#define TF32_RN 0
#endif
__device__ __forceinline__ uv_t to_uv(float v) {
#if TF32_RN
  unsigned u = __float_as_uint(v);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  v = __uint_as_float(u);
#endif
  return from_float<uv_t>(v);
}

// Element e of a transform's grid of T tiles (of the chunk) x CH channels -> its channel ch and
// tile t: channels fastest in NHWC, tiles fastest in NCHW (threads stay coalesced).
__device__ __forceinline__ void grid_split(long long e, long long T, int CH, int& ch,
                                           long long& t) {
#if NHWC
  t = e / CH;
  ch = (int)(e - t * CH);
#else
  ch = (int)(e / T);
  t = e - (long long)ch * T;
#endif
}

// Tile t of the chunk -> its image nl in the chunk and its tile row / column (ty, tx).
__device__ __forceinline__ void tile_place(long long t, int tiles, int tiles_w, int& nl, int& ty,
                                           int& tx) {
  nl = (int)(t / tiles);
  const int tr = (int)(t - (long long)nl * tiles);
  ty = tr / tiles_w;
  tx = tr - ty * tiles_w;
}

// ---- U[a][k][c] = G g G^T, one thread per (k, c)
extern "C" __global__ void __launch_bounds__(256)
wino_filter(const elem_t* __restrict__ w, uv_t* __restrict__ U, int K, int C) {
  const long long KC = (long long)K * C;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < KC; e += step) {
    float g[3][3];
#pragma unroll
    for (int r = 0; r < 3; ++r)
#pragma unroll
      for (int s = 0; s < 3; ++s) {
#if NHWC
        const long long k = e / C, c = e - k * C;
        g[r][s] = to_float(w[((k * 3 + r) * 3 + s) * C + c]);  // (K, R, S, C)
#else
        g[r][s] = to_float(w[e * 9 + r * 3 + s]);  // (K, C, R, S)
#endif
      }
    float u[ALPHA][ALPHA];
    filter_tf(g, u);
#pragma unroll
    for (int i = 0; i < ALPHA; ++i)
#pragma unroll
      for (int j = 0; j < ALPHA; ++j) U[(i * ALPHA + j) * KC + e] = to_uv(u[i][j]);
  }
}

// ---- V = B^T d B of every (tile, channel) of the chunk
extern "C" __global__ void __launch_bounds__(256)
wino_input(const elem_t* __restrict__ x, uv_t* __restrict__ V, int n0, int nc, int C, int H,
           int W, int pt, int pl, int tiles_h, int tiles_w) {
  const int tiles = tiles_h * tiles_w;
  const long long T = (long long)nc * tiles;
  const long long TC = T * C;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < TC; e += step) {
    int c, nl, ty, tx;
    long long t;
    grid_split(e, T, C, c, t);  // V[a][t][c] / V[a][c][t]
    tile_place(t, tiles, tiles_w, nl, ty, tx);
    const int ih0 = ty * TILE - pt;
    const int iw0 = tx * TILE - pl;
    float d[ALPHA][ALPHA];
#pragma unroll
    for (int i = 0; i < ALPHA; ++i)
#pragma unroll
      for (int j = 0; j < ALPHA; ++j) {
        const int ih = ih0 + i, iw = iw0 + j;
        float v = 0.f;
        if ((unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W)
          v = to_float(x[tensor_index<kChannelsLast>(n0 + nl, c, ih, iw, C, H, W)]);
        d[i][j] = v;
      }
    float v[ALPHA][ALPHA];
    input_tf(d, v);
#pragma unroll
    for (int i = 0; i < ALPHA; ++i)
#pragma unroll
      for (int j = 0; j < ALPHA; ++j) V[(i * ALPHA + j) * TC + e] = to_uv(v[i][j]);
  }
}

// ---- y = epilogue(A^T M A) of every (tile, output channel) of the chunk
extern "C" __global__ void __launch_bounds__(256)
wino_output(const float* __restrict__ M, elem_t* __restrict__ y, const elem_t* __restrict__ bias,
            const elem_t* __restrict__ residual, int n0, int nc, int K, int P, int Q,
            int tiles_h, int tiles_w, int act, int flags) {
  const int tiles = tiles_h * tiles_w;
  const long long T = (long long)nc * tiles;
  const long long TK = T * K;
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < TK; e += step) {
    int k, nl, ty, tx;
    long long t;
    grid_split(e, T, K, k, t);  // M[a][t][k] / M[a][k][t]
    float m[ALPHA][ALPHA];
#pragma unroll
    for (int i = 0; i < ALPHA; ++i)
#pragma unroll
      for (int j = 0; j < ALPHA; ++j) m[i][j] = M[(i * ALPHA + j) * TK + e];
    float o[TILE][TILE];
    output_tf(m, o);
    tile_place(t, tiles, tiles_w, nl, ty, tx);
#pragma unroll
    for (int i = 0; i < TILE; ++i) {
      const int p = ty * TILE + i;
      if (p >= P) break;
#pragma unroll
      for (int j = 0; j < TILE; ++j) {
        const int q = tx * TILE + j;
        if (q >= Q) break;
        const long long yi = tensor_index<kChannelsLast>(n0 + nl, k, p, q, K, P, Q);
        y[yi] = from_float<elem_t>(conv::epilogue(o[i][j], k, yi, bias, residual, act, flags));
      }
    }
  }
}
