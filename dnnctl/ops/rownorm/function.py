"""The public row-norm calls (``dnnctl.ops.layer_norm``, ``rms_norm``): arrays -> problem
key -> plan -> variant.
"""

from __future__ import annotations

from typing import Any

from dnnctl.ops import _memory_common as mc
from dnnctl.ops.dispatch import CallSpec, Parsed, call


def _parse(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    x, w, b, out = arrays
    op, eps = scalars
    dtype = mc.float_dtype(x, "x")
    mc.contiguous(x, "x")
    shape = mc.nonempty_shape(x, op)
    cols = shape[-1]
    mc.check_vector(w, cols, dtype, "weight")
    mc.check_vector(b, cols, dtype, "bias")
    mc.check_out(out, shape, dtype)
    rows = x.size // cols
    key: dict[str, Any] = {"rows": rows, "cols": cols, "dtype": dtype, "weight": w is not None}
    inputs: tuple[tuple[str, int, Any], ...] = (("x", 0, None), ("weight", 1, None))
    if op == "layer_norm":
        key["bias"] = b is not None
        inputs += (("bias", 2, None),)
    attrs = {"eps": mc.as_float(eps, "eps", minimum=0.0)}
    views = {"x": (rows, cols), "y": (rows, cols)}
    if out is not None:
        return Parsed(op, key, inputs, (), (("y", 3),), attrs, result=3, kernel_shapes=views)
    return Parsed(op, key, inputs, (("y", shape, x.dtype),), (), attrs, kernel_shapes=views,
                  like={"y": 0})


_ROWNORM = CallSpec("rownorm", _parse)


def layer_norm(x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5,
               plan: Any = None, *, out: Any = None) -> Any:
    """Layer normalization over the last axis; ``weight`` / ``bias`` (cols,) in x's dtype."""
    return call(_ROWNORM, (x, weight, bias, out), ("layer_norm", eps), plan)


def rms_norm(x: Any, weight: Any = None, eps: float = 1e-6, plan: Any = None, *,
             out: Any = None) -> Any:
    """RMS normalization over the last axis; ``weight`` (cols,) in x's dtype."""
    return call(_ROWNORM, (x, weight, None, out), ("rms_norm", eps), plan)
