"""cuBLAS through ctypes, on handles owned here (one per device, with a workspace, so calls
also run under CUDA-graph capture), on the stream of the call in flight
(:data:`dnnctl.backends.cuda.STATE`). With the native launcher (:mod:`dnnctl.backends.native`)
a GEMM is one C call of integer arguments instead of ctypes converting 23 of them.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib.util
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from dnnctl.backends import cuda
from dnnctl.errors import KernelLaunchError

_CUBLAS_WORKSPACE = 32 << 20  # bytes; set on our handles so no call allocates (graph capture)


def library_names(stem: str) -> list[str]:
    """Where a cuBLAS-family library (``libcublas``, ``libcublasLt``) may be: its sonames,
    then the NVIDIA wheels torch and CuPy install (``nvidia/cu13/lib``, ``nvidia/cublas/lib``,
    ``nvidia/cu12/lib``)."""
    names = [f"{stem}.so.13", f"{stem}.so.12", f"{stem}.so"]
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for sub in ("cu13/lib", "cublas/lib", "cu12/lib"):
            names += sorted(glob.glob(os.path.join(root, sub, f"{stem}.so*")), reverse=True)
    return names


def load_library(stem: str, loader: Callable[[str], Any] = ctypes.CDLL) -> Any | None:
    """The first of :func:`library_names` that loads (CuPy's cuBLAS, which links both, is
    loaded first so its copy wins), or None."""
    try:
        from cupy_backends.cuda.libs import cublas as _linked  # noqa: F401 - loads libcublas
    except Exception:  # noqa: BLE001 - no CuPy: the wheels / system copy
        pass
    for name in library_names(stem):
        try:
            return loader(name)
        except OSError:
            continue
    return None


class _Cublas:
    """cuBLAS through ctypes with one handle per device, owned here (CuPy's Python wrapper
    refuses calls during CUDA-graph capture; the library itself supports them once the
    handle has a workspace)."""

    def __init__(self) -> None:
        lib = load_library("libcublas", ctypes.PyDLL)
        if lib is None:
            raise KernelLaunchError("libcublas cannot be loaded",
                                    hint="install the CUDA runtime wheels CuPy needs")
        self.lib = lib
        vp, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        self.gemm = lib.cublasGemmStridedBatchedEx
        self.gemm.restype = i32
        self.gemm.argtypes = [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, i64, vp, i32, i32,
                              i64, vp, vp, i32, i32, i64, i32, i32, i32]
        self.set_stream = lib.cublasSetStream_v2
        self.set_stream.restype, self.set_stream.argtypes = i32, [vp, vp]
        self.handles: dict[int, tuple[int, Any]] = {}
        self.streams: dict[int, int | None] = {}  # handle -> the stream last set on it
        self.gemm_addr = ctypes.cast(self.gemm, ctypes.c_void_p).value

    def handle(self, device: int) -> int:
        got = self.handles.get(device)
        if got is None:
            h = ctypes.c_void_p()
            rc = self.lib.cublasCreate_v2(ctypes.byref(h))
            if rc:
                raise KernelLaunchError(f"cublasCreate failed (status {rc})")
            ws = cuda.kept(_CUBLAS_WORKSPACE, device)
            self.lib.cublasSetWorkspace_v2(h, ctypes.c_void_p(ws.data.ptr),
                                           ctypes.c_size_t(_CUBLAS_WORKSPACE))
            self.lib.cublasSetPointerMode_v2(h, 0)  # host alpha / beta
            got = self.handles[device] = (int(h.value or 0), ws)
        return got[0]


@functools.cache
def _cublas() -> _Cublas:
    return _Cublas()


def gemm_strided_batched(transa: int, transb: int, m: int, n: int, k: int, alpha: int,
                         a: int, a_type: int, lda: int, stride_a: int,
                         b: int, b_type: int, ldb: int, stride_b: int, beta: int,
                         c: int, c_type: int, ldc: int, stride_c: int, batch: int,
                         compute: int, algo: int = -1) -> None:
    """cublasGemmStridedBatchedEx (column-major; pointers as ints, alpha / beta host
    pointers) on the call's stream with this device's handle."""
    lib = _cublas()
    handle = lib.handle(cuda.get_device())
    stream = cuda.current_stream() or None
    if lib.streams.get(handle, -1) != stream:
        lib.set_stream(handle, stream)
        lib.streams[handle] = stream
    args = (handle, transa, transb, m, n, k, alpha, a, a_type, lda, stride_a, b, b_type,
            ldb, stride_b, beta, c, c_type, ldc, stride_c, batch, compute, algo)
    nat = cuda.native()
    if nat is not None and cuda.INT_ABI:  # one C call: no ctypes conversion of 23 arguments
        rc = nat.call_ints(lib.gemm_addr, *args)
    else:
        rc = lib.gemm(*args)
    if rc:
        raise KernelLaunchError(f"cublasGemmStridedBatchedEx failed (status {rc}) for "
                                f"m={m} n={n} k={k} batch={batch}")


_HOST_SCALARS: dict[tuple[Any, float], np.ndarray] = {}


def host_scalar(scalar: Any, value: float) -> int:
    """The address of a one-element host array holding ``value`` (a host-mode alpha /
    beta), made once per (type, value) and kept for good: cuBLAS reads it when the call is
    made, so one array serves every call (two fresh arrays a call cost ~2 us of host
    time)."""
    got = _HOST_SCALARS.get((scalar, value))
    if got is None:
        got = _HOST_SCALARS[(scalar, value)] = np.full(1, value, scalar)
    return got.ctypes.data
