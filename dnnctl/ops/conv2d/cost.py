"""Cost model of the CUDA conv2d forward variants (see dnnctl/ops/costmodel.py).

Each variant is described by the GEMM it runs (M = output pixels, N = output channels per
group, K = channels per group x filter taps, batch = groups), its throughput class, the bytes
its main kernel moves and the extra passes it pays (layout transposes, patch matrix, channel
padding, split-K partials, a separate epilogue). A variant without an entry in :data:`COSTS`
is left to the fallback order in op.py; a new variant joins the model by adding one here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dnnctl.ops import costmodel as cm
from dnnctl.ops.conv2d.geom import ConvGeom, geometry

ELEM = {"float32": 4, "float16": 2, "bfloat16": 2}


def _padded_channels(cg: int) -> int:
    """As implicit_gemm_wgmma.padded_channels (the 16-bit NHWC gather's channel padding)."""
    if cg % 4 == 0:
        return cg
    return 4 if cg < 4 else -(-cg // 8) * 8


def _cgp(g: ConvGeom) -> int:
    if g.nhwc and g.dtype != "float32" and g.cg % 2:
        return _padded_channels(g.cg)
    return g.cg


def _bytes(g: ConvGeom) -> tuple[float, float, float]:
    """Bytes of x, w and y (y counted twice with a residual: read and written)."""
    eb = ELEM[g.dtype]
    x = g.n * g.h * g.w * g.c * eb
    w = g.k * g.cg * g.r * g.s * eb
    y = g.n * g.p * g.q * g.k * eb * (2 if g.residual else 1)
    return x, w, y


def _tc_class(g: ConvGeom, wgmma: bool = False) -> str:
    if g.dtype != "float32":
        return "conv_wgmma" if wgmma else "conv_mma16"
    return "mma_tf32" if g.tf32 else "simt"


def _tile(params: Mapping[str, Any], g: ConvGeom, k: int, wgmma: bool) -> cm.Tile:
    eb = 4 if g.dtype == "float32" else 2
    bk = 64 if wgmma else params["bk"]
    smem = params["stages"] * (params["bm"] + params["bn"]) * bk * eb + (1024 if wgmma else 0)
    ktiles = cm.ceil_div(k, bk)
    per = cm.ceil_div(ktiles, max(1, params["splitk"]))
    splits = cm.ceil_div(ktiles, per)
    family = "wgmma" if wgmma else ("simt" if g.dtype == "float32" and not g.tf32 else "mma")
    return cm.Tile(params["bm"], params["bn"], bk, params["warps"] * 32, smem, splits, family,
                   params["stages"], "wgmma_gather" if wgmma else "")


def _gemm_estimate(name: str, params: Mapping[str, Any], g: ConvGeom, dev: cm.DeviceFacts,
                   m: int, n: int, k: int, batch: int, *, wgmma: bool = False,
                   gather_bytes: int = 16, extra: float = 0.0, launches: int = 1,
                   notes: tuple[str, ...] = ()) -> cm.Estimate:
    """A tiled tensor-core (or FFMA) conv kernel plus its split-K finish."""
    x, w, y = _bytes(g)
    eb = ELEM[g.dtype]
    tile = _tile(params, g, k, wgmma)
    stores = 0.0 if tile.splits > 1 else y / eb  # split-K: the finish kernel stores y
    work = cm.GemmWork(m, n, k, batch, dram_bytes=x + w + y,
                       a_bytes=m * k * batch * eb, b_bytes=n * k * batch * eb,
                       fragment_stores=stores)
    cls = _tc_class(g, wgmma)
    tflops = cm.THROUGHPUT[cls] * max(cm.NCHW_GATHER_FACTOR, min(1.0, gather_bytes / 16))
    compute, memory, waves = cm.tiled_gemm_us(work, tile, tflops, dev)
    if tile.splits > 1:  # fp32 partial slabs written, then read by the finish kernel
        partial = 4.0 * tile.splits * m * n * batch
        memory = max(memory, (x + w + partial) / dev.hbm_bytes_per_s * 1e6)
        extra += cm.pass_us(partial + y, dev)
        launches += 1
    notes = (*notes, f"{cls}", f"{m}x{n}x{k}x{batch} on {tile.bm}x{tile.bn}x{tile.bk}"
             f" sk{tile.splits}")
    return cm.total(name, params, compute, memory, extra=extra, launches=launches,
                    waves=waves, notes=notes)


def implicit_gemm(variant: Any, problem: Any, params: Mapping[str, Any],
                  dev: cm.DeviceFacts, wgmma: bool = False) -> cm.Estimate:
    g = geometry(problem)
    cgp = _cgp(g) if not wgmma else _padded_channels(g.cg)
    extra, launches, notes = 0.0, 1, ()
    if cgp != g.cg:  # odd channels: x and w zero-padded in a workspace first (2 launches)
        x, w, _ = _bytes(g)
        extra += cm.pass_us(2 * (x + w) * cgp / g.cg, dev)
        launches += 2
        notes = (f"channels padded {g.cg}->{cgp}",)
    eb = ELEM[g.dtype]
    piece = eb * _vec(cgp, eb) if g.nhwc else eb  # bytes per gather load
    return _gemm_estimate(variant.name, params, g, dev, g.npq, g.kg, cgp * g.r * g.s,
                          g.groups, wgmma=wgmma, gather_bytes=piece, extra=extra,
                          launches=launches, notes=notes)


def _vec(extent: int, eb: int) -> int:
    """Elements per load: the largest power of two <= 16 bytes dividing ``extent``."""
    v = 16 // eb
    while v > 1 and extent % v:
        v //= 2
    return v


def implicit_gemm_wgmma(variant: Any, problem: Any, params: Mapping[str, Any],
                        dev: cm.DeviceFacts) -> cm.Estimate:
    return implicit_gemm(variant, problem, params, dev, wgmma=True)


def gemm_1x1(variant: Any, problem: Any, params: Mapping[str, Any],
             dev: cm.DeviceFacts) -> cm.Estimate:
    g = geometry(problem)
    if g.nhwc:
        m, n, k, batch = g.npq, g.kg, g.cg, g.groups
    else:
        m, n, k, batch = g.k, g.p * g.q, g.c, g.n
    return _gemm_estimate(variant.name, params, g, dev, m, n, k, batch)


def nhwc_implicit_gemm(variant: Any, problem: Any, params: Mapping[str, Any],
                       dev: cm.DeviceFacts) -> cm.Estimate:
    """Transpose x and w in, the NHWC implicit GEMM, transpose y out (3 more launches)."""
    g = geometry(problem)
    x, w, y = _bytes(g)
    from dnnctl.ops.registry import get_op

    inner = get_op("conv2d").problem(dict(problem.as_dict(), layout="NHWC", residual=False))
    est = implicit_gemm(variant, inner, params, dev)
    extra = est.extra_us + cm.pass_us(2 * (x + w) + 2 * y, dev)
    return cm.total(variant.name, params, est.compute_us, est.memory_us, extra=extra,
                    launches=est.launches + 3, waves=est.waves,
                    notes=(*est.notes, "NCHW<->NHWC transposes"))


def im2col_gemm(variant: Any, problem: Any, params: Mapping[str, Any],
                dev: cm.DeviceFacts) -> cm.Estimate:
    """Patch matrix written then read by cuBLAS, epilogue in place (one pass each)."""
    g = geometry(problem)
    x, w, y = _bytes(g)
    eb = ELEM[g.dtype]
    col = 0.0 if g.identity else float(g.npq * g.crs * g.groups * eb)
    extra, launches = 0.0, 1
    if col:
        piece = eb * (params.get("vec", 1) if g.nhwc else 16)  # NCHW: not measured narrow
        extra += cm.pass_us(x + col, dev, cm.im2col_fraction(piece))
        launches += 1
    chunk = params.get("chunk", 0) or g.n
    passes = cm.ceil_div(g.n, chunk)
    launches = launches * passes
    if g.bias or g.activation != "none" or g.residual:
        extra += cm.pass_us(2 * y, dev)
        launches += 1
    # NHWC: one GEMM over all pixels per group; NCHW: one (K x PQ) GEMM per image and group
    m, n, batch = (g.npq, g.kg, g.groups) if g.nhwc else (g.kg, g.p * g.q, g.n * g.groups)
    # leading dimensions: w rows (C/g*R*S); NHWC the patch rows (x's C when 1x1) and y's K,
    # NCHW the pixel rows (P*Q, or H*W when 1x1)
    lds = (g.crs, g.c if g.identity else g.crs, g.k) if g.nhwc else (
        g.crs, g.h * g.w if g.identity else g.p * g.q, g.p * g.q)
    cls = cm.cublas_class(g.dtype, g.tf32, aligned=all(ld * eb % 16 == 0 for ld in lds))
    compute, memory, waves = cm.cublas_us(m, n, g.crs, batch, cls, dev, (col or x) + w + y, eb)
    return cm.total(variant.name, params, compute, memory, extra=extra, launches=launches,
                    waves=waves, notes=(cls, f"im2col {col:.3g} B"))


def winograd(variant: Any, problem: Any, params: Mapping[str, Any],
             dev: cm.DeviceFacts) -> cm.Estimate:
    """Filter, input and output transforms (memory passes) around alpha^2 batched GEMMs."""
    g = geometry(problem)
    x, w, y = _bytes(g)
    m = params["tile"]
    alpha2 = (m + 2) ** 2
    t = g.n * cm.ceil_div(g.p, m) * cm.ceil_div(g.q, m)
    fp32_uv = m == 4 or g.dtype == "float32"
    uvb = 4 if fp32_uv else ELEM[g.dtype]
    cls = "cublas_fp32" if m == 4 or (g.dtype == "float32" and not g.tf32) else \
        cm.cublas_class(g.dtype, g.tf32)
    u, v, mm = alpha2 * g.k * g.c * uvb, alpha2 * t * g.c * uvb, alpha2 * t * g.k * 4.0
    compute, memory, waves = cm.cublas_us(t, g.k, g.c, alpha2, cls, dev, u + v + mm, uvb)
    # the transforms gather tiles with overlap, like the stencil kernels
    frac = cm.STENCIL_BW_FRACTION
    extra = (cm.pass_us(w + u, dev, frac) + cm.pass_us(x + v, dev, frac)
             + cm.pass_us(mm + y, dev, frac))
    return cm.total(variant.name, params, compute, memory, extra=extra, launches=4,
                    waves=waves, notes=(cls, f"F({m}x{m},3x3)"))


def _stencil(variant: Any, problem: Any, params: Mapping[str, Any], dev: cm.DeviceFacts,
             cls: str) -> cm.Estimate:
    """Memory-bound stencils (depthwise) and CUDA-core direct convolution."""
    g = geometry(problem)
    x, w, y = _bytes(g)
    flops = 2.0 * g.npq * g.k * g.cg * g.r * g.s
    compute = flops / (cm.THROUGHPUT[cls] * 1e12 * dev.scale) * 1e6
    memory = cm.pass_us(x + w + y, dev, cm.STENCIL_BW_FRACTION)
    return cm.total(variant.name, params, compute, memory, notes=(cls,))


def depthwise_staged(variant: Any, problem: Any, params: Mapping[str, Any],
                     dev: cm.DeviceFacts) -> cm.Estimate:
    """depthwise_tile / depthwise_planes: the input window staged on chip, x read once."""
    return _stencil(variant, problem, params, dev, "simt")


def depthwise(variant: Any, problem: Any, params: Mapping[str, Any],
              dev: cm.DeviceFacts) -> cm.Estimate:
    """NHWC ``depthwise`` gives each thread ``tq`` outputs along a row and reads its taps
    from L1 / L2, not from a staged tile: x crosses L2 about R * (S + tq - 1) / (tq * sh * sw)
    times. That bounds it on large filters (the ConvNeXt 7x7 layer, batch 32 on the H200:
    247 us against depthwise_tile's 82), where the staged kernels read x once; on 3x3
    filters the DRAM pass still dominates. NCHW runs its spatial-tiled kernel (staged)."""
    est = depthwise_staged(variant, problem, params, dev)
    g = geometry(problem)
    if not g.nhwc:
        return est
    tq = max(1, int(params.get("tq", 1)))
    x, _, _ = _bytes(g)
    l2 = x * g.r * (g.s + tq - 1) / (tq * g.sh * g.sw) / dev.l2_bytes_per_s * 1e6
    if l2 <= est.memory_us:
        return est
    return cm.total(variant.name, params, est.compute_us, l2,
                    notes=(*est.notes, "taps re-read through L2"))


def direct(variant: Any, problem: Any, params: Mapping[str, Any],
           dev: cm.DeviceFacts) -> cm.Estimate:
    return _stencil(variant, problem, params, dev, "direct")


def fft(variant: Any, problem: Any, params: Mapping[str, Any],
        dev: cm.DeviceFacts) -> cm.Estimate:
    """Padded planes, forward FFTs (two passes each), one complex GEMM per frequency
    (images x channels, 4 real FLOPs per complex multiply-add), inverse FFT, crop."""
    g = geometry(problem)
    x, w, y = _bytes(g)
    hf, wf = g.h + g.pt + g.pb + g.r - 1, g.w + g.pl + g.pr + g.s - 1
    freq = hf * (wf // 2 + 1)
    real = 4.0 * hf * wf * (g.n * g.c + g.k * g.cg + g.n * g.k)
    spec = 8.0 * freq * (g.n * g.c + g.k * g.cg + g.n * g.k)
    compute, memory, waves = cm.cublas_us(g.n, g.kg, g.cg, freq * g.groups, "cublas_fp32",
                                          dev, spec, 8)
    extra = cm.pass_us(x + w + y + 3 * real + 4 * spec, dev)
    return cm.total(variant.name, params, 4 * compute, memory, extra=extra, launches=8,
                    waves=waves, notes=("cuFFT + complex GEMM per frequency",))


COSTS: dict[str, cm.CostFn] = {
    "implicit_gemm": implicit_gemm,
    "implicit_gemm_wgmma": implicit_gemm_wgmma,
    "gemm_1x1": gemm_1x1,
    "nhwc_implicit_gemm": nhwc_implicit_gemm,
    "im2col_gemm": im2col_gemm,
    "winograd": winograd,
    "depthwise": depthwise,
    "depthwise_planes": depthwise_staged,
    "depthwise_tile": depthwise_staged,
    "direct": direct,
    "fft": fft,
}
TILED = frozenset({"implicit_gemm", "implicit_gemm_wgmma", "gemm_1x1", "nhwc_implicit_gemm"})


def candidates(variant: Any, problem: Any, device: Any) -> list[dict[str, Any]]:
    """The parameter sets the model scores: tile menus for the tiled variants, the two
    Winograd tiles, the variant's default for the rest."""
    try:
        default = cm.variant_default(variant, problem, device)
    except Exception:  # a default the variant cannot form on this problem
        default = None
    if variant.name in TILED:
        return cm.tile_candidates(variant, problem, device, default)
    if variant.name == "winograd":
        base = dict(default or {"tile": 2, "chunk": 0})
        out = [dict(base, tile=t) for t in (2, 4)]
        return [p for p in out if cm.valid(variant, problem, p, device)]
    return [] if default is None else [default]


def rank(problem: Any, backend: str, device: Any) -> list[cm.Estimate]:
    """Every costed candidate of every supported variant, cheapest first."""
    from dnnctl.ops.registry import variants

    return cm.rank(variants("conv2d", backend), problem, device, COSTS, candidates)


rank_memo = cm.memo_rank(rank)


# Host time of one eager call of each cuDNN route through torch, from the H200 profile of
# patched ResNet-50 at batch 32 (tools/e2e_profile.py, torch 2.11, 2026-12-06):
# aten::cudnn_convolution_relu took 64 us of host self time per call (2118 us over 33
# calls), aten::cudnn_convolution 19 us (eager's 53 calls); its dispatch wrappers and
# dnnctl's epilogue launch bring the unfused route to about 30 us.
CUDNN_FUSED_HOST_US = 64.0
CUDNN_UNFUSED_HOST_US = 30.0


def cudnn_fused_pays(problem: Any, device: Any) -> bool:
    """Whether cuDNN's fused conv + bias + ReLU (one graph, ~64 us of host time per call)
    beats cuDNN's convolution + dnnctl's epilogue pass (~30 us) for an eager caller, whose
    host and GPU work overlap, so that a call costs about max(host, GPU) time: the fused
    route saves the epilogue's pass over y (read + write), the unfused one ~34 us of host
    time. cuDNN's convolution is priced as cuBLAS's GEMM of the implicit-GEMM shape; the
    fused route wins once that plus the saved pass exceeds its host time (large
    convolutions, large batches), the unfused one on the short calls of small batches,
    where the fused graph's set-up would leave the GPU waiting."""
    g = geometry(problem)
    dev = cm.device_facts(device)
    x, w, y = _bytes(g)
    eb = ELEM[g.dtype]
    cls = cm.cublas_class(g.dtype, g.tf32)
    compute, memory, _ = cm.cublas_us(g.npq, g.kg, g.crs, g.groups, cls, dev, x + w + y, eb)
    gpu = max(compute, memory)
    unfused = gpu + cm.pass_us(2 * y, dev) + cm.LAUNCH_US
    return max(CUDNN_FUSED_HOST_US, gpu) < max(CUDNN_UNFUSED_HOST_US, unfused)
