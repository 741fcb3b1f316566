"""The public ``dnnctl.ops.softmax`` / ``log_softmax`` calls: arrays -> problem key ->
planned variant -> launch."""

from __future__ import annotations

from typing import Any

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.dispatch import CallSpec, Parsed, call


def _parse(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    x, out = arrays
    axis, log = scalars
    dtype = mc.float_dtype(x, "x")
    shape = mc.nonempty_shape(x, "softmax")
    rank = len(shape)
    axis = mc.axis_index(axis, rank, "softmax: axis")
    mc.check_out(out, shape, dtype)
    rows, cols = x.size // shape[axis], shape[axis]
    key = {"rows": rows, "cols": cols, "dtype": dtype, "log": log}
    flat = {"x": (rows, cols), "y": (rows, cols)}
    given = (("y", 1),) if out is not None else ()
    outputs = () if out is not None else (("y", shape, x.dtype),)
    result: str | int = 1 if out is not None else "y"
    if axis == rank - 1:
        mc.contiguous(x, "x")
        return Parsed("softmax", key, (("x", 0, None),), outputs, given,
                      kernel_shapes=flat, result=result, like={"y": 0})

    # kernels reduce over contiguous rows: move the axis last (a copy), then back (a copy)
    def prepare(back: tuple[Any, ...]) -> dict[str, Any]:
        moved = xp.ascontiguousarray(xp.moveaxis(back[0], axis, -1))
        return {"x": moved.reshape(rows, cols)}

    def finish(kouts: dict[str, Any], back: tuple[Any, ...]) -> Any:
        moved = tuple(s for i, s in enumerate(shape) if i != axis) + (cols,)
        y = xp.moveaxis(kouts["y"].reshape(moved), -1, axis)
        if back[1] is not None:
            back[1][...] = y
            return back[1]
        return xp.ascontiguousarray(y)

    return Parsed("softmax", key, (), (("y", (rows, cols), x.dtype),), (),
                  prepare=prepare, finish=finish)


_SOFTMAX = CallSpec("softmax", _parse)


def softmax(x: Any, axis: int = -1, plan: Any = None, *, out: Any = None) -> Any:
    """exp(x - max) / sum over ``axis``. Another axis than the last costs two copies."""
    return call(_SOFTMAX, (x, out), (axis, False), plan)


def log_softmax(x: Any, axis: int = -1, plan: Any = None, *, out: Any = None) -> Any:
    """x - max - log(sum(exp(x - max))) over ``axis`` (same rules as :func:`softmax`)."""
    return call(_SOFTMAX, (x, out), (axis, True), plan)
