"""The host path a torch CUDA tensor takes through dnnctl, on a machine with no GPU: every
kernel launch is a no-op (CPU tensors stand in for CUDA ones, nothing is computed by dnnctl).

    import stub_gpu
    with stub_gpu.installed():
        ...  # torch CPU tensors now take dnnctl's CUDA path up to the driver's launch call

What is replaced, and nothing else:

- the ``cupy`` backend: arrays are NumPy, the device an H100 (cc 9.0, 132 SMs), and a
  module "compiled" for a kernel is a stub whose functions launch nothing; each variant's
  own Python (its build, its launch objects, its argument lists) runs as on the GPU; a
  workspace a kernel keeps is a NumPy array whose address reads like a CuPy array's;
- the launch seam: ``dnnctl.backends.cuda.Launch`` calls the native launcher as on a GPU
  host (argument kinds, the parameter block packed in C), whose ``cuLaunchKernel`` is a C
  function that returns 0; without a C compiler ``Launch.__call__`` itself returns at once;
- torch tensors are taken for CUDA ones: ``Tensor.is_cuda`` reads True and ``is_cpu``
  False (properties whose getters are C functions: no Python frame a read), and the torch CUDA adapter keeps its
  per-call work (device and stream queries, the CUDA seam's state, outputs from torch)
  with CPU stand-ins for CuPy's two queries;
- "torch has CUDA" for the vendor variants' ``supports`` (cuDNN through torch), so the
  default heuristics pick what they pick on the GPU (a training convolution: torch's own
  cuDNN call).

torch's own ops still run for real on the CPU: tiny tensors keep that cheap. What the
numbers leave out is the driver: ``cuLaunchKernel`` (~1-2 us a launch on the H100 host),
the caching allocator's CUDA side, cuDNN / cuBLAS host work. Use for host-time
comparisons of dnnctl's Python on the CPU box, never as GPU numbers.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import operator
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

_STUB_C = """
int stub_launch(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                unsigned bz, unsigned smem, void *stream, void **params, void **extra)
{ return 0; }
int stub_coop(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
              unsigned bz, unsigned smem, void *stream, void **params)
{ return 0; }
"""
_LIB: list[Any] = []  # the loaded stub library (kept alive for the process)


def _stub_addresses() -> tuple[int, int] | None:
    """Addresses of two C functions with cuLaunchKernel's / cuLaunchCooperativeKernel's
    signatures that return 0 (compiled once a process); None without a C compiler."""
    if not _LIB:
        from dnnctl.backends import native

        cc = native.compiler()
        if cc is None:
            return None
        d = Path(tempfile.mkdtemp(prefix="dnnctl-stub-"))
        (d / "stub.c").write_text(_STUB_C)
        done = subprocess.run([*cc, "-O2", "-shared", "-fPIC", str(d / "stub.c"), "-o",
                               str(d / "stub.so")], capture_output=True, check=False)
        if done.returncode:
            return None
        _LIB.append(ctypes.CDLL(str(d / "stub.so")))
    lib = _LIB[0]
    return (ctypes.cast(lib.stub_launch, ctypes.c_void_p).value or 0,
            ctypes.cast(lib.stub_coop, ctypes.c_void_p).value or 0)


class DeviceArray(np.ndarray):
    """A kept workspace (CuPy's on a GPU, whose address the native launcher reads as
    ``a.data.ptr`` in C): a NumPy array whose ``data.ptr`` is read the same way, through a
    C-level property, not NumPy's ``__array_interface__`` (a dict made per read)."""

    def __array_finalize__(self, obj: Any) -> None:
        self._dev = _Ptr(self.__array_interface__["data"][0])

    data = property(operator.attrgetter("_dev"))  # type: ignore[assignment]


class _Ptr:
    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


def _workspace(device: Any, nbytes: int) -> Any:
    """``_memory_common.workspace`` on the stub: a float32 :class:`DeviceArray`."""
    from dnnctl.backends import cuda

    ws = np.empty(max(1, -(-nbytes // 4)), dtype=np.float32).view(DeviceArray)
    cuda.KEPT.append((int(ws.ctypes.data), ws.nbytes))  # kept, as cuda.kept's are
    return ws


class StubFunction:
    """A "loaded kernel": attributes may be set on it (max dynamic shared memory)."""

    def __init__(self, name: str) -> None:
        self.name = name


class StubModule:
    def get_function(self, name: str) -> StubFunction:
        return StubFunction(name)


def _backend_class() -> type:
    from dnnctl.backends.base import DeviceInfo
    from dnnctl.backends.numpy_backend import NumpyBackend

    class StubBackend(NumpyBackend):
        """The ``cupy`` backend's interface over NumPy arrays and kernels that launch
        nothing, on an H100."""

        name = "cupy"

        def availability(self) -> tuple[bool, str]:
            return True, ""

        def device(self, index: int = 0) -> DeviceInfo:
            return DeviceInfo(backend="cupy", index=0, name="NVIDIA H100 80GB HBM3 (stub)",
                              compute_capability="9.0", sm_count=132, driver="stub",
                              cuda_runtime="13.0", memory_bytes=80 << 30, l2_bytes=50 << 20,
                              smem_per_block_optin=227 * 1024)

        def compile_module(self, source: str, *, defines: Mapping[str, Any] | None = None,
                           name_expressions: Sequence[str] = (),
                           options: Sequence[str] = (), device: int | None = None) -> Any:
            return StubModule()

    return StubBackend


def _adapter_class() -> type:
    import torch

    from dnnctl.ops.adapters import Adapter, TorchCudaAdapter, torch_to_numpy

    zero = int  # a C call returning 0: stands in for CuPy's getDevice and the raw stream

    class StubTorchCudaAdapter(TorchCudaAdapter):
        """torch's CUDA adapter over CPU tensors: the same per-call work (enter / leave,
        outputs from a template's ``new_empty``), NumPy where it would make CuPy views."""

        def __init__(self, device_index: int = 0) -> None:
            Adapter.__init__(self, device_index)
            self._torch, self._cupy = torch, None
            self.det_probe = torch.are_deterministic_algorithms_enabled
            self._getdev = zero
            self._tdev = torch.device("cpu")
            self._stream = lambda: zero(0)
            self._tdtypes = {}
            self._templates = {}

        def to_backend(self, a: Any) -> Any:
            return torch_to_numpy(a, torch)

        def scratch(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
            return torch_to_numpy(self.empty(shape, dtype), torch)

        def from_backend(self, a: Any) -> Any:
            if a.dtype.name == "bfloat16":
                return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
            return torch.from_numpy(a)

        def enter_all(self) -> Any:
            return self.enter(), None

        def leave_all(self, token: Any) -> None:
            self.leave(token[0])

    return StubTorchCudaAdapter


_VENDOR_MODULES = ("dnnctl.ops.torch_vendor", "dnnctl.ops.conv2d.vendor",
                   "dnnctl.ops.conv2d.vendor_backward", "dnnctl.ops.batch_norm.vendor_backward",
                   "dnnctl.ops.attention.vendor")


def clear_caches() -> None:
    """Forget every per-signature decision dnnctl made (sites, kernels, routes), so what the
    stub device decides is not mixed with what the CPU backend decided."""
    from dnnctl.ops import adapters, dispatch
    from dnnctl.torch import grad_plan, kernels

    for table in (dispatch._SITES, dispatch._KERNELS, dispatch._DEFAULTS, adapters._ADAPTERS,
                  kernels._DEVICES, kernels._VENDOR_ROUTES, grad_plan._TRAINS,
                  grad_plan._VENDOR):
        table.clear()
    grad_plan._DECIDED.clear()
    from dnnctl.torch import native

    native._TABLE.clear()
    for name in ("_STATIC", "_SIG_CACHE"):  # caches later code may add; absent is fine
        for mod in (kernels, grad_plan):
            table = getattr(mod, name, None)
            if isinstance(table, dict):
                table.clear()


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """The stub GPU for the block (see the module doc); everything is put back after."""
    import importlib

    import torch

    from dnnctl.backends import cuda
    from dnnctl.backends.registry import _BACKENDS
    from dnnctl.ops import _memory_common as mc
    from dnnctl.ops import adapters

    saved_backend = _BACKENDS.get("cupy")
    saved_kind, saved_handle = adapters._kind, cuda._function_handle
    saved_native, saved_call = cuda._NATIVE, cuda.Launch.__call__
    saved_ws = mc.workspace
    vendor = [importlib.import_module(m) for m in _VENDOR_MODULES]
    saved_missing = [m.torch_cuda_missing for m in vendor]
    _BACKENDS["cupy"] = _backend_class()()
    adapter = _adapter_class()(0)

    def kind(a: Any) -> tuple[str, int]:
        if type(a).__module__.startswith("torch"):
            return "torch-cuda", 0
        return saved_kind(a)

    def handle(fn: Any) -> int | None:
        return 0 if isinstance(fn, StubFunction) else saved_handle(fn)

    clear_caches()
    adapters._ADAPTERS[("torch-cuda", 0)] = adapter
    adapters._kind = kind
    cuda._function_handle = handle
    mc.workspace = _workspace
    stubs = _stub_addresses()
    from dnnctl.backends import native

    mod = native.module() if stubs is not None else None
    if mod is not None:
        mod.set_launch(stubs[0], cuda.ptr, stubs[1])
        cuda._NATIVE = mod
        from dnnctl.backends import replay

        rep = replay.module(wait=None)  # the replay path launches through the stub too
        if rep is not None:
            rep.set_launch(stubs[0], stubs[1])
    else:  # no C compiler: the launch returns at once
        cuda.Launch.__call__ = lambda self, args: None  # type: ignore[method-assign]
    for m in vendor:
        m.torch_cuda_missing = lambda: None
    # C-level getters (no Python frame a read): is_not(None, t) is True, callable(t) False
    torch.Tensor.is_cuda = property(functools.partial(operator.is_not, None))  # type: ignore
    torch.Tensor.is_cpu = property(callable)  # type: ignore[misc]
    try:
        yield
    finally:
        del torch.Tensor.is_cuda
        del torch.Tensor.is_cpu
        for m, fn in zip(vendor, saved_missing):
            m.torch_cuda_missing = fn
        cuda.Launch.__call__ = saved_call  # type: ignore[method-assign]
        cuda._NATIVE = saved_native
        cuda._function_handle = saved_handle
        mc.workspace = saved_ws
        adapters._kind = saved_kind
        if saved_backend is None:
            _BACKENDS.pop("cupy", None)
        else:
            _BACKENDS["cupy"] = saved_backend
        clear_caches()
