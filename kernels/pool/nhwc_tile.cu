// pool2d NHWC, shared-memory tiles: a block computes TH x TW output pixels x CT channel
// vectors of one sample. It first copies the input patch those windows cover
// (IH = (TH-1)*SH + (KR-1)*DH + 1 rows by IW = (TW-1)*SW + (KS-1)*DW + 1 pixels, CT vectors
// each) into shared memory with cp.async (every copy of the block in flight at once; padding
// positions get the pooling identity), then reads every window from shared memory. Each
// input byte crosses L2 -> SM once per tile (plus the halo) instead of once per window tap,
// and neighbouring tiles (adjacent blocks) share their halo rows through L2.
// Grid: N * ceil(OH/TH) * ceil(OW/TW) * ceil(CV/CT) blocks; dynamic smem IH*IW*CT vectors.
// Host: C % VEC == 0 and VEC-aligned x / y. Geometry defines as in <dnnctl/pool.cuh>.
#include <dnnctl/pool_window.cuh>
#include <dnnctl/stage.cuh>

using namespace dnnctl;

template <int BLOCK, int VEC, int TH, int TW, int CT>
__global__ void __launch_bounds__(BLOCK)
pool_tile(const elem_t* __restrict__ x, elem_t* __restrict__ y) {
  constexpr int CV = C / VEC;                      // channel vectors of a pixel
  constexpr int CTILES = (CV + CT - 1) / CT;
  constexpr int TILES_W = (OW + TW - 1) / TW, TILES_H = (OH + TH - 1) / TH;
  constexpr int IH = (TH - 1) * SH + (KR - 1) * DH + 1;
  constexpr int IW = (TW - 1) * SW + (KS - 1) * DW + 1;
  DNNCTL_DYN_SMEM(elem_t, patch);  // [IH][IW][CT][VEC]

  int t = blockIdx.x;
  const int ctile = t % CTILES;
  t /= CTILES;
  const int tw = t % TILES_W;
  t /= TILES_W;
  const int th = t % TILES_H;
  const i64 n = t / TILES_H;
  const int oh0 = th * TH, ow0 = tw * TW, cv0 = ctile * CT;
  const int ih0 = oh0 * SH - PH, iw0 = ow0 * SW - PW;
  const elem_t* xs = x + n * ((i64)H * W * C);

  // 1. the patch: consecutive threads take consecutive channel vectors, then pixels
  for (int i = threadIdx.x; i < IH * IW * CT; i += BLOCK) {
    const int ct = i % CT, p = i / CT;
    const int ih = ih0 + p / IW, iw = iw0 + p % IW;
    elem_t* dst = patch + i * VEC;
    if (ih >= 0 && ih < H && iw >= 0 && iw < W && cv0 + ct < CV) {
      const elem_t* src = xs + ((i64)ih * W + iw) * C + (cv0 + ct) * VEC;
      stage_vec<VEC>(dst, src);
    } else {
      float id[VEC];
      pool_init<VEC>(id);
      store_vec<ST_PLAIN, VEC>(dst, id);
    }
  }
  stage_wait();
  sync_block();

  // 2. the windows, from shared memory
  for (int o = threadIdx.x; o < TH * TW * CT; o += BLOCK) {
    const int ct = o % CT, q = o / CT;
    const int j = q % TW, i = q / TW;
    const int oh = oh0 + i, ow = ow0 + j;
    if (oh >= OH || ow >= OW || cv0 + ct >= CV) continue;
    float a[VEC];
    pool_init<VEC>(a);
#pragma unroll
    for (int r = 0; r < KR; ++r) {
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        float f[VEC];
        const int p = (i * SH + r * DH) * IW + j * SW + s * DW;
        load_vec<LD_PLAIN, VEC>(patch + (p * CT + ct) * VEC, f);
#pragma unroll
        for (int k = 0; k < VEC; ++k) pool_add(a[k], f[k]);
      }
    }
    pool_finish<VEC>(a, oh, ow);
    store_vec<ST_PLAIN, VEC>(y + ((n * OH + oh) * OW + ow) * (i64)C + (cv0 + ct) * VEC, a);
  }
}
