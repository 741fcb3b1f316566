"""An analytic cost model for the default heuristic: which (variant, parameters) to run on a
problem nobody tuned.

Every candidate is estimated as

    time = FIXED + launches x LAUNCH
           + max(compute, DRAM bytes / bandwidth, L2 bytes / L2 bandwidth)   (the main kernel)
           + the memory time of every extra pass (transposes, im2col, split-K finish, ...)

where compute counts the *padded* work (M, N, K rounded up to the tile) at the variant's
throughput class, scaled by wave quantization (``ceil(tiles / SMs)`` blocks per SM, in rounds
of the blocks that fit per SM by shared memory, threads and registers), by the tile's
arithmetic intensity and by how many warps an SM has to hide latency with. The cheapest
estimate wins. Nothing here is keyed by shape: the only inputs are the problem's sizes, the
parameters and the device facts below.

All throughput constants live in :data:`THROUGHPUT` / the module constants, each with the
place its number comes from. Device facts come from the DeviceInfo (SM count, shared memory
per block); what it does not carry (bandwidth, clock) is an H200 default, scaled by the SM
count when the device has a different one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# ----------------------------------------------------------------------------- constants

# Achieved dense throughput (TFLOP/s) of each kernel family on large, full-tile problems on
# the H200 (132 SMs). Sources: benchmarks/RESULTS.md and benchmarks/logs/2026-12-02-round2-*.
THROUGHPUT: dict[str, float] = {
    # cuBLAS bf16 / fp16 8192^3, the "ceilings" line of logs/2026-12-02-round2-gemm.md
    "cublas_bf16": 675.0,
    "cublas_fp16": 635.0,
    # cuBLAS TF32: the conv log's im2col_gemm fp32 NCHW rows (cuBLAS TF32 on the patch
    # matrix) reach 88-116 TFLOP/s; 190 puts those rows at their measured times (the H200
    # datasheet's dense TF32 is 495). FP32: datasheet 67 x the 0.65 that cuBLAS fp16 reaches
    # of its 989 datasheet peak (not measured here).
    "cublas_tf32": 190.0,
    # cuBLAS with a leading dimension that is not a multiple of 16 bytes: its Hopper tensor
    # core kernels need 16-byte aligned rows, so it falls back to older narrow-access kernels
    # (the profiler names a cutlass sm75 kernel). The ResNet-50 batch-32 stem's GEMM as fp16
    # NHWC im2col_gemm (M 401408, N 64, K 147, lda 147) ran 136 us on the H100
    # (logs/2026-12-06-h100-conv-probe-before-vendor-fix.jsonl); 200 puts this model's
    # estimate of it there (~57 TFLOP/s of useful work after the tile padding of N = 64)
    "cublas_unaligned": 200.0,
    "cublas_fp32": 44.0,
    # our wgmma GEMM: 494 TFLOP/s best (LLaMA down m=4096, 128x256), 456-480 on squares
    "wgmma": 490.0,
    # implicit_gemm_wgmma: 422 TFLOP/s best (ResNet s3 3x3 256 @14, batch 256, conv log)
    "conv_wgmma": 420.0,
    # our mma.sync GEMM, fp16/bf16: 4096^3 in 366 us = 375 TFLOP/s (gemm log, mma_us column)
    "mma16": 370.0,
    # the same mma.sync core under the conv gathers (implicit_gemm, gemm_1x1 fp16): the conv
    # log's fp16 rows of those variants run at ~0.65 of what the 370 class predicts
    "conv_mma16": 240.0,
    # mma.sync TF32: 102 TFLOP/s best (gemm_1x1 fp32 NCHW, ResNet s3 1x1 512->256, b256)
    "mma_tf32": 105.0,
    # exact fp32 on CUDA cores (simt GEMM, FFMA): datasheet 67 TFLOP/s; assumed ~40% of it
    # for our register-tiled kernel (not measured on the H200: simt never won a logged row)
    "simt": 27.0,
    # direct convolution on CUDA cores (no tiling reuse beyond registers): timed in the conv
    # log on every row under 2 GFLOP and never the best there, so at most ~8 (an upper bound)
    "direct": 8.0,
}
# An implicit GEMM gathering the patch matrix in pieces of fewer than 16 bytes (NCHW: one
# element per load; NHWC with few channels) runs at pieces/16 of full speed, down to this
# floor: the NCHW TF32 best was 21 TFLOP/s (conv1 7x7/2, conv log) against 105 for the
# vectorized gemm_1x1 in TF32 (a factor 0.2-0.33 with the C = 3 layer's padding waste).
NCHW_GATHER_FACTOR = 0.33
# Device-to-device copy, bytes read + written per second: 4249 GB/s measured (RESULTS.md);
# a single pass over a few MB reaches ~0.9 of it.
HBM_BYTES_PER_S = 4249e9 * 0.9
# L2 -> SM traffic for operand re-reads: not measured here; assumed 2x HBM (an estimate)
L2_BYTES_PER_S = 8.5e12
# Memory-bound stencil kernels reach this fraction of HBM bandwidth (the depthwise rows of
# the conv log: fp16 NHWC and fp32 NCHW, batch 32-256 move x + y at ~1.6-2.9 TB/s)
STENCIL_BW_FRACTION = 0.5
# Fixed cost of a timed call (first kernel, L2 cold after the flush): the smallest rows of the
# conv log are 6.3-6.8 us for one kernel moving < 1 MB; each further launch in the same call
# costs about LAUNCH_US (split-K rows: + ~2 us for the finish kernel).
FIXED_US = 6.0
LAUNCH_US = 2.0
# The tile is fully efficient from this arithmetic intensity bm*bn/(bm+bn) up: between
# 128x128 and 128x256 for wgmma (the gemm log's 128x128 runs at 0.83 of 128x256 on the same
# product); 64x64 for mma.sync (in the conv log 64x64 tiles beat 128x128 on many 1x1 GEMMs).
INTENSITY_KNEE = {"wgmma": 85.0, "mma": 32.0, "simt": 32.0}
# Warps per SM from which latency is hidden (two warpgroups / two 4-warp blocks).
WARPS_TO_HIDE = 8
# Every block pays about (stages - 1) k-tiles filling its pipeline before the first mma,
# plus this many for storing the tile after the last.
EPILOGUE_KTILES = 1
# Loads in flight hide memory latency: a pipeline of ``stages`` keeps (stages - 1) k-tiles
# in flight, and a kernel whose own warps issue the gathers (cp.async, no producer warps)
# runs at min(1, (stages - 1) / STAGES_IN_FLIGHT) of its class's rate. implicit_gemm_wgmma,
# same tile, unseen-shape log 2026-12-04 (logs/2026-12-04-pm-unseen-candidates.json): 3
# stages run at 0.73-0.83 of 4 stages on 5 problems (256x128 and 128x256 tiles, split-K 1
# and 4), 5 stages within 3 % of 4; 2.5 puts 3 stages at 0.8. Other families: 1 (stages >= 2
# hide it; no pair in the logs says otherwise).
STAGES_IN_FLIGHT = {"wgmma_gather": 2.5}
# Our im2col kernel (the patch matrix of im2col_gemm) moves x + the patch matrix at this
# fraction of HBM bandwidth, not at the full rate of a copy: the unseen-shape log's im2col
# rows (same file, 10 non-depthwise problems; the cuBLAS GEMM's modelled time taken off, so
# its error is in there too) imply 0.27-6 TB/s, geomean 1.2. With the stage term above, 0.5
# puts the default within 10 % of the fastest on 9 of those 14 problems (8 at 1.0; 6 with
# neither term), and on the 198-shape conv log 82 picks within 10 % of the best at 0.2-0.5,
# 79 at 1.0 (benchmarks/check_heuristic.py).
IM2COL_BW_FRACTION = 0.5
# An NHWC patch gather copying pieces narrower than 16 bytes (few channels: the RGB stem's
# C = 3 in fp16 moves 2-byte pieces) ran at 0.097 TB/s, 0.051 of the 16-byte rate above
# (the stem at batch 32: 1319 us for 128 MB on the H100, same log); other widths are taken
# on the straight line between those two points (not measured).
IM2COL_NARROW_FRACTION = 0.051


def im2col_fraction(piece_bytes: int) -> float:
    """Bandwidth fraction of an NHWC patch gather moving ``piece_bytes`` per access."""
    if piece_bytes >= 16:
        return IM2COL_BW_FRACTION
    t = (max(piece_bytes, 2) - 2) / 14
    return IM2COL_BW_FRACTION * (IM2COL_NARROW_FRACTION + t * (1 - IM2COL_NARROW_FRACTION))
# Our kernels store the output straight from the accumulator fragments (no shared-memory
# staging): 4-8 byte scattered stores. The conv log's gemm_1x1 "s1 proj 64->256 @56" (output
# 4x the input, K = 64) writes y at 0.42e12 elements/s in fp16 NHWC (b32: 51 MB in 66 us) and
# 0.39e12 in fp32 NCHW (b256): the store rate is per element, not per byte.
FRAGMENT_STORE_ELEMS_PER_S = 4.0e11

# H200-class defaults for what DeviceInfo does not carry.
H200_SMS = 132
H200_SMEM_PER_SM = 228 * 1024
THREADS_PER_SM = 2048
REGS_PER_SM = 65536
MAX_BLOCKS_PER_SM = 32


# ----------------------------------------------------------------------------- device


@dataclass(frozen=True)
class DeviceFacts:
    """What the model needs to know about the GPU."""

    sms: int = H200_SMS
    smem_per_sm: int = H200_SMEM_PER_SM
    hbm_bytes_per_s: float = HBM_BYTES_PER_S
    l2_bytes_per_s: float = L2_BYTES_PER_S

    @property
    def scale(self) -> float:
        """Throughput relative to the H200 the constants were measured on (per-SM rates
        are assumed equal: the clock is not in DeviceInfo)."""
        return self.sms / H200_SMS


def device_facts(device: Any) -> DeviceFacts:
    """Facts from a DeviceInfo (SM count, opt-in shared memory) or H200 defaults."""
    sms = int(getattr(device, "sm_count", 0) or 0)
    if getattr(device, "backend", "cupy") != "cupy" or sms <= 0:
        sms = H200_SMS
    optin = int(getattr(device, "smem_per_block_optin", 0) or 0)
    smem = optin + 1024 if optin else H200_SMEM_PER_SM  # the SM reserves 1 KB per block
    return DeviceFacts(sms=sms, smem_per_sm=smem)


# ----------------------------------------------------------------------------- estimates


@dataclass(frozen=True)
class Estimate:
    """One candidate's estimated time and how it was reached."""

    variant: str
    params: dict[str, Any]
    us: float
    compute_us: float = 0.0
    memory_us: float = 0.0
    extra_us: float = 0.0
    launches: int = 1
    waves: int = 1
    notes: tuple[str, ...] = field(default_factory=tuple)

    def bound(self) -> str:
        """'compute' or 'memory': which term of the main kernel dominated."""
        return "compute" if self.compute_us >= self.memory_us else "memory"

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "params": dict(self.params), "us": self.us,
                "compute_us": self.compute_us, "memory_us": self.memory_us,
                "extra_us": self.extra_us, "launches": self.launches, "waves": self.waves,
                "bound": self.bound(), "notes": list(self.notes)}


@dataclass(frozen=True)
class Tile:
    """A block tile of a tiled GEMM kernel and its resource use."""

    bm: int
    bn: int
    bk: int
    threads: int
    smem: int
    splits: int = 1
    family: str = "mma"  # key of INTENSITY_KNEE
    stages: int = 3
    loads: str = ""  # key of STAGES_IN_FLIGHT: how the kernel's loads are issued

    def blocks_per_sm(self, dev: DeviceFacts) -> int:
        """Resident blocks per SM by shared memory, threads and registers (accumulators
        plus ~64 registers of addressing per thread)."""
        regs = (self.bm * self.bn // self.threads + 64) * self.threads
        by_smem = dev.smem_per_sm // max(self.smem + 1024, 1)
        by_threads = THREADS_PER_SM // self.threads
        by_regs = REGS_PER_SM // max(regs, 1)
        return max(1, min(by_smem, by_threads, by_regs, MAX_BLOCKS_PER_SM))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class GemmWork:
    """A (batched) M x N x K product run on a tile grid, with the bytes it moves."""

    m: int
    n: int
    k: int
    batch: int
    dram_bytes: float  # operands read once + output written (+ residual, bias)
    a_bytes: float = 0.0  # one read of A (re-read once per column of N tiles, from L2)
    b_bytes: float = 0.0
    fragment_stores: float = 0.0  # output elements stored from fragments (0: staged / N/A)


def tiled_gemm_us(work: GemmWork, tile: Tile, tflops: float, dev: DeviceFacts
                  ) -> tuple[float, float, int]:
    """(compute us, memory us, waves) of the main kernel of a tiled GEMM."""
    tm, tn = ceil_div(work.m, tile.bm), ceil_div(work.n, tile.bn)
    kchunk = ceil_div(ceil_div(work.k, tile.bk), tile.splits) * tile.bk
    blocks = tm * tn * work.batch * tile.splits
    per_sm = ceil_div(blocks, dev.sms)  # blocks the busiest SM runs
    fit = tile.blocks_per_sm(dev)
    waves = ceil_div(blocks, dev.sms * fit)
    intensity = tile.bm * tile.bn / (tile.bm + tile.bn)
    eff = min(1.0, intensity / INTENSITY_KNEE.get(tile.family, 64.0)) ** 0.5
    warps = min(fit, per_sm) * tile.threads // 32
    eff *= min(1.0, warps / WARPS_TO_HIDE) ** 0.5
    eff *= min(1.0, (tile.stages - 1) / STAGES_IN_FLIGHT.get(tile.loads, 1.0))
    sm_rate = tflops * 1e12 / H200_SMS  # FLOP/s of one SM (per-SM rates as on the H200)
    kwork = kchunk + (tile.stages - 1 + EPILOGUE_KTILES) * tile.bk
    compute = per_sm * 2.0 * tile.bm * tile.bn * kwork / (sm_rate * eff) * 1e6
    l2 = work.a_bytes * tn + work.b_bytes * tm
    memory = max(work.dram_bytes / dev.hbm_bytes_per_s, l2 / dev.l2_bytes_per_s,
                 work.fragment_stores / (FRAGMENT_STORE_ELEMS_PER_S * dev.scale)) * 1e6
    return compute, memory, waves


def cublas_class(dtype: str, tf32: bool, aligned: bool = True) -> str:
    """THROUGHPUT key of a cuBLAS GEMM in this dtype / math; ``aligned`` False when a
    leading dimension is not a multiple of 16 bytes (measured for fp16 / bf16 only: TF32 and
    FP32 keep their class)."""
    if not aligned and dtype != "float32":
        return "cublas_unaligned"
    if dtype == "float32":
        return "cublas_tf32" if tf32 else "cublas_fp32"
    return "cublas_bf16" if dtype == "bfloat16" else "cublas_fp16"


def cublas_us(m: int, n: int, k: int, batch: int, cls: str, dev: DeviceFacts,
              dram: float, eb: int) -> tuple[float, float, int]:
    """(compute, memory, waves) of cuBLAS, which picks its own tile and split-K: the best of
    a few Hopper-sized tiles; its warp-specialized kernels overlap part of the pipeline fill (stages=3 here)
    and stage the epilogue through shared memory (no fragment-store term)."""
    best: tuple[float, float, int] | None = None
    family = "simt" if cls == "cublas_fp32" else "wgmma"
    for bm, bn in ((128, 256), (256, 128), (128, 128), (64, 128), (128, 64), (64, 64)):
        for splits in (1, 2, 4, 8):
            if splits > 1 and (ceil_div(m, bm) * ceil_div(n, bn) * batch >= dev.sms
                               or k < 256 * splits):
                continue
            threads = 256 if bm * bn >= 128 * 256 else 128
            tile = Tile(bm, bn, 64, threads, 4 * (bm + bn) * 64 * eb, splits, family, 3)
            partial = 0.0 if splits == 1 else 8.0 * splits * m * n * batch
            work = GemmWork(m, n, k, batch, dram_bytes=dram + partial,
                            a_bytes=m * k * batch * eb, b_bytes=k * n * eb)
            c, mem, waves = tiled_gemm_us(work, tile, THROUGHPUT[cls], dev)
            if best is None or max(c, mem) < max(best[0], best[1]):
                best = (c, mem, waves)
    assert best is not None
    return best


def pass_us(nbytes: float, dev: DeviceFacts, fraction: float = 1.0) -> float:
    """Memory time of a bandwidth-bound pass moving ``nbytes`` (read + written)."""
    return nbytes / (dev.hbm_bytes_per_s * fraction) * 1e6


def total(variant: str, params: Mapping[str, Any], compute: float, memory: float, *,
          extra: float = 0.0, launches: int = 1, waves: int = 1,
          notes: Iterable[str] = ()) -> Estimate:
    """Combine the terms: fixed + launches + max(compute, memory) + the extra passes."""
    us = FIXED_US + (launches - 1) * LAUNCH_US + max(compute, memory) + extra
    return Estimate(variant, dict(params), us, compute, memory, extra, launches, waves,
                    tuple(notes))


# ----------------------------------------------------------------------------- ranking

CostFn = Callable[[Any, Any, Mapping[str, Any], DeviceFacts], Estimate | None]
CandFn = Callable[[Any, Any, Any], list[dict[str, Any]]]


def rank(variants: Iterable[Any], problem: Any, device: Any,
         costs: Mapping[str, CostFn], candidates: Callable[[Any, Any, Any], list[dict]],
         ) -> list[Estimate]:
    """Estimates of every candidate of every supported variant that has a cost function,
    cheapest first (ties keep the variants' registration order)."""
    dev = device_facts(device)
    out: list[tuple[float, int, Estimate]] = []
    for variant in variants:
        cost = costs.get(variant.name)
        if cost is None or not variant.supports(problem, device):
            continue
        for params in candidates(variant, problem, device):
            est = cost(variant, problem, params, dev)
            if est is not None:
                out.append((est.us, len(out), est))
    out.sort(key=lambda t: (t[0], t[1]))
    return [e for _, _, e in out]


def memo_rank(fn: Callable[[Any, str, Any], list[Estimate]]
              ) -> Callable[[Any, str, Any, tuple[str, ...]], list[Estimate]]:
    """Memoize a rank function per (problem, backend, device, registered variant names): an
    unplanned call may ask for the default choice every time, and ranking costs milliseconds.
    """
    cache: dict[tuple, tuple[Estimate, ...]] = {}

    def wrapper(problem: Any, backend: str, device: Any, names: tuple[str, ...]
                ) -> list[Estimate]:
        key = (problem, backend, device, names)
        try:
            return list(cache[key])
        except KeyError:
            out = cache[key] = tuple(fn(problem, backend, device))
            return list(out)
        except TypeError:  # an unhashable device description: no memo
            return fn(problem, backend, device)

    return wrapper


TIE = 0.01  # estimates within 1% are a tie: a fixed preference order decides


def pick(estimates: list[Estimate], order: list[str]) -> Estimate | None:
    """The cheapest estimate; among those within TIE of it, the earliest in ``order``."""
    if not estimates:
        return None
    limit = estimates[0].us * (1.0 + TIE)
    close = [e for e in estimates if e.us <= limit]
    rank = {name: i for i, name in enumerate(order)}
    return min(close, key=lambda e: (rank.get(e.variant, len(rank)), e.us))


def variant_default(variant: Any, problem: Any, device: Any) -> dict[str, Any] | None:
    """A variant's own default_params() if it has one, else its first valid parameters."""
    own = getattr(variant, "default_params", None)
    if own is not None:
        return own(problem, device)
    return next(iter(variant.param_space(problem, device)), None)


def valid(variant: Any, problem: Any, params: Mapping[str, Any], device: Any) -> bool:
    """The variant accepts these parameters (its own rules) on this device."""
    try:
        return (variant.check_params(params) is None
                and bool(variant.valid_params(problem, params, device)))
    except Exception:  # a parameter set the variant cannot evaluate is not a candidate
        return False


# (bm, bn, bk, warps, stages): big tiles for big products, skinny ones for few pixels
TILE_MENU: tuple[tuple[int, int, int, int, int], ...] = (
    (128, 256, 32, 8, 3), (256, 128, 32, 8, 3), (128, 128, 32, 8, 4), (128, 128, 32, 4, 4),
    (128, 128, 64, 4, 3), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (64, 64, 64, 4, 3),
    (64, 64, 32, 4, 4), (128, 32, 32, 4, 4), (32, 128, 64, 4, 4), (32, 64, 64, 4, 4),
    (16, 64, 64, 4, 4), (16, 128, 64, 4, 3), (64, 16, 64, 4, 6), (64, 32, 64, 4, 6),
    (256, 64, 64, 8, 4), (64, 256, 64, 4, 4), (128, 256, 64, 8, 4), (256, 128, 64, 8, 4),
    (128, 128, 64, 8, 5), (128, 64, 64, 8, 5), (64, 128, 64, 4, 5), (64, 64, 64, 4, 6),
)
SPLITS = (1, 2, 4, 8, 16)


def _snap(value: Any, allowed: tuple[Any, ...]) -> Any:
    if value in allowed or not allowed:
        return value
    return min(allowed, key=lambda a: (abs(a - value), -a))


def tile_candidates(variant: Any, problem: Any, device: Any,
                    default: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The variant's default plus the menu tiles x split-K snapped to its parameter space
    and filtered by its own rules; other parameters keep their default value."""
    out: list[dict[str, Any]] = []
    if default is not None and valid(variant, problem, default, device):
        out.append(dict(default))
    base = dict(default or {})
    space = variant.params
    for tile in TILE_MENU:
        for sk in SPLITS:
            vals = dict(zip(("bm", "bn", "bk", "warps", "stages"), tile), splitk=sk)
            p = dict(base, **{k: _snap(v, tuple(space[k])) for k, v in vals.items()
                              if k in space})
            if "reduce" in space and sk > 1:
                p["reduce"] = "fused"
            if p not in out and valid(variant, problem, p, device):
                out.append(p)
    return out
