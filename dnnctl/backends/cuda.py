"""The one place that talks to CUDA at run time: launches, streams, devices, scratch, cuBLAS.

Kernels are compiled by NVRTC through the cupy backend (``compile_module``, cached in memory
and on disk); everything a *call* does goes through this module:

* :class:`Launch` — one kernel with its grid, block and shared memory fixed at build time,
  launched by ``cuLaunchKernel`` through ctypes with a parameter block laid out once. Array
  arguments may be CuPy arrays, torch CUDA tensors or raw pointers (ints): a launch reads
  their addresses, never their contents, so a torch tensor is used by its pointer with no
  DLPack exchange. Measured on the H200 (benchmarks/bench_launch.py): ctypes 5.27 us a call,
  CuPy's RawKernel 5.20, cuda-bindings 5.26 — the driver's own cost dominates; ctypes was
  chosen because it takes the stream as a plain handle and needs no private CuPy module.
  Calls hold the GIL (``PyDLL``), so two threads never interleave one parameter block.
* the call state (:data:`STATE`): the stream the current call launches on (torch's current
  stream for torch tensors, CuPy's for CuPy arrays) and the allocator its per-call scratch
  comes from (torch's caching allocator for torch callers, so CUDA-graph capture keeps
  scratch in the graph's pool). The dispatcher sets both for the duration of one call.
* cuBLAS and cuBLASLt live next door (:mod:`dnnctl.backends.cublas`,
  :mod:`dnnctl.backends.cublaslt`), on handles owned there, launched on this call state's
  stream.
* :func:`ptr` — the device address of any array kind the kernels see.

The CPU emulator used by the unit tests stands in for CuPy with plain Python callables:
a :class:`Launch` of such a function calls it with the arguments as given.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import platform
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from dnnctl.errors import KernelLaunchError

# ----------------------------------------------------------------------------- call state


class _State(threading.local):
    """Per-thread state of the call in flight (set by the dispatcher)."""

    def __init__(self) -> None:
        self.stream: int | None = None  # None: CuPy's current stream
        self.alloc: Callable[[tuple[int, ...], Any], Any] | None = None  # None: CuPy
        # the caller's own allocator (torch tensors), for buffers only kernels read
        self.raw: Callable[[tuple[int, ...], Any], Any] | None = None
        self.rec: Recorder | None = None  # the call being recorded for replay, if any


class Recorder:
    """What one call does on the device, kept for :mod:`dnnctl.backends.replay`: each
    launch with its arguments, each per-call buffer (:func:`scratch`, :func:`workspace`),
    and ``foreign``: the first thing done that is no launch (a copy, a fill), which makes
    the call one that cannot be replayed."""

    __slots__ = ("launches", "temps", "foreign")

    def __init__(self) -> None:
        self.launches: list[tuple[Launch, tuple[Any, ...]]] = []
        self.temps: list[Any] = []
        self.foreign: str | None = None

    def refuse(self, what: str) -> None:
        if self.foreign is None:
            self.foreign = what


def refuse(what: str) -> None:
    """Mark the call being recorded on this thread, if one is, as one that cannot be
    replayed (a step done outside the launches and library calls a recording holds)."""
    rec = STATE.rec
    if rec is not None:
        rec.refuse(what)


@contextlib.contextmanager
def recording(rec: Recorder) -> Iterator[Recorder]:
    """Record what the calls inside do into ``rec`` (this thread)."""
    saved = STATE.rec
    STATE.rec = rec
    try:
        yield rec
    finally:
        STATE.rec = saved


STATE = _State()


def current_stream() -> int:
    """The stream handle the call in flight launches on."""
    s = STATE.stream
    if s is not None:
        return s
    try:
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)
    except Exception:  # noqa: BLE001 - the CPU emulator has no streams
        return 0


def capturing() -> bool:
    """Whether the call in flight's stream is being captured into a CUDA graph (a torch
    caller's ``torch.cuda.graph``). The legacy default stream never is: no query there."""
    s = STATE.stream
    if not s:
        return False
    try:
        import cupy

        return cupy.cuda.runtime.streamIsCapturing(s) != 0
    except Exception:  # noqa: BLE001 - no CUDA runtime (the CPU emulator): never captured
        return False


def _shape(shape: int | tuple[int, ...]) -> tuple[int, ...]:
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape)


def scratch(shape: int | tuple[int, ...], dtype: Any, xp: Any = None) -> Any:
    """A per-call device buffer (CuPy array) from the caller's allocator.

    For a torch caller the memory comes from torch's caching allocator (so it is ordered on
    torch's stream and, under CUDA-graph capture, lives in the graph's pool); otherwise from
    ``xp`` (the arrays' module), else CuPy's pool (or NumPy, where the CPU emulator stands
    in for CuPy)."""
    shp = _shape(shape)
    alloc = STATE.alloc
    if alloc is not None:
        buf = alloc(shp, np.dtype(dtype))
    else:
        if xp is None:
            from dnnctl.backends.registry import get_backend

            xp = get_backend("cupy").xp
        buf = xp.empty(shp, dtype=dtype)
    rec = STATE.rec
    if rec is not None:
        rec.temps.append(buf)
    return buf


def workspace(shape: int | tuple[int, ...], dtype: Any) -> Any:
    """A per-call device buffer that only kernel launches and :func:`copy` touch (they read
    its address): the caller's own array kind (a torch tensor for a torch caller, with no
    CuPy view made over it), else :func:`scratch`."""
    raw = STATE.raw
    if raw is not None:
        buf = raw(_shape(shape), np.dtype(dtype))
        rec = STATE.rec
        if rec is not None:
            rec.temps.append(buf)
        return buf
    return scratch(shape, dtype)


def kept(nbytes: int, device: int | None = None) -> Any:
    """A CuPy uint8 buffer a kernel or library handle keeps across calls (a workspace,
    self-resetting counters): from CuPy's own pool, never from the allocator a call in
    flight made current (a torch caller's, whose block may belong to a CUDA graph's
    private pool and be reused once that graph is gone)."""
    import cupy

    n = max(1, int(nbytes))
    with cupy.cuda.Device(cupy.cuda.runtime.getDevice() if device is None else device):
        buf = cupy.ndarray((n,), dtype=np.uint8, memptr=cupy.get_default_memory_pool().malloc(n))
    KEPT.append((int(buf.data.ptr), n))
    return buf


# (address, bytes) of every kept buffer: addresses a recorded call may keep as they are
# (dnnctl.backends.replay); a kernel's workspace lives as long as the kernel
KEPT: list[tuple[int, int]] = []


def scratch_zeros(shape: int | tuple[int, ...], dtype: Any) -> Any:
    buf = scratch(shape, dtype)
    refuse("a buffer filled with zeros")
    buf.fill(0)
    return buf


# ----------------------------------------------------------------------------- addresses


def _cupy_ptr(a: Any) -> int:
    return a.data.ptr


def _numpy_ptr(a: Any) -> int:
    return a.__array_interface__["data"][0]


def _none_ptr(a: Any) -> int:
    return 0


_PTR: dict[type, Callable[[Any], int]] = {type(None): _none_ptr, np.ndarray: _numpy_ptr,
                                          int: int, bool: int}


def _same(a: Any) -> Any:
    return a


_PTR[bytes] = _same  # a by-value struct argument (a TMA tensor map) packs as it is
for _scalar in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                np.uint64, np.float32, np.float64, float):
    _PTR[_scalar] = _same  # scalars pass as they are (packed by their dtype)


def _ptr_getter(cls: type, sample: Any = None) -> Callable[[Any], int]:
    fn = _PTR.get(cls)
    if fn is not None:
        return fn
    if issubclass(cls, (np.generic, float)):
        _PTR[cls] = _same
        return _same
    mod = cls.__module__
    if mod.startswith("cupy") or hasattr(getattr(sample, "data", None), "ptr"):
        fn = _cupy_ptr  # CuPy, or anything shaped like it (a test's stand-in)
    elif mod.startswith("torch"):
        import torch

        fn = torch.Tensor.data_ptr
    elif hasattr(cls, "data_ptr"):
        fn = cls.data_ptr  # type: ignore[attr-defined]
    elif hasattr(cls, "__cuda_array_interface__"):
        def fn(a: Any) -> int:
            return int(a.__cuda_array_interface__["data"][0])
    else:
        raise KernelLaunchError(f"cannot take the device address of a {cls.__name__}",
                                hint="pass CuPy arrays or torch CUDA tensors")
    _PTR[cls] = fn
    return fn


def ptr(a: Any) -> int:
    """Device (or, for NumPy, host) address of an array's first element; 0 for None."""
    fn = _PTR.get(a.__class__)
    if fn is None:
        fn = _ptr_getter(a.__class__, a)
    return fn(a)


# ----------------------------------------------------------------------------- launches

_SLOT = 8  # every parameter gets an 8-byte slot (CUDA needs natural alignment only)
_FORMATS = {np.dtype(np.int32): "i4x", np.dtype(np.uint32): "I4x", np.dtype(np.int64): "q",
            np.dtype(np.uint64): "Q", np.dtype(np.float32): "f4x",
            np.dtype(np.float64): "d", np.dtype(np.int16): "h6x", np.dtype(np.uint8): "B7x",
            np.dtype(np.int8): "b7x"}


@functools.cache
def _driver() -> Any:
    """libcuda's cuLaunchKernel (called with the GIL held), cuGetErrorName and
    cuLaunchCooperativeKernel."""
    lib = ctypes.PyDLL("libcuda.so.1")
    fn = lib.cuLaunchKernel  # called with ctypes objects made once per Launch (no argtypes)
    fn.restype = ctypes.c_int
    name = lib.cuGetErrorName
    name.restype = ctypes.c_int
    name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    coop = lib.cuLaunchCooperativeKernel  # cuLaunchKernel's arguments less ``extra``
    coop.restype = ctypes.c_int
    return fn, name, coop


class _LazyLaunch:
    """cuLaunchKernel, resolved on first use (``import dnnctl`` needs no libcuda)."""

    def __call__(self, *args: Any) -> int:
        global _LAUNCH
        _LAUNCH = _driver()[0]
        return _LAUNCH(*args)


_LAUNCH: Any = _LazyLaunch()
_UNSET: Any = object()
# call_ints passes every argument in a 64-bit slot: right for the x86-64 and AArch64 ABIs
INT_ABI = platform.machine().lower() in ("x86_64", "amd64", "aarch64", "arm64")
_NATIVE: Any = _UNSET  # the native launcher (dnnctl.backends.native), None: ctypes
_STREAMS: dict[int, Any] = {}


def _stream_arg(stream: int) -> Any:
    """A ctypes stream argument per handle value, made once."""
    arg = _STREAMS.get(stream)
    if arg is None:
        if len(_STREAMS) > 256:
            _STREAMS.clear()
        arg = _STREAMS[stream] = ctypes.c_void_p(stream or None)
    return arg


def _error_name(rc: int) -> str:
    text = ctypes.c_char_p()
    try:
        _driver()[1](rc, ctypes.byref(text))
    except Exception:  # noqa: BLE001
        return f"CUDA error {rc}"
    return (text.value or b"").decode() or f"CUDA error {rc}"


def _kind(a: Any) -> str:
    """One argument's kind: its struct format's first letter; 'P' for pointer-like, 'S' for
    a by-value struct (bytes)."""
    if isinstance(a, bytes):
        return "S"
    f = _arg_format(a)
    return "P" if f == "Q" and not isinstance(a, np.generic) else f[0]


def _kinds(args: Sequence[Any]) -> bytes:
    """The native path's kind byte per argument (:func:`_kind`); empty where an argument is
    one only the ctypes path takes."""
    if any(isinstance(a, bytes) for a in args):
        return b""  # a by-value struct (a TMA tensor map): the ctypes path lays those out
    return "".join(map(_kind, args)).encode()


def _native_module() -> Any:
    """The native launcher bound to this process's cuLaunchKernel, or None (ctypes)."""
    from dnnctl.backends import native

    mod = native.module()
    if mod is None:
        return None
    try:
        addr = ctypes.cast(_driver()[0], ctypes.c_void_p).value
        coop = ctypes.cast(_driver()[2], ctypes.c_void_p).value
    except OSError:
        return None
    mod.set_launch(addr, ptr, coop)
    return mod


def native() -> Any:
    """The native launcher module (see :mod:`dnnctl.backends.native`), or None; decided on
    the first launch of the process."""
    global _NATIVE
    if _NATIVE is _UNSET:
        _NATIVE = _native_module()
    return _NATIVE


def _arg_format(a: Any) -> str:
    """The struct format of one kernel argument's 8-byte slot."""
    if isinstance(a, np.generic):
        try:
            return _FORMATS[a.dtype]
        except KeyError:
            raise KernelLaunchError(f"kernel argument of dtype {a.dtype} is not supported"
                                    ) from None
    if isinstance(a, bool):
        return "i4x"
    if isinstance(a, float):
        return "f4x"
    if isinstance(a, bytes):
        return f"{len(a)}s"  # a by-value struct (a TMA tensor map): 64-byte aligned slot
    return "Q"  # pointers (arrays, None, ints)


class Launch:
    """One kernel launch with its configuration fixed at build time (see the module doc).

    ``args`` of a call: arrays (CuPy, torch, NumPy under the emulator), None (a null
    pointer), ints (addresses) and NumPy scalars (by their dtype). The slot layout is learnt
    from the first call's argument types; scalars made by :meth:`consts` / :meth:`f32` are
    plain NumPy scalars.
    """

    __slots__ = ("fn", "grid", "block", "smem", "handle", "fmt", "buf", "params", "memo",
                 "_head", "_params_c", "_dims", "kinds", "shift", "nargs", "cooperative")

    def __init__(self, fn: Any, grid: Sequence[int], block: Sequence[int], smem: int = 0,
                 cooperative: bool = False) -> None:
        self.fn = fn
        # cuLaunchCooperativeKernel: every block resident at once (a grid-wide barrier may be
        # waited on), or the launch fails; the caller sizes the grid (max_active_blocks)
        self.cooperative = bool(cooperative)
        self.grid, self.block, self.smem = tuple(grid), tuple(block), int(smem)
        g = (*self.grid, 1, 1)[:3]
        b = (*self.block, 1, 1)[:3]
        self.handle = _function_handle(fn)
        # the launch's fixed arguments as ctypes objects, made once
        self._head = (ctypes.c_void_p(self.handle or 0),
                      *(ctypes.c_uint(int(v)) for v in (*g, *b, self.smem)))
        self._params_c: Any = None
        self._dims = (*g, *b, self.smem)
        self.kinds: bytes | None = None  # the native path's argument kinds, learnt per layout
        self.fmt: struct.Struct | None = None
        self.buf: Any = None
        self.params: Any = None
        self.shift = 0
        self.nargs = -1
        self.memo: dict[Any, Any] = {}

    def _layout(self, args: Sequence[Any]) -> struct.Struct:
        """8-byte slots; a by-value struct (bytes) gets its own 64-byte aligned slot."""
        fmt, offsets, off = _block_layout(args)
        self.buf = ctypes.create_string_buffer(max(off, _SLOT) + 64)
        shift = -ctypes.addressof(self.buf) % 64
        self.shift = shift
        base = ctypes.addressof(self.buf) + shift
        n = len(args)
        self.params = (ctypes.c_void_p * max(n, 1))(*(base + o for o in offsets))
        self._params_c = ctypes.cast(self.params, ctypes.c_void_p)
        self.fmt = fmt
        self.nargs = n
        return fmt

    def __call__(self, args: Sequence[Any]) -> None:
        handle = self.handle
        rec = STATE.rec
        if rec is not None:  # a call recorded for replay (dnnctl.backends.replay)
            rec.launches.append((self, tuple(args)))
        if handle is None:  # the CPU emulator, a test recorder: call as given
            if self.cooperative:
                self.fn(self.grid, self.block, tuple(args), shared_mem=self.smem,
                        cooperative=True)
            else:
                self.fn(self.grid, self.block, tuple(args), shared_mem=self.smem)
            return
        nat = _NATIVE
        if nat is _UNSET:  # decided on the first launch of the process
            nat = native()
        kinds = self.kinds
        if nat is not None and (kinds is None or (kinds and len(kinds) != len(args))):
            kinds = self.kinds = _kinds(args)
        if nat is not None and kinds:  # b"": arguments only the ctypes path packs
            stream = STATE.stream
            if stream is None:
                stream = current_stream()
            try:
                rc = (nat.launch(handle, *self._dims, stream, kinds, args, True)
                      if self.cooperative else nat.launch(handle, *self._dims, stream, kinds, args))
            except (TypeError, ValueError, OverflowError):  # an argument changed kind
                self.kinds = None
            else:
                if rc:
                    self._failed(rc, args)
                return
        fmt = self.fmt
        if fmt is None or self.nargs != len(args):
            fmt = self._layout(args)
        get = _PTR.get
        vals = []
        for a in args:
            conv = get(a.__class__)
            if conv is None:
                conv = _ptr_getter(a.__class__, a)
            vals.append(conv(a))
        try:
            fmt.pack_into(self.buf, self.shift, *vals)
        except struct.error:  # an argument changed kind since the layout was learnt
            self._layout(args).pack_into(self.buf, self.shift, *vals)
        stream = STATE.stream
        if stream is None:
            stream = current_stream()
        if self.cooperative:
            rc = _driver()[2](*self._head, _stream_arg(stream), self._params_c)
        else:
            rc = _LAUNCH(*self._head, _stream_arg(stream), self._params_c, None)
        if rc:
            self._failed(rc, args)

    def _failed(self, rc: int, args: Sequence[Any]) -> None:
        if rc in (201, 400) and not self.cooperative:
            # invalid context / handle: another device is current
            self.fn(self.grid, self.block, tuple(args), shared_mem=self.smem,
                    stream=_cupy_stream(STATE.stream))
            return
        raise KernelLaunchError(f"cuLaunchKernel failed: {_error_name(rc)} ({rc}) "
                                f"grid {self.grid} block {self.block} smem {self.smem}",
                                hint="run 'dnnctl doctor'; an illegal address earlier on "
                                     "this stream also surfaces here")

    def consts(self, *values: Any) -> tuple[Any, ...]:
        """Scalar arguments fixed at build time (NumPy scalars), in launch-ready form."""
        return tuple(values)

    def f32(self, value: Any) -> Any:
        """A float32 argument given per call (eps, slope, momentum), converted once per
        value (equal values are the same float32)."""
        arg = self.memo.get(value) if value else None
        if arg is None:
            arg = np.float32(value)
            if value and len(self.memo) < 16:
                self.memo[value] = arg
        return arg


def _block_layout(args: Sequence[Any]) -> tuple[struct.Struct, list[int], int]:
    """(struct of the parameter block, each argument's byte offset, the block's size) for a
    launch of ``args``: 8-byte slots; a by-value struct (bytes) gets its own 64-byte
    aligned slot."""
    parts, offsets, off = [], [], 0
    for a in args:
        piece = _arg_format(a)
        align = 64 if isinstance(a, bytes) else _SLOT
        pad = -off % align
        if pad:
            parts.append(f"{pad}x")
            off += pad
        offsets.append(off)
        parts.append(piece)
        off += struct.calcsize("<" + piece)
    return struct.Struct("<" + "".join(parts)), offsets, off


def param_layout(args: Sequence[Any]) -> tuple[bytes, list[int], str]:
    """A launch's parameter block as cuLaunchKernel reads it: (the packed bytes, each
    argument's byte offset, each argument's kind: 'P' an address (an array, None, an int),
    'S' a by-value struct, else the first letter of its scalar's struct format: :func:`_kind`)."""
    fmt, offsets, size = _block_layout(args)
    buf = bytearray(size)
    fmt.pack_into(buf, 0, *map(ptr, args))
    return bytes(buf), offsets, "".join(map(_kind, args))


def launch_addresses() -> tuple[int, int]:
    """The driver's cuLaunchKernel and cuLaunchCooperativeKernel as addresses (OSError
    without libcuda)."""
    fn, _, coop = _driver()
    return (ctypes.cast(fn, ctypes.c_void_p).value or 0,
            ctypes.cast(coop, ctypes.c_void_p).value or 0)


def _function_handle(fn: Any) -> int | None:
    """The CUfunction behind a CuPy RawKernel (loaded on the current device), else None."""
    if not type(fn).__module__.startswith("cupy"):
        return None
    try:
        from cupy.cuda.function import Function

        cuda = fn.kernel if not isinstance(fn, Function) else fn
        return int(cuda.ptr)
    except Exception:  # noqa: BLE001 - another CuPy layout: the RawKernel call still works
        return None


def _cupy_stream(handle: int | None) -> Any:
    import cupy

    if handle is None:
        return cupy.cuda.get_current_stream()
    return external_stream(handle)


@functools.lru_cache(maxsize=64)
def external_stream(handle: int) -> Any:
    """A CuPy stream object for a raw handle (torch's streams), made once per handle."""
    import cupy

    if handle == 0:
        return cupy.cuda.Stream.null
    return cupy.cuda.ExternalStream(handle)


def launch(module: Any, name: str, grid: int | Sequence[int], block: int | Sequence[int],
           smem: int = 0, cooperative: bool = False) -> Launch:
    """A :class:`Launch` of ``name`` in ``module``; opts into > 48 KiB of shared memory.
    ``cooperative``: launched by cuLaunchCooperativeKernel (see :func:`max_active_blocks`)."""
    fn = module.get_function(name)
    if smem > 48 * 1024:
        fn.max_dynamic_shared_size_bytes = smem
    grid_t = (int(grid),) if isinstance(grid, (int, np.integer)) else tuple(int(g) for g in grid)
    block_t = ((int(block),) if isinstance(block, (int, np.integer))
               else tuple(int(b) for b in block))
    return Launch(fn, grid_t, block_t, int(smem), cooperative)


def max_active_blocks(module: Any, name: str, block: int, smem: int = 0) -> int | None:
    """How many blocks of ``name`` (``block`` threads, ``smem`` bytes of dynamic shared
    memory) one SM holds at once (the occupancy calculator of the driver); None where that
    cannot be asked (the CPU emulator, an old CuPy): a cooperative grid is sized from it."""
    fn = module.get_function(name)
    handle = _function_handle(fn)
    if handle is None:
        return None
    try:
        import cupy

        if smem > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = smem
        return int(cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
            handle, int(block), int(smem)))
    except Exception:  # noqa: BLE001 - a CuPy without the call: the caller's estimate stands
        return None


# ----------------------------------------------------------------------------- devices


def get_device() -> int:
    import cupy

    return int(cupy.cuda.runtime.getDevice())


def set_device(index: int) -> None:
    import cupy

    cupy.cuda.runtime.setDevice(index)


def copy(dst: Any, src: Any) -> None:
    """Copy ``src`` into ``dst`` (same size, both contiguous) on the call's stream."""
    refuse("a copy")
    if isinstance(dst, np.ndarray) and isinstance(src, np.ndarray):  # the CPU emulator
        np.copyto(dst, src.reshape(dst.shape), casting="unsafe")
        return
    import cupy

    nbytes = int(np.prod(tuple(dst.shape))) * _itemsize(dst)
    cupy.cuda.runtime.memcpyAsync(ptr(dst), ptr(src), nbytes, 3, current_stream())


def _itemsize(a: Any) -> int:
    size = getattr(a, "itemsize", None)
    if size is None:
        size = a.element_size()  # torch
    return int(size)
