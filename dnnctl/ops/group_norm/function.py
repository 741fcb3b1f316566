"""The public group_norm call (``dnnctl.ops.group_norm``): arrays -> problem key -> plan
-> variant.
"""

from __future__ import annotations

from typing import Any

from dnnctl.errors import ShapeError
from dnnctl.ops import _memory_common as mc
from dnnctl.ops._spatial_norm import affine_pair, dims_of
from dnnctl.ops.dispatch import CallSpec, Parsed, call


def _parse_gn(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    x, w, b, out = arrays
    groups, eps, layout = scalars
    dtype = mc.float_dtype(x, "x")
    mc.contiguous(x, "x")
    layout = mc.check_layout(layout)
    shape = tuple(x.shape)
    n, c, h, wd = dims_of(shape, layout, "group_norm")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1 or c % groups:
        raise ShapeError(f"group_norm: {c} channels are not divisible into {groups!r} groups",
                         hint="groups must be a positive int dividing the channels")
    consts: dict[str, Any] = {}
    w2, b2 = affine_pair(xp, w, b, c)
    if w is None and w2 is not None:
        consts["weight"] = w2
    if b is None and b2 is not None:
        consts["bias"] = b2
    mc.check_vector(w2, c, "float32", "weight")
    mc.check_vector(b2, c, "float32", "bias")
    mc.check_out(out, shape, dtype)
    key = {"n": n, "c": c, "h": h, "w": wd, "groups": groups, "dtype": dtype,
           "layout": layout, "affine": w2 is not None}
    attrs = {"eps": mc.as_float(eps, "eps", minimum=0.0)}
    x4 = (n, c, h, wd) if layout == "NCHW" else (n, h, wd, c)
    inputs = (("x", 0, None), ("weight", 1, None), ("bias", 2, None))
    views = {"x": x4, "y": x4}
    if out is not None:
        return Parsed("group_norm", key, inputs, (), (("y", 3),), attrs, consts,
                      3, kernel_shapes=views)
    return Parsed("group_norm", key, inputs, (("y", shape, x.dtype),), (),
                  attrs, consts, kernel_shapes=views, like={"y": 0})


_GN = CallSpec("group_norm", _parse_gn)


def group_norm(x: Any, groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5,
               layout: str = "NCHW", plan: Any = None, *, out: Any = None) -> Any:
    """Group normalization over (C/groups, H, W) per sample; weight / bias fp32 (C,)."""
    return call(_GN, (x, weight, bias, out), (groups, eps, layout), plan)
