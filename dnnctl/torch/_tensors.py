"""Torch tensors in and out of ``dnnctl.ops``: CPU tensors as NumPy views, memory formats.

A CUDA tensor goes to ``dnnctl.ops`` as it is (the dispatcher takes torch CUDA tensors). A
CPU tensor runs on the numpy backend: it is handed over as a zero-copy NumPy view (bfloat16
through an int16 view, which DLPack cannot carry) and the result comes back the same way.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from dnnctl.ops.dispatch import call as _dispatch_call

# the dtypes dnnctl's kernels take (dnnctl.ops.base.DTYPES); others run on torch
DNN_DTYPES: frozenset[torch.dtype] = frozenset({torch.float32, torch.float16, torch.bfloat16})
_CL = torch.channels_last


@functools.cache
def _bf16() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


_BF16 = torch.bfloat16


def to_numpy(t: torch.Tensor | None) -> np.ndarray | None:
    """A zero-copy NumPy view of a CPU tensor (None stays None)."""
    if t is None:
        return None
    if t.requires_grad:  # numpy() refuses it; a detach costs a C call otherwise
        t = t.detach()
    if t.dtype is _BF16:
        return t.view(torch.int16).numpy().view(_bf16())
    return t.numpy()


def from_numpy(a: Any) -> Any:
    """The torch tensor viewing a NumPy result (tuples element-wise)."""
    if isinstance(a, tuple):
        return tuple(from_numpy(v) for v in a)
    if a is None:
        return None
    if a.dtype == _bf16():
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def call(fn: Callable[..., Any], tensors: Sequence[torch.Tensor | None], **kwargs: Any) -> Any:
    """``fn(*tensors, **kwargs)`` with CPU tensors as NumPy views; results as torch tensors."""
    if not tensors[0].is_cpu:
        return fn(*tensors, **kwargs)
    for k, v in kwargs.items():  # in place: the dict is this call's own
        if isinstance(v, torch.Tensor):
            kwargs[k] = to_numpy(v)
        elif isinstance(v, tuple) and v and isinstance(v[0], torch.Tensor):
            kwargs[k] = tuple(map(to_numpy, v))
    return from_numpy(fn(*[to_numpy(t) for t in tensors], **kwargs))


def call_spec(spec: Any, arrays: tuple[Any, ...], scalars: tuple[Any, ...], plan: Any) -> Any:
    """``dispatch.call(spec, arrays, scalars, plan)`` from torch tensors: an op function's
    own call less its argument handling (``arrays`` / ``scalars`` exactly as the function
    builds them, so the same call site serves both); CPU tensors as NumPy views, results as
    torch tensors."""
    if not arrays[0].is_cpu:
        return _dispatch_call(spec, arrays, scalars, plan)
    return from_numpy(_dispatch_call(spec, tuple(map(to_numpy, arrays)), scalars, plan))


def is_nhwc(x: torch.Tensor) -> bool:
    """x (4-D) is stored channels-last and not also plain contiguous (C == 1, H = W = 1):
    dense, or a strided view of channels-last storage (a channel slice such as YOLO's
    ``chunk(2, 1)``), which torch's own convolution also keeps channels-last."""
    if x.dim() != 4 or x.is_contiguous():
        return False
    return x.is_contiguous(memory_format=_CL) or _channels_last_strides(x.shape, x.stride())


def _channels_last_strides(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """torch's rule for an implicitly channels-last 4-D tensor (c10 is_channels_last_strides_2d,
    the basis of suggest_memory_format): strides non-decreasing in the order C, W, H, N,
    each at least the span of the one before; ambiguous cases count as NCHW."""
    if strides[1] == 0:
        return False
    low = 0
    for d in (1, 3, 2, 0):
        if sizes[d] == 0 or strides[d] < low:
            return False
        if d == 0 and low == strides[1]:
            return False
        low = strides[d] * (sizes[d] if sizes[d] > 1 else 1)
    return True


def as_4d(x: torch.Tensor) -> torch.Tensor:
    """An (N, C, *spatial) tensor as (N, C, prod(spatial), 1) (4-D as it is): the view the
    4-D norm kernels take. The spatial size is spelled out: an empty batch has no size to
    infer a -1 from."""
    if x.dim() == 4:
        return x
    return x.reshape(x.shape[0], x.shape[1], math.prod(x.shape[2:]), 1)


def nhwc_view(x: torch.Tensor) -> torch.Tensor:
    """The (N, H, W, C) contiguous view of a channels-last (N, C, H, W) tensor (or a copy)."""
    return x.permute(0, 2, 3, 1).contiguous()


def in_layout(t: torch.Tensor, nhwc: bool) -> torch.Tensor:
    """A 4-D tensor as the NHWC / NCHW kernels read it: its (N, H, W, C) view (a copy unless
    its memory is channels-last), or contiguous NCHW."""
    return nhwc_view(t) if nhwc else t.contiguous()


def nchw_of(y: torch.Tensor) -> torch.Tensor:
    """The logical (N, C, H, W) view of an (N, H, W, C) result: a channels-last tensor."""
    return y.permute(0, 3, 1, 2)


def storage_view(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(contiguous tensor holding x's elements in memory order, was channels-last).

    Element-wise ops run on the storage order, so a channels-last input gives a
    channels-last output with no copy."""
    if x.is_contiguous():
        return x, False
    if is_nhwc(x):  # a strided channels-last view is made dense, still channels-last
        return x.permute(0, 2, 3, 1).contiguous(), True
    return x.contiguous(), False


def empty_like_format(x: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """An empty 4-D result of ``shape`` in x's memory format (what the kernels return)."""
    fmt = _CL if is_nhwc(x) else torch.contiguous_format
    return torch.empty(tuple(shape), dtype=x.dtype, device=x.device, memory_format=fmt)


def ints(values: Any, n: int) -> tuple[int, ...]:
    """A tuple of ``n`` ints from an int or a sequence (hashable: dnnctl caches by it)."""
    if (values.__class__ is tuple and len(values) == n == 2 and values[0].__class__ is int
            and values[1].__class__ is int):  # already so (a patched module's, made once)
        return values
    if isinstance(values, (int, torch.SymInt)):
        return (int(values),) * n
    out = tuple(map(int, values))  # (a generator costs ~0.4 us more per call)
    return out * n if len(out) == 1 and n > 1 else out


def fp32(t: torch.Tensor | None) -> torch.Tensor | None:
    """t as float32 (batch_norm / group_norm parameters and statistics are fp32)."""
    return t if t is None or t.dtype == torch.float32 else t.float()
