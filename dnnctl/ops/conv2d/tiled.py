"""What the conv2d variants on the tiled tensor-core GEMM kernel share (implicit_gemm,
gemm_1x1): the parameter space, the math mode, the device floor and tile legality."""

from __future__ import annotations

from typing import Any, ClassVar

from dnnctl.errors import UnsupportedError
from dnnctl.ops.base import Support, unsupported
from dnnctl.ops.conv2d.cuda_base import CudaConv
from dnnctl.ops.conv2d.op import ConvGeom
from dnnctl.ops.matmul.cupy_variants import TiledGemmParams
from dnnctl.ops.matmul.gemm_launch import TileConfig, math_for, tile_config, tile_ok


class TiledConv(TiledGemmParams, CudaConv):
    """Base of the conv variants that run on kernels/include/dnnctl/gemm_core.cuh."""

    params: ClassVar[dict[str, tuple[Any, ...]]] = {
        "bm": (16, 32, 64, 128, 256), "bn": (32, 64, 128, 256), "bk": (32, 64),
        "warps": (4, 8), "stages": (2, 3, 4, 5), "splitk": (1, 2, 4, 8, 16)}

    @staticmethod
    def _math(g: ConvGeom) -> int:
        return math_for(g.dtype, g.tf32)

    @staticmethod
    def device_unsupported(device: Any) -> Support | None:
        """Why the device cannot run the kernel (cp.async and mma need sm_80), else None."""
        if device.cc_tuple < (8, 0):
            return unsupported(f"needs compute capability >= 8.0 (cp.async, mma); "
                               f"{device.name} is {device.compute_capability}")
        return None

    def tile(self, g: ConvGeom, params: Any, device: Any) -> TileConfig:
        """The tile ``params`` describe; UnsupportedError when it is not legal here."""
        cfg = tile_config(params, self._math(g))
        if cfg is None or not tile_ok(cfg, g.dtype, device):
            raise UnsupportedError(f"conv2d/{self.name}: parameters {dict(params)} do not "
                                   f"form a legal tile on {device.name}")
        return cfg
