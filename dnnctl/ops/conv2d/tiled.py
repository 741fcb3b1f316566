"""What the conv2d variants on the tiled tensor-core GEMM kernels share.

:class:`TiledConv` (implicit_gemm, gemm_1x1, the wgrad implicit GEMMs): the parameter space,
the math mode, the device floor and tile legality. The launch pieces they and
implicit_gemm_wgmma share: the split-K plan, the epilogue defines, the geometry arguments of
the patch gather, the channel padding of odd 16-bit channel counts, and one call of a main
kernel with its split-K finish (:func:`run_fused`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

from dnnctl.backends import cuda
from dnnctl.errors import UnsupportedError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.base import SUPPORTED, Support, np_dtype, unsupported
from dnnctl.ops.conv2d._cuda import res_mode
from dnnctl.ops.conv2d.cuda_base import CudaConv, Workspace
from dnnctl.ops.conv2d.op import ConvGeom
from dnnctl.ops.matmul.cupy_variants import TiledGemmParams
from dnnctl.ops.matmul.gemm_launch import (
    BIAS_NONE,
    DTYPE_CODES,
    MAX_GRID_Z,
    OUT_PARTIAL,
    OUT_STORE,
    TileConfig,
    aligned,
    array_dtype,
    finish_kernel,
    finish_launch,
    load_kernel,
    math_for,
    ptr,
    split_plan,
    tile_config,
    tile_ok,
)


class TiledConv(TiledGemmParams, CudaConv):
    """Base of the conv variants that run on kernels/include/dnnctl/gemm_core.cuh."""

    params: ClassVar[dict[str, tuple[Any, ...]]] = {
        "bm": (16, 32, 64, 128, 256), "bn": (32, 64, 128, 256), "bk": (32, 64),
        "warps": (4, 8), "stages": (2, 3, 4, 5), "splitk": (1, 2, 4, 8, 16)}

    @staticmethod
    def _math(g: ConvGeom) -> int:
        return math_for(g.dtype, g.tf32)

    def supports_geom(self, g: ConvGeom, device: Any) -> Support:
        if device.cc_tuple < (8, 0):  # cp.async and mma
            return unsupported(f"needs compute capability >= 8.0 (cp.async, mma); "
                               f"{device.name} is {device.compute_capability}")
        no = self.geom_unsupported(g, device)
        return SUPPORTED if no is None else no

    def geom_unsupported(self, g: ConvGeom, device: Any) -> Support | None:
        """Why the kernel does not take ``g`` on a device it can run on, else None."""
        return None

    def tile(self, g: ConvGeom, params: Any, device: Any) -> TileConfig:
        """The tile ``params`` describe; UnsupportedError when it is not legal here."""
        cfg = tile_config(params, self._math(g))
        if cfg is None or not tile_ok(cfg, g.dtype, device):
            raise UnsupportedError(f"conv2d/{self.name}: parameters {dict(params)} do not "
                                   f"form a legal tile on {device.name}")
        return cfg


def groups_unsupported(g: ConvGeom, depthwise_hint: str) -> Support | None:
    """Why an implicit GEMM (one grid z slice per group) does not take ``g``'s groups:
    depthwise (one channel per group) or more groups than the grid holds; else None."""
    if g.groups > 1 and g.depthwise:
        return unsupported(f"depthwise: {depthwise_hint}")
    if g.groups > MAX_GRID_Z:
        return unsupported(f"{g.groups} groups exceed the grid limit {MAX_GRID_Z}")
    return None


def split_k(k: int, bk: int, splitk: int) -> tuple[int, int]:
    """(kchunk, splits) of a reduction of length ``k``: the whole of it in one piece when
    it does not split."""
    kchunk, splits = split_plan(k, bk, splitk)
    return (kchunk, splits) if splits > 1 else (k, 1)


def store_mode(g: ConvGeom, splits: int) -> tuple[int, bool]:
    """(EPI_OUT, EPI_PAIR) of a forward implicit GEMM: split-K partials into fp32 slabs of
    Kg columns, or the output itself (column pairs only in NHWC, K columns per row)."""
    if splits > 1:
        return OUT_PARTIAL, g.kg % 2 == 0
    return OUT_STORE, g.nhwc and g.k % 2 == 0 and (g.groups == 1 or g.kg % 2 == 0)


def epilogue_defines(g: ConvGeom, out_mode: int, pair: bool, act: int,
                     bias_mode: int) -> dict[str, int]:
    """The dtype and EPI_* defines of a fused-epilogue kernel; a partial store leaves bias,
    activation and residual to the split-K finish."""
    store = out_mode == OUT_STORE
    return {"DNNCTL_DTYPE": DTYPE_CODES[g.dtype], "EPI_OUT": out_mode, "EPI_PAIR": int(pair),
            "EPI_ACT": act if store else 0, "EPI_BIAS": bias_mode if store else BIAS_NONE,
            "EPI_RES": res_mode(g) if store else 0}


def tile_defines(cfg: TileConfig, vec_a: int, vec_b: int) -> dict[str, int]:
    """The GEMM_* defines of a gemm_core.cuh tile with its operand vector widths."""
    return {"GEMM_MATH": cfg.math, "GEMM_BM": cfg.bm, "GEMM_BN": cfg.bn, "GEMM_BK": cfg.bk,
            "GEMM_WM": cfg.wm, "GEMM_WN": cfg.wn, "GEMM_STAGES": cfg.stages,
            "GEMM_VEC_A": vec_a, "GEMM_VEC_B": vec_b}


def gather_dims(g: ConvGeom, c: int, splits: int, kchunk: int) -> tuple[np.int32, ...]:
    """The geometry arguments of the implicit-GEMM patch gathers (``c`` input channels as
    the kernel sees them, padded or not), then the split-K plan."""
    return tuple(np.int32(v) for v in (g.n, c, g.h, g.w, g.k, g.r, g.s, g.p, g.q, g.sh, g.sw,
                                       g.pt, g.pl, g.dh, g.dw, g.groups, splits, kchunk))


def padded_workspace(g: ConvGeom, cgp: int, splits: int) -> Workspace:
    """Input and weight with ``cgp`` channels per group when that pads them (``x``, ``w``),
    then the split-K slabs (``ws``)."""
    dt = np_dtype(g.dtype)
    pieces: list[tuple[str, int, Any]] = []
    if cgp != g.cg:
        pieces += [("x", g.n * g.h * g.w * g.groups * cgp, dt), ("w", g.k * g.r * g.s * cgp, dt)]
    if splits > 1:
        pieces.append(("ws", splits * g.groups * g.npq * g.kg, np.float32))
    return Workspace(pieces)


def channel_pad(g: ConvGeom, cgp: int, sm_count: int
                ) -> Callable[[Mapping[str, Any], Mapping[str, Any]], tuple[Any, Any]]:
    """``pad(inputs, buf) -> (x, w)``: x and w with their ``g.cg`` channels per group
    zero-padded to ``cgp`` in the workspace pieces ``buf["x"]`` / ``buf["w"]``
    (kernels/conv2d/implicit_gemm_pad.cu)."""
    fn = load_kernel("conv2d/implicit_gemm_pad.cu", "pad_channels",
                     {"DNNCTL_DTYPE": DTYPE_CODES[g.dtype]}, 0)

    def launch(rows: int, groups: int) -> tuple[mc.Launch, tuple[Any, ...]]:
        grid = (max(1, min(-(-rows * groups // 256), sm_count * 16)), 1, 1)
        return mc.Launch(fn, grid, (256, 1, 1)), (np.int64(rows), *(
            np.int32(v) for v in (groups, g.cg, cgp)))

    (run_x, args_x), (run_w, args_w) = launch(g.n * g.h * g.w, g.groups), launch(
        g.k * g.r * g.s, 1)

    def pad(inputs: Mapping[str, Any], buf: Mapping[str, Any]) -> tuple[Any, Any]:
        run_x((inputs["x"], buf["x"], *args_x))
        run_w((inputs["w"], buf["w"], *args_w))
        return buf["x"], buf["w"]

    return pad


def forward_finish(g: ConvGeom, splits: int, act: int, bias_mode: int,
                   sm_count: int) -> Callable[[Any, Any, Any, Any], None] | None:
    """The split-K finish of a forward implicit GEMM (sum the fp32 slabs of Kg columns per
    group, then the epilogue into y in its layout); None without a split."""
    if splits == 1:
        return None
    pq = g.p * g.q
    fn = finish_kernel(g.dtype, act, bias_mode, res_mode(g), 0 if g.nhwc else 1)
    return finish_launch(fn, m=g.npq, n=g.kg, batch=g.groups, splits=splits, ldc=g.k,
                         sc=g.kg if g.nhwc else g.kg * pq, s_bias=g.kg, pq=pq,
                         img_stride=g.k * pq, sm_count=sm_count)


def run_fused(main: mc.Launch, finish: Callable[..., None] | None, elem_bytes: int,
              x: Any, w: Any, inputs: Mapping[str, Any], y: Any, ws: Any,
              dims: tuple[Any, ...]) -> None:
    """One call of a fused-epilogue conv GEMM: the main kernel (into an aligned temporary
    when y cannot take its paired stores), the split-K finish when there is one, and the
    copy back."""
    y_out = y if ptr(y) % (2 * elem_bytes) == 0 else cuda.workspace(tuple(y.shape),
                                                                    array_dtype(y))
    res = aligned(inputs.get("residual"), 2 * elem_bytes)
    bias = inputs.get("bias")
    main((x, w, y_out, bias, res, ws, *dims))
    if finish is not None:
        finish(ws, y_out, bias, res)
    if y_out is not y:
        cuda.copy(y, y_out)
