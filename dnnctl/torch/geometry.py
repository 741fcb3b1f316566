"""A module's attributes as the ops' arguments: conv padding as torch splits 'same', a Conv1d
as conv2d over an (N, C, 1, L) view, and :class:`Geometry`, which remakes a forward's
arguments when the module's attributes are replaced after patch."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def _same_pads(m: nn.Conv1d | nn.Conv2d) -> list[tuple[int, int]]:
    """padding='same' per spatial dim as torch splits it: (before, after), the extra element
    after."""
    return [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2)
            for d, k in zip(m.dilation, m.kernel_size)]


def conv_padding(m: nn.Conv2d) -> tuple[int, ...]:
    """The conv's padding as 2 or 4 ints ('same' as torch splits it: the extra pixel after)."""
    if m.padding == "valid":
        return (0, 0)
    if m.padding == "same":
        (t, b), (lf, r) = _same_pads(m)
        return (t, lf) if (t, lf) == (b, r) else (t, b, lf, r)
    return tuple(int(p) for p in m.padding)


class Geometry:
    """A forward's arguments made from some of its module's attributes (a conv's stride,
    padding and dilation; a pool's window): made again when one of those attributes is
    replaced after patch (``conv.stride = (2, 2)``, dilating a backbone for segmentation),
    so nothing about the module is baked into its dnnctl forward. Checked by one C
    lookup of the attributes and a tuple comparison a call (~0.2 us); under torch.compile
    made from the module directly (the reads a compiled eager module has, no cache to
    guard)."""

    __slots__ = ("names", "get", "make", "seen", "args")

    def __init__(self, names: tuple[str, ...], make: Callable[[Any], tuple]) -> None:
        self.names, self.get, self.make = names, operator.itemgetter(*names), make
        self.seen: tuple | None = None
        self.args: tuple = ()

    def of(self, m: nn.Module) -> tuple:
        if _compiling():
            return self.make(m)
        return self.eager_of(m)

    def eager_of(self, m: nn.Module) -> tuple:
        """:meth:`of` for a caller that knows no compiler is tracing (it asked already)."""
        now = self.get(m.__dict__)
        if now != self.seen:
            self.args, self.seen = self.make(m), now
        return self.args

    def __deepcopy__(self, memo: dict[int, Any]) -> Geometry:
        return Geometry(self.names, self.make)


_compiling = torch.compiler.is_compiling


def _tuples(*values: Any) -> tuple:
    """Each value a tuple of ints (what the ops take as they are, see _tensors.ints)."""
    return tuple(tuple(int(e) for e in v) for v in values)


def conv_args(m: nn.Conv2d) -> tuple:
    return _tuples(m.stride, conv_padding(m), m.dilation)


def conv1d_args(m: nn.Conv1d) -> tuple:
    return _tuples(*conv1d_geometry(m))


def conv_t_args(m: nn.ConvTranspose2d) -> tuple:
    return _tuples(m.stride, m.padding, m.output_padding, m.dilation)


def pool_args(m: Any) -> tuple:
    k = pair(m.kernel_size)
    st = pair(m.stride if m.stride is not None else m.kernel_size)
    return _tuples(k, st, pair(m.padding), pair(getattr(m, "dilation", 1)))


CONV_ATTRS = ("stride", "padding", "dilation")


def conv1d_padding(m: nn.Conv1d) -> list[int]:
    """A Conv1d's padding as conv2d's (top, bottom, left, right) over an (N, C, 1, L) view
    ('same' as torch splits it: the extra element after)."""
    if m.padding == "valid":
        return [0, 0, 0, 0]
    if m.padding == "same":
        ((lf, r),) = _same_pads(m)
        return [0, 0, lf, r]
    p = int(m.padding[0])
    return [0, 0, p, p]


def conv1d_geometry(m: nn.Conv1d) -> tuple[list[int], list[int], list[int]]:
    """(stride, padding, dilation) of a Conv1d as conv2d's over an (N, C, 1, L) view."""
    return [1, int(m.stride[0])], conv1d_padding(m), [1, int(m.dilation[0])]


def pair(v: Any) -> list[int]:
    return [int(v), int(v)] if isinstance(v, int) else [int(a) for a in v]


POOL_ATTRS = ("kernel_size", "stride", "padding")
