"""conv2d ``depthwise`` (groups == C, any channel multiplier): kernels/conv2d/depthwise.cu.

NHWC runs the channel-vectorized kernel (params vec, cb, tq, threads; th = tw = 0), NCHW the
spatial-tiled one (params th, tw, tq, threads = th*tw/tq; vec = 1, cb = 0). The filter,
stride and dilation are compiled in, so every tap loop is unrolled.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import Kernel, Problem, Support, unsupported
from dnnctl.ops.conv2d import _cuda
from dnnctl.ops.conv2d.cuda_base import SUPPORTED, CudaConv, epilogue_kernel, next_pow2
from dnnctl.ops.conv2d.op import ConvGeom, geometry
from dnnctl.ops.matmul.gemm_launch import load_kernel
from dnnctl.ops.registry import register_variant

SMEM_LIMIT = 48 * 1024  # static shared memory per block


def _esize(g: ConvGeom) -> int:
    return 4 if g.dtype == "float32" else 2


def _nchw_tile_bytes(g: ConvGeom, th: int, tw: int) -> int:
    ih = (th - 1) * g.sh + (g.r - 1) * g.dh + 1
    iw = (tw - 1) * g.sw + (g.s - 1) * g.dw + 1
    return 4 * (ih * iw + g.r * g.s)


@register_variant
class CudaDepthwise(CudaConv):
    """Depthwise convolution, memory-bound: one DRAM read of the input, reuse on chip."""

    name = "depthwise"
    source = "conv2d/depthwise.cu"
    doc = "groups == C: NHWC channel-vectorized / NCHW spatial-tiled kernels, unrolled taps"
    params = {"vec": (1, 2, 4, 8), "cb": (0, 32, 64, 128), "th": (0, 4, 8, 16),
              "tw": (0, 8, 16, 32, 64), "tq": (1, 2, 4), "threads": (64, 128, 256)}

    def supports_geom(self, g: ConvGeom, device: Any) -> Support:
        if g.groups != g.c:
            return unsupported(f"not depthwise: groups={g.groups} != c={g.c}")
        if g.r > 11 or g.s > 11:
            return unsupported("filters above 11x11 are not unrolled")
        if max(g.sh, g.sw, g.dh, g.dw) > 8:
            return unsupported("stride or dilation above 8")
        if not g.nhwc and (g.k > 65535 or g.n > 65535):
            return unsupported("NCHW kernel: K and N must be <= 65535 (grid limits)")
        return SUPPORTED

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        g = geometry(problem)
        vec, cb, th, tw = params["vec"], params["cb"], params["th"], params["tw"]
        tq, threads = params["tq"], params["threads"]
        if tq > 1 and tq > next_pow2(g.q):
            return False
        if g.nhwc:
            if th or tw or not cb or vec * _esize(g) > 16 or g.k % vec or cb % vec:
                return False
            tc = cb // vec
            if tc > threads or threads % tc:
                return False
            if cb > 32 and cb > next_pow2(g.k):
                return False
            return 4 * g.r * g.s * cb <= SMEM_LIMIT
        if cb or vec != 1 or not th or not tw or tw % tq or threads != th * tw // tq:
            return False
        if (th > 4 and th > next_pow2(g.p)) or (tw > 8 and tw > next_pow2(g.q)):
            return False
        return _nchw_tile_bytes(g, th, tw) <= SMEM_LIMIT

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        g = geometry(problem)
        if g.nhwc:
            vec = next(v for v in (8, 4, 2, 1) if v * _esize(g) <= 16 and g.k % v == 0)
            cb = 64 if g.k > 32 else 32
            want = {"vec": vec, "cb": cb, "th": 0, "tw": 0, "tq": 2 if g.sw == 1 else 1,
                    "threads": max(128, cb // vec)}
        elif g.p * g.q >= 512:
            want = {"vec": 1, "cb": 0, "th": 8, "tw": 32, "tq": 2, "threads": 128}
        elif g.p * g.q >= 128:
            want = {"vec": 1, "cb": 0, "th": 8, "tw": 16, "tq": 1, "threads": 128}
        else:
            want = {"vec": 1, "cb": 0, "th": 8, "tw": 8, "tq": 1, "threads": 64}
        return self.first_valid(problem, device, [want])

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        rt = _cuda.runtime()
        base = {"DNNCTL_DTYPE": _cuda.DTYPE_CODE[g.dtype], "NHWC": int(g.nhwc), "KR": g.r,
                "KS": g.s, "STR_H": g.sh, "STR_W": g.sw, "DIL_H": g.dh, "DIL_W": g.dw,
                "TQ": params["tq"]}
        dims = _cuda.i32(g.n, g.c, g.h, g.w, g.k, g.p, g.q, g.pt, g.pl)
        if g.nhwc:
            return self._build_nhwc(rt, g, params, base, dims)
        defines = dict(base, TH=params["th"], TW=params["tw"])
        fn = rt.function(self.source, defines, "dw_nchw")
        tiles = -(-g.p // params["th"]) * -(-g.q // params["tw"])
        run = mc.Launch(fn, (tiles, g.k, g.n), (params["threads"], 1, 1))
        return epilogue_kernel(run, g, run.consts(*dims, *_cuda.epilogue_codes(g)))

    def _build_nhwc(self, rt: Any, g: ConvGeom, params: Mapping[str, Any],
                    base: dict[str, Any], dims: tuple[Any, ...]) -> Kernel:
        vec, cb, threads = params["vec"], params["cb"], params["threads"]

        def make(vec: int, cb: int) -> tuple[Any, tuple[int, int, int]]:
            defines = dict(base, VEC=vec, CB=cb, THREADS=threads, MULT1=int(g.k == g.c))
            fn = rt.function(self.source, defines, "dw_nhwc")
            strips = g.n * g.p * -(-g.q // params["tq"])
            per_block = threads // (cb // vec)
            return fn, (-(-strips // per_block), -(-g.k // cb), 1)

        fn, grid = make(vec, cb)
        fast = mc.Launch(fn, grid, (threads, 1, 1))  # scalar arguments converted once, here
        tail = fast.consts(*dims, *_cuda.epilogue_codes(g))
        scalar: list[mc.Launch] = []
        align = vec * _esize(g)

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            x, y = inputs["x"], outputs["y"]
            run = fast
            if vec > 1 and (rt.ptr(x) % align or rt.ptr(y) % align):
                # a DLPack view need not be vector-aligned: same algorithm, scalar accesses
                if not scalar:
                    scalar.append(mc.Launch(*make(1, 32), (threads, 1, 1)))
                run = scalar[0]
            bias, res = _cuda.epilogue_ptrs(g, y, inputs)
            run((x, inputs["w"], y, bias, res, *tail))

        return kernel


TILE_SMEM_LIMIT = 96 * 1024  # dw_tile_nhwc's dynamic shared memory: two blocks an SM (H100)


def _tile_bytes(g: ConvGeom, cb: int, th: int, tw: int, tq: int, tpb: int = 1) -> int:
    """Dynamic shared memory of dw_tile_nhwc (as the kernel lays it out): the block's taps
    (float), then one staged input window (I/O type, a 16-byte pad per pixel), two when a
    block runs several tiles (``tpb`` > 1: the next window is staged during this one)."""
    ih = (th - 1) * g.sh + (g.r - 1) * g.dh + 1
    iw = (tw - 1) * g.sw + (g.s - 1) * g.dw + 1
    e = _esize(g)
    row = cb * e + _tile_pad_bytes(cb * e, tq * g.sw)
    return 4 * g.r * g.s * cb + (2 if tpb > 1 else 1) * ih * iw * row


@functools.cache
def _tile_pad_bytes(pixel_bytes: int, step: int) -> int:
    """The pad after each staged pixel's channels (0 to 112 bytes, a multiple of 16) that
    spreads a quarter warp's 16-byte window reads (``pixel_bytes`` / 16 channel pieces, up to
    8, of 8 / that many thread columns ``step`` window columns apart) over the most banks;
    the smallest such pad: dw_tile_nhwc's PAD_BYTES (kernels/conv2d/depthwise_tile.cu)."""
    pieces = min(pixel_bytes // 16, 8)
    best, best_load = 0, 1 << 30
    for pad in range(0, 128, 16):
        col = step * (pixel_bytes + pad)
        hits = [0] * 32
        for t in range(8):
            addr = (t // pieces) * col + (t % pieces) * 16
            for b in range(4):
                hits[(addr // 4 + b) % 32] += 1
        if max(hits) < best_load:
            best, best_load = pad, max(hits)
    return best


def _tile_smem_limit(device: Any) -> int:
    """What a dw_tile_nhwc block may take: TILE_SMEM_LIMIT, or the device's opt-in limit
    per block where that is lower (48 KB where it is not known)."""
    optin = int(getattr(device, "smem_per_block_optin", 0) or 0)
    return min(TILE_SMEM_LIMIT, optin) if optin else SMEM_LIMIT


def _tile_valid(g: ConvGeom, params: Mapping[str, Any], out_h: int, out_w: int,
                device: Any = None) -> bool:
    """A dw_tile_nhwc block shape over an out_h x out_w output: 16-byte vectors that divide
    the block's channels, 32 to 1024 threads, tiles no larger than the output needs, more
    tiles than one block runs, the shared-memory limit."""
    cb, th, tw, tq = params["cb"], params["th"], params["tw"], params["tq"]
    tpb = params.get("tpb", 1)
    vec = 16 // _esize(g)
    if cb % vec or tw % tq or (cb > 16 and cb > next_pow2(g.k)):
        return False
    if (th > 4 and th > next_pow2(out_h)) or (tw > 8 and tw > next_pow2(out_w)):
        return False
    if tpb > 1 and g.n * -(-out_h // th) * -(-out_w // tw) < 2 * tpb:
        return False
    threads = cb // vec * th * tw // tq
    return (32 <= threads <= 1024
            and _tile_bytes(g, cb, th, tw, tq, tpb) <= _tile_smem_limit(device))


def _tile_kernel(g: ConvGeom, params: Mapping[str, Any], flip: bool, names: tuple[str, ...],
                 dims: tuple[int, ...]) -> Kernel:
    """dw_tile_nhwc over ``dims`` = (N, C, H, W, K, P, Q, pt, pl) of the tensor it reads (x
    named names[0]) and the one it writes (names[2]), the filter names[1]; the forward's
    epilogue, none for a data gradient (``flip``: the filter turned 180 degrees). Unaligned
    tensors (a DLPack view) run the same tiles with scalar accesses."""
    rt = _cuda.runtime()
    cb, th, tw, tq = params["cb"], params["th"], params["tw"], params["tq"]
    tpb = params.get("tpb", 1)
    n, c, _, _, k, p, q, _, _ = dims
    tiles = n * -(-p // th) * -(-q // tw)
    smem = _tile_bytes(g, cb, th, tw, tq, tpb)

    def make(v: int) -> mc.Launch:
        defines = {"DNNCTL_DTYPE": _cuda.DTYPE_CODE[g.dtype], "KR": g.r, "KS": g.s,
                   "STR_H": g.sh, "STR_W": g.sw, "DIL_H": g.dh, "DIL_W": g.dw,
                   "VEC": v, "CB": cb, "TH": th, "TW": tw, "TQ": tq, "TPB": tpb,
                   "PAD_BYTES": _tile_pad_bytes(cb * _esize(g), tq * g.sw), "FLIP": int(flip)}
        fn = load_kernel("conv2d/depthwise_tile.cu", "dw_tile_nhwc", defines, smem)
        return mc.Launch(fn, (-(-tiles // tpb), -(-k // cb), 1),
                         (cb // v * th * tw // tq, 1, 1), smem)

    fast = make(16 // _esize(g))
    codes = _cuda.i32(0, 0) if flip else _cuda.epilogue_codes(g)
    tail = fast.consts(*_cuda.i32(*dims), *codes)
    scalar: list[mc.Launch] = []
    src_name, w_name, dst_name = names

    def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
               attrs: Mapping[str, Any]) -> None:
        src, dst = inputs[src_name], outputs[dst_name]
        run = fast
        if rt.ptr(src) % 16 or rt.ptr(dst) % 16:
            if not scalar:
                scalar.append(make(1))
            run = scalar[0]
        if flip:
            bias = res = dst
        else:
            bias, res = _cuda.epilogue_ptrs(g, dst, inputs)
        run((src, inputs[w_name], dst, bias, res, *tail))

    return kernel


class _TileBase(CudaConv):
    source = "conv2d/depthwise_tile.cu"
    params = {"cb": (16, 32, 64), "th": (4, 8, 16), "tw": (8, 16, 32), "tq": (1, 2, 4),
              "tpb": (1, 2, 4)}

    def supports_geom(self, g: ConvGeom, device: Any) -> Support:
        if g.groups != g.c or g.k != g.c:
            return unsupported("depthwise with one filter per channel only (K == C == groups)")
        if not g.nhwc:
            return unsupported("NHWC only (NCHW: depthwise_planes, depthwise)")
        if g.r > 11 or g.s > 11:
            return unsupported("filters above 11x11 are not unrolled")
        if max(g.sh, g.sw, g.dh, g.dw) > 4:
            return unsupported("stride or dilation above 4")
        if g.k % (16 // _esize(g)):
            return unsupported(f"channels must be a multiple of {16 // _esize(g)} "
                               "(16-byte vectors)")
        return SUPPORTED

    def out_hw(self, g: ConvGeom) -> tuple[int, int]:
        return g.p, g.q

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        g = geometry(problem)
        return _tile_valid(g, params, *self.out_hw(g), device)

    def default_params(self, problem: Problem, device: Any) -> dict[str, Any] | None:
        g = geometry(problem)
        # one tile a block: on the H200 two (the next window staged during this one's taps)
        # ran slower on every layer of bench_depthwise (ConvNeXt-T 7x7 96 @56: 83 us against
        # 72, benchmarks/RESULTS.md); the tuner still times tpb 2 and 4
        wants = [{"cb": 32, "th": 8, "tw": 16, "tq": 4 if g.sw == 1 else 2, "tpb": 1},
                 {"cb": 32, "th": 4, "tw": 16, "tq": 2, "tpb": 1},
                 {"cb": 16, "th": 4, "tw": 8, "tq": 1, "tpb": 1}]
        return self.first_valid(problem, device, wants)


@register_variant
class CudaDepthwiseTile(_TileBase):
    """NHWC depthwise through shared memory: a block stages the input window of a TH x TW
    output tile for CB channels once (DRAM read once per tile, halo included) and its
    threads take every tap from there (kernels/conv2d/depthwise_tile.cu). For large filters
    at large spatial sizes (ConvNeXt's 7x7, EfficientNet's 5x5), where ``depthwise`` re-reads
    each input row once per output row through L1 / L2."""

    name = "depthwise_tile"
    doc = "groups == C == K, NHWC: input window staged in shared memory, unrolled taps"

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        return _tile_kernel(g, params, False, ("x", "w", "y"),
                            (g.n, g.c, g.h, g.w, g.k, g.p, g.q, g.pt, g.pl))


@register_variant
class CudaDgradDepthwiseTile(_TileBase):
    """The data gradient of a stride-1 NHWC depthwise convolution with the same kernel: dx
    is dy correlated with the filter turned 180 degrees (padding (R-1)*d - pt, (S-1)*d - pl
    on top / left), dy's window staged in shared memory."""

    name = "dgrad_depthwise_tile"
    passes = ("dgrad",)
    doc = "dgrad, depthwise stride 1, NHWC: dy window in shared memory, flipped taps"

    def supports_geom(self, g: ConvGeom, device: Any) -> Support:
        if (g.sh, g.sw) != (1, 1):
            return unsupported("stride 1 only (a strided dgrad reads dy at stride phases: "
                               "dgrad_depthwise)")
        return _TileBase.supports_geom(self, g, device)

    def out_hw(self, g: ConvGeom) -> tuple[int, int]:
        return g.h, g.w

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        g = geometry(problem)
        pt, pl = (g.r - 1) * g.dh - g.pt, (g.s - 1) * g.dw - g.pl
        return _tile_kernel(g, params, True, ("dy", "w", "dx"),
                            (g.n, g.k, g.p, g.q, g.c, g.h, g.w, pt, pl))
