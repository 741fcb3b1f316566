"""What every vendor variant that runs through torch shares (attention's SDPA backends,
conv2d's cuDNN): whether torch with CUDA is usable, torch views of backend arrays, the call's
stream as torch's, and delivering a library's results as the call's outputs.

A torch caller's tensors arrive as they are and the library runs on torch's current stream,
which the pipeline has made the call's stream (a side stream and a graph capture included);
CuPy arrays (the tuner's, a CuPy caller's) are viewed through ``torch.from_dlpack`` and run on
CuPy's current stream wrapped as a torch external stream.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections.abc import Iterator, Mapping
from typing import Any

from dnnctl.ops.adapters import torch_to_cupy


@functools.cache
def torch_cuda_missing() -> str | None:
    """None when torch with CUDA is usable, else the reason."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return f"torch {torch.__version__} has no usable CUDA device"
    return None


def torch_tensor_type() -> type:
    """torch.Tensor: inputs of this class are a torch caller's, on the call's stream."""
    import torch

    return torch.Tensor


def tensor(x: Any) -> Any:
    """A torch view of a backend array (no copy)."""
    import torch

    return x if isinstance(x, torch.Tensor) else torch.from_dlpack(x)


_STREAMS: dict[int, Any] = {}


def current_stream() -> Any:
    """The torch stream of CuPy's current stream (a context manager)."""
    import torch

    try:
        import cupy
    except ImportError:
        return contextlib.nullcontext()
    ptr = cupy.cuda.get_current_stream().ptr
    if ptr == 0:
        return torch.cuda.stream(torch.cuda.default_stream())
    st = _STREAMS.get(ptr)
    if st is None:
        st = _STREAMS[ptr] = torch.cuda.ExternalStream(ptr)
    return torch.cuda.stream(st)


def on_stream(native: bool) -> Any:
    """The stream context of a vendor call: none for a torch caller (torch's current stream
    is the call's), else CuPy's current stream as torch's (:func:`current_stream`)."""
    return contextlib.nullcontext() if native else current_stream()


_KEEP = contextlib.nullcontext()  # reusable: a call that leaves torch's settings alone


@contextlib.contextmanager
def _tf32_set(value: bool) -> Iterator[None]:
    import torch

    cudnn = torch.backends.cudnn
    old = cudnn.allow_tf32
    cudnn.allow_tf32 = value
    try:
        yield
    finally:
        cudnn.allow_tf32 = old


def cudnn_tf32(value: bool | None) -> Any:
    """cuDNN's TF32 switch set to ``value`` (a float32 problem key's ``tf32``) for the
    block, restored after; None leaves torch's setting as it is."""
    return _KEEP if value is None else _tf32_set(value)


def deliver(outputs: Mapping[str, Any], results: Mapping[str, Any], native: bool,
            strided: tuple[str, ...] = ()) -> dict[str, Any]:
    """Write the library's ``results`` into the ``outputs`` passed (one copy each) and
    return the others as adopted outputs: C-contiguous (a copy only where the library's
    tensor is a strided view), a CuPy view for a CuPy caller (over the tensor's memory,
    which it keeps alive: no DLPack exchange, which costs ~28 us of host time per output on
    the H200 and so would bias the tuner's timing of a short vendor call). The outputs
    named in ``strided`` keep the library's layout for a torch caller (a ``strided_io``
    kernel's), no copy, as torch's own op returns them. Call on the call's stream."""
    made = {}
    for name, val in results.items():
        dst = outputs.get(name)
        if dst is not None:
            dst = tensor(dst)
            dst.copy_(val.reshape(dst.shape))
            continue
        if not (native and name in strided) and not val.is_contiguous():
            val = val.contiguous()
        if not native:
            import cupy

            val = torch_to_cupy(val, cupy)
        made[name] = val
    return made


@contextlib.contextmanager
def native_io(variant: Any, inputs: Mapping[str, Any]) -> Iterator[tuple[dict[str, Any], Any]]:
    """(inputs as the call should get them, results to backend arrays) for timing and
    verifying ``variant`` as a torch caller runs it.

    A variant that calls its library through torch (``via_torch``) is handed torch views of
    backend arrays, made once here, inside CuPy's current stream as torch's: each call is
    then the torch-native one (no per-call DLPack views, stream switch or output conversion),
    which is what a patched model's call or torch's own formula for a planned vendor choice
    costs. The second value turns such a call's results (torch tensors) into backend arrays
    for verification. Any other variant gets ``inputs`` as they are and an identity."""
    if not getattr(variant, "via_torch", False) or not inputs or any(
            v is not None and v.__class__.__module__.split(".")[0] != "cupy"
            for v in inputs.values()):
        yield dict(inputs), _same
        return
    import cupy

    torch_tensor = torch_tensor_type()
    with current_stream():
        yield ({k: None if v is None else tensor(v) for k, v in inputs.items()},
               lambda made: {k: torch_to_cupy(v, cupy) if isinstance(v, torch_tensor) else v
                             for k, v in (made or {}).items()})


def _same(made: Any) -> Any:
    return made
