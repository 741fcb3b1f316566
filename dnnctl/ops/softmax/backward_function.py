"""The public softmax gradient calls (``dnnctl.ops.softmax_backward``,
``log_softmax_backward``), on the forward's call pipeline."""

from __future__ import annotations

from typing import Any

from dnnctl.errors import ShapeError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.dispatch import CallSpec, Parsed, call


def _parse(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    y, dy = arrays
    axis, log = scalars
    dtype = mc.float_dtype(y, "y")
    shape = mc.nonempty_shape(y, "softmax_backward", "y")
    mc.check_out(dy, shape, dtype, "dy")
    rank = len(shape)
    if isinstance(axis, int) and not isinstance(axis, bool) and not -rank <= axis < rank:
        raise ShapeError(f"softmax_backward: axis {axis} is out of range for rank {rank}",
                         hint=f"use {-rank} .. {rank - 1}")
    axis = mc.axis_index(axis, rank, "softmax_backward: axis")  # ints; others refused
    rows, cols = y.size // shape[axis], shape[axis]
    key = {"rows": rows, "cols": cols, "dtype": dtype, "log": log, "pass": "backward"}
    if axis == rank - 1:
        mc.contiguous(y, "y")
        flat = {"y": (rows, cols), "dy": (rows, cols), "dx": (rows, cols)}
        return Parsed("softmax", key, (("y", 0, None), ("dy", 1, None)),
                      (("dx", shape, y.dtype),), result="dx", kernel_shapes=flat,
                      like={"dx": 0})

    # kernels reduce contiguous rows: move the axis last (copies), then dx back (a copy)
    def prepare(back: tuple[Any, ...]) -> dict[str, Any]:
        return {name: xp.ascontiguousarray(xp.moveaxis(a, axis, -1)).reshape(rows, cols)
                for name, a in zip(("y", "dy"), back)}

    def finish(kouts: dict[str, Any], back: tuple[Any, ...]) -> Any:
        moved = tuple(s for i, s in enumerate(shape) if i != axis) + (cols,)
        return xp.ascontiguousarray(xp.moveaxis(kouts["dx"].reshape(moved), -1, axis))

    return Parsed("softmax", key, (), (("dx", (rows, cols), y.dtype),), result="dx",
                  prepare=prepare, finish=finish)


_BACKWARD = CallSpec("softmax_backward", _parse, ("y", "dy"))


def softmax_backward(y: Any, dy: Any, axis: int = -1, log: bool = False,
                     plan: Any = None) -> Any:
    """Gradient of :func:`softmax` (``log=True``: of :func:`log_softmax`) given its output
    ``y`` and the gradient ``dy`` of the loss with respect to ``y``; returns dx."""
    return call(_BACKWARD, (y, dy), (axis, bool(log)), plan)


def log_softmax_backward(y: Any, dy: Any, axis: int = -1, plan: Any = None) -> Any:
    """Gradient of :func:`log_softmax` given its output ``y`` and ``dy``; returns dx."""
    return call(_BACKWARD, (y, dy), (axis, True), plan)
