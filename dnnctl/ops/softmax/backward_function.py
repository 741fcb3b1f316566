"""The public softmax gradient calls (``dnnctl.ops.softmax_backward``,
``log_softmax_backward``), dispatched like the forward."""

from __future__ import annotations

from typing import Any

from dnnctl.errors import ShapeError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops.dispatch import bind, run


def softmax_backward(y: Any, dy: Any, axis: int = -1, log: bool = False,
                     plan: Any = None) -> Any:
    """Gradient of :func:`softmax` (``log=True``: of :func:`log_softmax`) given its output
    ``y`` and the gradient ``dy`` of the loss with respect to ``y``; returns dx."""
    bound = bind(y, dy)
    ya, ga = bound.arrays
    dtype = mc.float_dtype(ya, "y")
    shape = mc.nonempty_shape(ya, "softmax_backward", "y")
    mc.check_out(ga, shape, dtype, "dy")
    rank = len(shape)
    if not -rank <= axis < rank:
        raise ShapeError(f"softmax_backward: axis {axis} is out of range for rank {rank}")
    axis %= rank
    xp = bound.backend.xp
    moved = axis != rank - 1
    if moved:  # kernels reduce contiguous rows: move the axis last (copies, on the
        with bound.on_caller_stream():  # caller's stream and allocator)
            ya = xp.ascontiguousarray(xp.moveaxis(ya, axis, -1))
            ga = xp.ascontiguousarray(xp.moveaxis(ga, axis, -1))
    mc.contiguous(ya, "y")
    mc.contiguous(ga, "dy")
    cols = ya.shape[-1]
    key = {"rows": ya.size // cols, "cols": cols, "dtype": dtype, "log": bool(log),
           "pass": "backward"}
    flat = bound.with_arrays([ya.reshape(-1, cols), ga.reshape(-1, cols)])
    dx = run("softmax", key, flat, ("y", "dy"), {}, plan=plan)["dx"].reshape(ya.shape)
    if moved:
        with bound.on_caller_stream():
            dx = xp.ascontiguousarray(xp.moveaxis(dx, -1, axis))
    return bound.wrap(dx)


def log_softmax_backward(y: Any, dy: Any, axis: int = -1, plan: Any = None) -> Any:
    """Gradient of :func:`log_softmax` given its output ``y`` and ``dy``; returns dx."""
    return softmax_backward(y, dy, axis, True, plan)
