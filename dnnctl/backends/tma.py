"""Hopper TMA tensor maps: ``cuTensorMapEncodeTiled`` through the driver API (ctypes).

A tensor map (``CUtensorMap``, 128 opaque bytes) describes a global tensor (its address,
sizes and byte strides), the box one ``cp.async.bulk.tensor`` copies into shared memory, and
the shared-memory swizzle. The kernels take it by value as a ``__grid_constant__`` parameter
(:class:`dnnctl.backends.cuda.Launch` passes ``bytes`` arguments in a 64-byte aligned slot),
so a map is encoded on the host per operand address: :class:`MapCache` memoizes them.

Constants are the values of the driver's ``cuda.h`` (CUtensorMapDataType, ..Swizzle, ..L2promotion,
..FloatOOBfill, ..Interleave). Rules the driver enforces (and :func:`check_spec` checks first,
so that a bad map is a clear error, not a failed launch): rank 1-5, global address 16-byte
aligned, every byte stride a multiple of 16 and below 2^40, sizes 1..2^32, box sizes
1..256, the box's inner extent in bytes at most the swizzle span (128 for 128B swizzle).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dnnctl.errors import KernelLaunchError

# cuda.h: CUtensorMapDataType
DATA_TYPE = {"float16": 6, "float32": 7, "bfloat16": 9}
SWIZZLE_NONE, SWIZZLE_128B = 0, 3  # CUtensorMapSwizzle
L2_PROMOTION_256B = 3  # CUtensorMapL2promotion
OOB_FILL_ZERO = 0  # CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: out-of-bounds elements read as zero
INTERLEAVE_NONE = 0
MAP_BYTES = 128  # CU_TENSOR_MAP_NUM_QWORDS * 8
ELEM_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


@dataclass(frozen=True)
class MapSpec:
    """One tensor map without its address: dims and byte strides (innermost first; strides
    of dims 1..), the box and the swizzle."""

    dtype: str
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: int = SWIZZLE_128B


def check_spec(spec: MapSpec) -> str | None:
    """Why the driver would refuse this map (address aside), else None."""
    rank = len(spec.dims)
    esz = ELEM_BYTES[spec.dtype]
    if not 1 <= rank <= 5 or len(spec.strides) != rank - 1 or len(spec.box) != rank:
        return f"rank {rank} with {len(spec.strides)} strides and a {len(spec.box)}-d box"
    if any(not 1 <= d <= 2**32 for d in spec.dims):
        return f"sizes {spec.dims} outside 1..2^32"
    if any(s % 16 or not 0 < s < 2**40 for s in spec.strides):
        return f"byte strides {spec.strides} must be multiples of 16 below 2^40"
    if any(not 1 <= b <= 256 for b in spec.box):
        return f"box {spec.box} outside 1..256"
    inner = spec.box[0] * esz
    if inner % 16:
        return f"box inner extent {inner} bytes is not a multiple of 16"
    if spec.swizzle == SWIZZLE_128B and inner > 128:
        return f"box inner extent {inner} bytes exceeds the 128-byte swizzle span"
    return None


@functools.cache
def _encoder() -> Any:
    """libcuda's cuTensorMapEncodeTiled, or None (no driver, or one older than CUDA 12)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuTensorMapEncodeTiled
    except (OSError, AttributeError):
        return None
    vp, u32 = ctypes.c_void_p, ctypes.c_uint32
    fn.restype = ctypes.c_int
    fn.argtypes = [vp, ctypes.c_int, u32, vp, vp, vp, vp, vp, ctypes.c_int, ctypes.c_int,
                   ctypes.c_int, ctypes.c_int]
    return fn


def available() -> bool:
    """True when the driver has the tensor-map entry point (no GPU work)."""
    return _encoder() is not None


def encode(spec: MapSpec, address: int) -> bytes:
    """The 128-byte CUtensorMap of ``spec`` over the tensor at ``address``."""
    fn = _encoder()
    if fn is None:
        raise KernelLaunchError("the CUDA driver has no cuTensorMapEncodeTiled",
                                hint="TMA needs a CUDA 12+ driver; use the 'wgmma' variant")
    why = check_spec(spec)
    if why is None and address % 16:
        why = f"global address {address:#x} is not 16-byte aligned"
    if why is not None:
        raise KernelLaunchError(f"tensor map refused: {why}")
    rank = len(spec.dims)
    u64s = ctypes.c_uint64 * rank
    out = (ctypes.c_char * (MAP_BYTES + 64))()  # the map itself is 64-byte aligned
    at = ctypes.addressof(out) + (-ctypes.addressof(out) % 64)
    dims = u64s(*spec.dims)
    strides = (ctypes.c_uint64 * max(rank - 1, 1))(*spec.strides)
    box = (ctypes.c_uint32 * rank)(*spec.box)
    ones = (ctypes.c_uint32 * rank)(*([1] * rank))
    rc = fn(at, DATA_TYPE[spec.dtype], rank, address, dims, strides, box,
            ones, INTERLEAVE_NONE, spec.swizzle, L2_PROMOTION_256B, OOB_FILL_ZERO)
    if rc:
        raise KernelLaunchError(f"cuTensorMapEncodeTiled failed (CUresult {rc}) for {spec}")
    return ctypes.string_at(at, MAP_BYTES)


class MapCache:
    """Encoded maps of one spec, by address (a few dozen kept: weights and the caching
    allocator's blocks repeat)."""

    __slots__ = ("spec", "maps")

    def __init__(self, spec: MapSpec) -> None:
        why = check_spec(spec)
        if why is not None:
            raise KernelLaunchError(f"tensor map refused: {why}")
        self.spec = spec
        self.maps: dict[int, bytes] = {}

    def __call__(self, address: int) -> bytes:
        got = self.maps.get(address)
        if got is None:
            if len(self.maps) >= 64:
                self.maps.clear()
            got = self.maps[address] = encode(self.spec, address)
        return got


def operand_spec(dtype: str, *, inner: int, outer: int, ld: int, batch: int,
                 batch_stride: int, box: Sequence[int]) -> MapSpec:
    """A (batch, outer, inner) row-major operand (inner contiguous, rows ``ld`` elements
    apart, batches ``batch_stride`` apart) as a 3-d map with a 2-d box (inner, outer)."""
    esz = ELEM_BYTES[dtype]
    return MapSpec(dtype, (inner, outer, batch), (ld * esz, max(batch_stride, 1) * esz),
                   (int(box[0]), int(box[1]), 1))
