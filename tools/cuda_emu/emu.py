"""Run dnnctl's CUDA kernels on the CPU: a stand-in for the ``cupy`` backend (dev tool).

    from tools.cuda_emu.emu import install
    install()                       # get_backend("cupy") is now the emulator; xp is numpy
    ... build and call variants exactly as on the GPU ...

Kernels are compiled with g++ (``-DDNNCTL_EMU``, headers from CUDA's include dir for the
fp16 / bf16 types) into a shared library per (source, defines), cached under
``$DNNCTL_EMU_CACHE`` (default /tmp/dnnctl_emu). A launch runs every block, every thread as a
fiber, and checks global bounds, shared-memory races, cp.async waits and the argument list
against the kernel signature. Errors raise :class:`EmuError` with the first problem found.
Slow (a few million mma per second): use small problems.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dnnctl.backends.base import DeviceInfo
from dnnctl.backends.numpy_backend import NumpyBackend
from dnnctl.backends.registry import _BACKENDS
from dnnctl.resources import kernels_dir

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("DNNCTL_EMU_CACHE", "/tmp/dnnctl_emu"))
CUDA_INC = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
_KERNEL_RE = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?'
                        r"(\w+)\s*\(")


class EmuError(RuntimeError):
    """A kernel misbehaved under emulation (out of bounds, race, bad arguments, ...)."""


_MAP_MAGIC = 0x544D41454D55  # "TMAEMU": emu_tma_runtime.h's EmuMap


def emu_tensor_map(spec: Any, address: int) -> bytes:
    """The emulator's 128-byte tensor map for a dnnctl.backends.tma.MapSpec (what
    cuTensorMapEncodeTiled is on the GPU); checked by the same rules first."""
    from dnnctl.backends import tma

    why = tma.check_spec(spec)
    if why is None and address % 16:
        why = f"global address {address:#x} is not 16-byte aligned"
    if why is not None or len(spec.dims) != 3:
        raise EmuError(f"tensor map refused: {why or 'the emulator copies 3-d boxes'}")
    words = [_MAP_MAGIC, address, *spec.dims, *spec.strides, *spec.box,
             tma.ELEM_BYTES[spec.dtype], spec.swizzle]
    return np.array(words + [0] * (16 - len(words)), dtype=np.uint64).tobytes()


def _scalar(v: Any) -> tuple[Any, np.ndarray | None]:
    if v is None:  # CuPy passes None as a null pointer
        return ctypes.c_void_p(0), None
    if isinstance(v, bytes):  # a by-value struct (a tensor map): a 64-byte aligned copy
        raw = ctypes.create_string_buffer(len(v) + 64)
        at = ctypes.addressof(raw) + (-ctypes.addressof(raw) % 64)
        ctypes.memmove(at, v, len(v))
        struct_arg = (ctypes.c_char * len(v)).from_address(at)
        struct_arg._keep = raw  # type: ignore[attr-defined]
        return struct_arg, None
    if isinstance(v, np.ndarray):  # (ctypes.data refuses ml_dtypes' bfloat16)
        return ctypes.c_void_p(v.__array_interface__["data"][0]), v
    if isinstance(v, np.generic):
        ct = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64,
              np.dtype(np.uint32): ctypes.c_uint32, np.dtype(np.uint64): ctypes.c_uint64,
              np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}
        kind = ct.get(v.dtype)
        if kind is not None:
            return kind(v.item()), None
    raise EmuError(f"kernel argument {v!r} ({type(v).__name__}) is not an array or a numpy "
                   "scalar of a fixed width (CuPy would have to guess its C type)")


def _buffer(arr: np.ndarray) -> tuple[int, int]:
    base = arr
    while isinstance(base.base, np.ndarray):
        base = base.base
    return base.__array_interface__["data"][0], base.nbytes


class EmuFunction:
    """What ``RawModule.get_function`` returns: call as (grid, block, args, shared_mem=)."""

    def __init__(self, lib: ctypes.CDLL, name: str):
        self._lib = lib
        self._fn = getattr(lib, f"emu_launch_{name}")
        self.name = name
        self.max_dynamic_shared_size_bytes = 0
        self.seed = 1

    def __call__(self, grid: Sequence[int], block: Sequence[int], args: Sequence[Any],
                 shared_mem: int = 0, stream: Any = None, cooperative: bool = False) -> None:
        """``cooperative``: every block runs together (cuLaunchCooperativeKernel), so the
        kernel may wait at a grid-wide barrier."""
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        if shared_mem > max(48 * 1024, self.max_dynamic_shared_size_bytes):
            raise EmuError(f"{self.name}: {shared_mem} bytes of dynamic shared memory need "
                           "max_dynamic_shared_size_bytes set first (CUDA refuses the launch)")
        if shared_mem > 227 * 1024:
            raise EmuError(f"{self.name}: {shared_mem} bytes of shared memory exceed 227 KB")
        if block[0] * block[1] * block[2] > 1024:
            raise EmuError(f"{self.name}: block {block} has more than 1024 threads")
        vals, arrays = [], []
        for a in args:
            v, arr = _scalar(a)
            vals.append(v)
            if arr is not None:
                arrays.append(arr)
        ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        sizes = (ctypes.c_size_t * len(vals))(*[ctypes.sizeof(v) for v in vals])
        bufs = [_buffer(a) for a in arrays]
        for a in args:  # a tensor map's tensor counts as a buffer of the launch
            if isinstance(a, bytes) and len(a) == 128:
                w = np.frombuffer(a, dtype=np.uint64)
                if int(w[0]) == _MAP_MAGIC:  # address, dims[3], strides[2]
                    bufs.append((int(w[1]), int(w[6]) * int(w[4])))
        bptr = (ctypes.c_void_p * max(1, len(bufs)))(*[b[0] for b in bufs])
        bsz = (ctypes.c_size_t * max(1, len(bufs)))(*[b[1] for b in bufs])
        g = (ctypes.c_uint * 3)(*grid)
        b = (ctypes.c_uint * 3)(*block)
        err = ctypes.create_string_buffer(4096)
        self._lib.emu_set_coop(1 if cooperative else 0)
        rc = self._fn(g, b, ctypes.c_size_t(shared_mem), ptrs, sizes, len(vals), bptr, bsz,
                      len(bufs), ctypes.c_uint(self.seed), err, ctypes.c_size_t(4096))
        if rc:
            raise EmuError(f"{self.name} grid={grid} block={block}: {err.value.decode()}")


class EmuModule:
    def __init__(self, lib: ctypes.CDLL, names: list[str]):
        self._lib = lib
        self._names = names

    def get_function(self, name: str) -> EmuFunction:
        if name not in self._names:
            raise EmuError(f"no kernel {name!r} (have {self._names})")
        return EmuFunction(self._lib, name)


def compile_module(source: str, defines: Mapping[str, Any] | None = None) -> EmuModule:
    """g++-compile kernels/<source> with ``defines`` for the emulator (cached)."""
    path = kernels_dir() / source
    text = path.read_text()
    names = _KERNEL_RE.findall(text)
    if not names:
        raise EmuError(f"{source}: no extern \"C\" __global__ kernels found")
    defs = [f"-D{k}={int(v) if isinstance(v, bool) else v}"
            for k, v in sorted((defines or {}).items())]
    digest = hashlib.sha256()
    for f in [path, *sorted((kernels_dir() / "include").rglob("*")), *sorted(HERE.glob("*.h"))]:
        if f.is_file():
            digest.update(f.name.encode() + f.read_bytes())
    digest.update(" ".join(defs).encode())
    CACHE.mkdir(parents=True, exist_ok=True)
    so = CACHE / f"{path.stem}-{digest.hexdigest()[:16]}.so"
    if not so.exists():
        harness = CACHE / f"{so.stem}.cpp"
        lines = [f'#include "{path}"', '#include "emu_runtime.h"']
        for n in names:
            lines.append(
                f'extern "C" int emu_launch_{n}(const unsigned* g, const unsigned* b, '
                "size_t smem, void** args, const size_t* sizes, int nargs, "
                "const void* const* bufs, const size_t* bb, int nb, unsigned seed, char* err, "
                f"size_t errlen) {{ return emu::launch(&{n}, g, b, smem, args, sizes, nargs, "
                "bufs, bb, nb, seed, err, errlen); }")
        harness.write_text("\n".join(lines) + "\n")
        cmd = ["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-w", "-include",
               str(HERE / "emu_prelude.h"), "-DDNNCTL_EMU", "-DDNNCTL_HEADERS=0",
               f"-I{kernels_dir() / 'include'}", f"-I{HERE}", f"-I{CUDA_INC}", *defs,
               str(harness), "-o", str(so) + ".tmp"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode:
            raise EmuError(f"g++ failed for {source} {' '.join(defs)}:\n{res.stderr[-6000:]}")
        os.replace(str(so) + ".tmp", so)
    return EmuModule(ctypes.CDLL(str(so)), names)


class EmuBackend(NumpyBackend):
    """The ``cupy`` backend's interface over numpy arrays and emulated kernels."""

    name = "cupy"

    def device(self, index: int = 0) -> DeviceInfo:
        return DeviceInfo(backend="cupy", index=0, name="dnnctl CPU emulator (H200-like)",
                          compute_capability="9.0", sm_count=132, driver="emu",
                          cuda_runtime="13.0", memory_bytes=1 << 34, l2_bytes=60 << 20,
                          smem_per_block_optin=227 * 1024)

    def compile_module(self, source: str, *, defines: Mapping[str, Any] | None = None,
                       name_expressions: Sequence[str] = (), options: Sequence[str] = (),
                       device: int | None = None) -> EmuModule:
        if name_expressions:
            raise EmuError("the emulator only supports extern \"C\" kernels")
        return compile_module(source, defines)


def install() -> EmuBackend:
    """Make get_backend('cupy') return the emulator in this process."""
    be = EmuBackend()
    _BACKENDS["cupy"] = be
    return be
