"""The array kinds a call can bring, and how each meets the backends.

One :class:`Adapter` per kind and device: NumPy and torch CPU tensors run on the numpy
backend over the same memory; CuPy arrays on the GPU; torch CUDA tensors on the GPU by their
pointer, with outputs from torch's caching allocator and kernels launched on
``torch.cuda.current_stream()`` (set in the CUDA seam for the call); any other DLPack tensor
is converted. :func:`signature` is the cheap description the pipeline caches sites by.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dnnctl.backends import cuda
from dnnctl.backends.registry import get_backend
from dnnctl.errors import ShapeError
from dnnctl.ops.base import np_dtype

# ----------------------------------------------------------------------------- adapters


class Adapter:
    """How one kind of caller array meets the backends (see the module doc)."""

    kind = "numpy"
    backend_name = "numpy"
    # the caller's framework's "deterministic algorithms only" switch (a no-argument callable),
    # or None: torch.are_deterministic_algorithms_enabled for torch tensors
    det_probe: Callable[[], bool] | None = None

    def __init__(self, device_index: int = 0) -> None:
        self.index = device_index
        self.backend = get_backend(self.backend_name)
        self.device = self.backend.device(device_index)

    def to_backend(self, a: Any) -> Any:
        """The backend array (NumPy / CuPy) over ``a``'s memory, for validation and for
        kernels that use more than data pointers."""
        return a

    def pointer_ok(self) -> bool:
        """Kernels that read only data pointers may take the caller's arrays as they are."""
        return True

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """An output array of the caller's kind."""
        return np.empty(shape, dtype=dtype)

    def empty_like(self, a: Any) -> Any:
        """An output of ``a``'s kind, shape and dtype (``a`` is C-contiguous)."""
        return np.empty_like(a)

    def from_backend(self, a: Any) -> Any:
        """A backend array made by a kernel's slow path, in the caller's kind."""
        return a

    def enter(self) -> Any:
        """Make the call's device, stream and scratch allocator current (see
        backends.cuda.STATE); returns what :meth:`leave` restores. Nothing on the CPU."""
        return None

    def leave(self, token: Any) -> None:
        """Undo :meth:`enter`."""

    def enter_all(self) -> Any:
        """:meth:`enter`, and the backend library's own allocations (the copies, casts and
        reductions an op makes on backend arrays) from the caller's allocator too, for work
        beyond kernel launches into given buffers; undone by :meth:`leave_all`."""
        return self.enter()

    def leave_all(self, token: Any) -> None:
        self.leave(token)


class CupyAdapter(Adapter):
    kind = "cupy"
    backend_name = "cupy"

    def __init__(self, device_index: int = 0) -> None:
        super().__init__(device_index)
        import cupy

        self._cupy = cupy
        self._getdev = cupy.cuda.runtime.getDevice
        self._current = cupy.cuda.get_current_stream

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        # a call made on CuPy arrays inside a torch caller's (a composite op's recursion, see
        # dispatch.on_caller_stream) takes its outputs from torch's allocator too: CuPy's
        # pool may not grow under a graph capture, and what it hands out is not the graph's
        alloc = cuda.STATE.alloc
        if alloc is not None:
            return alloc(tuple(shape), np.dtype(dtype))
        return self._cupy.empty(shape, dtype=dtype)

    def empty_like(self, a: Any) -> Any:
        alloc = cuda.STATE.alloc
        if alloc is not None:
            return alloc(tuple(a.shape), a.dtype)
        return self._cupy.empty_like(a)

    def enter(self) -> Any:
        prev = self._getdev()
        if prev != self.index:
            cuda.set_device(self.index)
        state = cuda.STATE
        saved = state.stream
        state.stream = self._current().ptr
        return prev, saved

    def leave(self, token: Any) -> None:
        prev, saved = token
        cuda.STATE.stream = saved  # a nested call restores its caller's stream
        if prev != self.index:
            cuda.set_device(prev)


class TorchCudaAdapter(Adapter):
    """torch CUDA tensors: pointers, torch's current stream, torch's caching allocator."""

    kind = "torch-cuda"
    backend_name = "cupy"

    def __init__(self, device_index: int = 0) -> None:
        super().__init__(device_index)
        import cupy
        import torch

        self._torch, self._cupy = torch, cupy
        self.det_probe = torch._C._get_deterministic_algorithms  # (no Python frame)
        self._getdev = cupy.cuda.runtime.getDevice
        self._tdev = torch.device("cuda", device_index)
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._stream = ((lambda: raw(device_index)) if raw is not None else
                        (lambda: torch.cuda.current_stream(device_index).cuda_stream))
        self._tdtypes: dict[np.dtype, Any] = {}
        self._templates: dict[np.dtype, Any] = {}

    def tdtype(self, dtype: np.dtype) -> Any:
        t = self._tdtypes.get(dtype)
        if t is None:
            name = "bfloat16" if dtype.name == "bfloat16" else dtype.name
            t = self._tdtypes[dtype] = getattr(self._torch, name)
        return t

    def to_backend(self, a: Any) -> Any:
        return torch_to_cupy(a, self._cupy)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        # new_empty on a 0-element tensor of the dtype: no dtype / device argument parsing
        # (torch.empty with both costs ~3 us more per call on the H200 host)
        t = self._templates.get(dtype)
        if t is None:
            t = self._templates[dtype] = self._torch.empty(0, dtype=self.tdtype(dtype),
                                                           device=self._tdev)
        return t.new_empty(shape)

    def empty_like(self, a: Any) -> Any:
        return self._torch.empty_like(a)

    def scratch(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        return torch_to_cupy(self.empty(shape, dtype), self._cupy)

    def from_backend(self, a: Any) -> Any:
        # CuPy's __dlpack__ makes torch's stream wait on an event of CuPy's current stream
        # when the two differ. The result was computed on torch's stream (enter), so on a
        # side stream or under graph capture it is exported with that stream current: no
        # event, and no dependency on uncaptured work (which invalidates a capture).
        stream = self._stream()
        if not stream:
            return self._torch.from_dlpack(a)
        with cuda.external_stream(stream):
            return self._torch.from_dlpack(a)

    def enter(self) -> Any:
        prev = self._getdev()
        if prev != self.index:
            cuda.set_device(self.index)
        stream = self._stream()
        state = cuda.STATE
        saved = state.stream, state.alloc, state.raw
        state.stream, state.alloc, state.raw = stream, self.scratch, self.empty
        ext = None
        if stream:  # a side stream or a graph capture: CuPy's own calls go there too
            ext = cuda.external_stream(stream)
            ext.__enter__()
        return prev, ext, saved

    def leave(self, token: Any) -> None:
        prev, ext, saved = token
        if ext is not None:
            ext.__exit__(None, None, None)
        state = cuda.STATE
        state.stream, state.alloc, state.raw = saved  # a nested call restores its caller's
        if prev != self.index:
            cuda.set_device(prev)

    def enter_all(self) -> Any:
        # CuPy's copies / reductions take torch's memory on torch's stream: ordered with the
        # caller's work, in the graph's pool under a capture (CuPy's pool may not grow during
        # one, and a block it gets back after the call is not the graph's to reuse)
        using = self._cupy.cuda.using_allocator(self._cupy_malloc)
        using.__enter__()
        return self.enter(), using

    def leave_all(self, token: Any) -> None:
        inner, using = token
        using.__exit__(None, None, None)
        self.leave(inner)

    def _cupy_malloc(self, nbytes: int) -> Any:
        t = self._torch.empty(max(int(nbytes), 1), dtype=self._torch.uint8, device=self._tdev)
        cp = self._cupy.cuda
        return cp.MemoryPointer(cp.UnownedMemory(t.data_ptr(), t.numel(), t, self.index), 0)


class TorchCpuAdapter(Adapter):
    """torch CPU tensors run on the numpy backend over the same memory."""

    kind = "torch-cpu"

    def __init__(self, device_index: int = 0) -> None:
        super().__init__(0)
        import torch

        self._torch = torch
        self.det_probe = torch._C._get_deterministic_algorithms  # (no Python frame)
        self._tdtypes: dict[np.dtype, Any] = {}

    def to_backend(self, a: Any) -> Any:
        return torch_to_numpy(a, self._torch)

    def pointer_ok(self) -> bool:
        return False  # numpy variants index their arrays

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        t = self._tdtypes.get(dtype)
        if t is None:  # once per dtype: numpy's dtype.name is Python code (~1 us a read)
            t = self._tdtypes[dtype] = getattr(self._torch, dtype.name)
        return self._torch.empty(shape, dtype=t)

    def empty_like(self, a: Any) -> Any:
        return self._torch.empty_like(a)

    def from_backend(self, a: Any) -> Any:
        if a.dtype.name == "bfloat16":
            return self._torch.from_numpy(a.view(np.int16)).view(self._torch.bfloat16)
        return self._torch.from_numpy(a)


def torch_to_cupy(t: Any, cupy: Any) -> Any:
    """A CuPy array over a torch CUDA tensor's memory (no copy, no DLPack exchange)."""
    dtype = np_dtype(str(t.dtype).replace("torch.", ""))
    size = t.element_size()
    span = 1 + sum((d - 1) * abs(s) for d, s in zip(t.shape, t.stride()) if d > 0)
    mem = cupy.cuda.UnownedMemory(t.data_ptr(), span * size, t, t.device.index)
    return cupy.ndarray(tuple(t.shape), dtype, cupy.cuda.MemoryPointer(mem, 0),
                        tuple(s * size for s in t.stride()))


def torch_to_numpy(t: Any, torch: Any) -> np.ndarray:
    """A NumPy array over a torch CPU tensor's memory (bfloat16 through ml_dtypes)."""
    if t.requires_grad:
        t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np_dtype("bfloat16"))
    return t.numpy()


_ADAPTERS: dict[tuple[str, int], Adapter] = {}


def adapter_of(kind: str, index: int) -> Adapter:
    ad = _ADAPTERS.get((kind, index))
    if ad is None:
        cls = {"numpy": Adapter, "cupy": CupyAdapter, "torch-cuda": TorchCudaAdapter,
               "torch-cpu": TorchCpuAdapter}[kind]
        ad = _ADAPTERS[(kind, index)] = cls(index)
    return ad


def _kind(a: Any) -> tuple[str, int]:
    """(adapter kind, device index) of one array argument."""
    if isinstance(a, np.ndarray):
        if isinstance(a, np.ma.MaskedArray):
            raise ShapeError("masked arrays are not supported: the mask would be ignored",
                             hint="fill the masked entries first (a.filled(...)) or pass "
                                  "a.data explicitly")
        if type(a) is not np.ndarray:  # np.matrix and other subclasses change semantics
            raise ShapeError(f"{type(a).__name__} arrays are not supported",
                             hint="pass a plain ndarray: numpy.asarray(a)")
        return "numpy", 0
    mod = type(a).__module__
    if mod.startswith("cupy"):
        return "cupy", int(a.data.device_id)
    if mod.startswith("torch"):
        if a.is_cuda:
            return "torch-cuda", int(a.device.index)
        if a.device.type == "cpu":
            return "torch-cpu", 0
        raise ShapeError(f"torch tensors on {a.device} are not supported",
                         hint="use CUDA or CPU tensors")
    if hasattr(a, "__dlpack__"):
        return "dlpack", 0
    raise ShapeError(f"expected an array (NumPy, CuPy, torch or another DLPack tensor), got "
                     f"{type(a).__name__}", hint="pass numpy.ndarray, cupy.ndarray or a "
                                                 "torch tensor")


def adapter_for(arrays: tuple[Any, ...]) -> tuple[Adapter, tuple[Any, ...]]:
    """The adapter of a call's arrays (all of one kind and device), and the arrays, DLPack
    tensors of other producers converted to NumPy / CuPy."""
    kinds = {_kind(a) for a in arrays if a is not None}
    if not kinds:
        return adapter_of("numpy", 0), arrays
    if len(kinds) > 1:
        names = sorted(f"{k}:{i}" if k not in ("numpy", "torch-cpu") else k for k, i in kinds)
        raise ShapeError(f"arguments mix array kinds or devices {names}",
                         hint="pass all arrays of one call on one device and of one kind")
    kind, index = kinds.pop()
    if kind != "dlpack":
        return adapter_of(kind, index), arrays
    first = next(a for a in arrays if a is not None)
    dev_type, dev_id = first.__dlpack_device__()
    if int(dev_type) == 1:  # kDLCPU
        return adapter_of("numpy", 0), tuple(None if a is None else np.from_dlpack(a)
                                             for a in arrays)
    if int(dev_type) not in (2, 13):  # kDLCUDA, kDLCUDAManaged
        raise ShapeError(f"DLPack device type {dev_type} is not supported",
                         hint="pass a CUDA or CPU tensor")
    import cupy

    conv = tuple(None if a is None else cupy.from_dlpack(a) for a in arrays)
    return adapter_of("cupy", int(dev_id)), conv


# ----------------------------------------------------------------------------- signatures


def _sig_numpy(a: Any) -> Any:
    return (np.ndarray, a.shape, a.strides, a.dtype, a.flags.writeable)


def _sig_cupy(a: Any) -> Any:
    return (a.__class__, a.shape, a.strides, a.dtype, a.data.device_id)


def _sig_torch(a: Any) -> Any:
    return (a.__class__, a.shape, a.stride(), a.dtype, a.get_device(), a.requires_grad)


def _sig_none(a: Any) -> Any:
    return None


SIGNATURES: dict[type, Callable[[Any], Any]] = {np.ndarray: _sig_numpy, type(None): _sig_none}


def signature(a: Any) -> Any:
    """Hashable description of an array argument: kind, shape, strides, dtype, device.

    Two arrays with one signature pass the same checks. Raises TypeError for other objects
    (the caller then takes the validating path)."""
    fn = SIGNATURES.get(a.__class__)
    if fn is None:
        mod = a.__class__.__module__
        if mod.startswith("cupy"):
            fn = SIGNATURES[a.__class__] = _sig_cupy
        elif mod.startswith("torch") and hasattr(a, "stride"):
            fn = SIGNATURES[a.__class__] = _sig_torch
        else:
            raise TypeError(f"no signature for {type(a).__name__}")
    return fn(a)
