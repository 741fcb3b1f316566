"""The public conv2d gradient calls: ``conv2d_backward_data`` (dgrad) and
``conv2d_backward_weight`` (wgrad, with the bias gradient), dispatched like the forward."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops.base import dtype_name
from dnnctl.ops.conv2d.function import _padding, _pair
from dnnctl.ops.conv2d.op import LAYOUTS, output_size
from dnnctl.ops.dispatch import Bound, PlanLike, bind, run


def _shape(a: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in a.shape)


def _ints4(name: str, value: Sequence[int]) -> tuple[int, int, int, int]:
    vals = tuple(value)
    if len(vals) != 4 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                 for v in vals):
        raise UsageError(f"conv2d backward: {name}={value!r} must be 4 positive ints")
    return vals  # type: ignore[return-value]


def _key(which: str, x_shape: Sequence[int], w_shape: Sequence[int], stride: Any,
         padding: Any, dilation: Any, groups: int, layout: str, dtype: str, tf32: bool,
         bias: bool) -> dict[str, Any]:
    """The problem key of a gradient call from the forward's shapes and arguments."""
    if layout not in LAYOUTS:
        raise UsageError(f"conv2d {which}: layout={layout!r} is not one of {list(LAYOUTS)}")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise UsageError(f"conv2d {which}: groups={groups!r} must be a positive int")
    xs, ws = _ints4("x_shape" if which == "dgrad" else "x.shape", x_shape), _ints4(
        "w_shape" if which == "wgrad" else "w.shape", w_shape)
    nhwc = layout == "NHWC"
    n, c, h, wd = (xs[0], xs[3], xs[1], xs[2]) if nhwc else xs
    k, cg, r, s = (ws[0], ws[3], ws[1], ws[2]) if nhwc else ws
    if cg * groups != c:
        raise ShapeError(f"conv2d {which}: w has {cg} input channels per group, expected "
                         f"C/groups = {c}/{groups}",
                         hint=f"w is {'(K, R, S, C/groups)' if nhwc else '(K, C/groups, R, S)'}"
                              f" for layout {layout}")
    st, dil = _pair("stride", stride), _pair("dilation", dilation)
    pad = _padding(padding, r, s, st, dil)
    return {"n": n, "c": c, "h": h, "w": wd, "k": k, "r": r, "s": s, "stride": st, "pad": pad,
            "dilation": dil, "groups": groups, "dtype": dtype, "layout": layout, "bias": bias,
            "tf32": bool(tf32), "pass": which}


def _check_dy(which: str, dy: Any, key: dict[str, Any]) -> None:
    p, q = output_size(key["h"], key["w"], key["r"], key["s"], key["stride"], key["pad"],
                       key["dilation"])
    n, k = key["n"], key["k"]
    want = (n, p, q, k) if key["layout"] == "NHWC" else (n, k, p, q)
    if _shape(dy) != want:
        raise ShapeError(f"conv2d {which}: dy has shape {_shape(dy)}, expected {want} "
                         f"(the forward's output for these shapes and arguments)")


def _prepared(bound: Bound) -> list[Any]:
    xp = bound.backend.xp
    with bound.on_caller_stream():  # copies of strided inputs, ordered with the caller's work
        arrays = [xp.ascontiguousarray(a) for a in bound.arrays]
    bound.arrays = arrays
    dtypes = {dtype_name(a.dtype) for a in arrays}
    if len(dtypes) > 1:
        raise ShapeError(f"conv2d backward: inputs mix dtypes {sorted(dtypes)}",
                         hint="cast every input to one dtype")
    return arrays


def conv2d_backward_data(dy: Any, w: Any, x_shape: Sequence[int], stride: Any = 1,
                         padding: Any = 0, dilation: Any = 1, groups: int = 1,
                         layout: str = "NCHW", tf32: bool = False,
                         plan: PlanLike | None = None) -> Any:
    """dx of ``y = conv2d(x, w, stride, padding, dilation, groups)`` given ``dy``.

    ``x_shape`` is the forward input's shape in ``layout``; ``dy`` has the forward output's
    shape. Runs the plan's dgrad variant for this shape (else the default heuristic); the
    result is of ``dy``'s array kind.
    """
    bound = bind(dy, w)
    if bound.foreign:
        return bound.recurse(conv2d_backward_data, x_shape, stride, padding, dilation, groups,
                             layout, tf32, plan)
    dya, wa = _prepared(bound)
    if len(wa.shape) != 4:
        raise ShapeError(f"conv2d dgrad: w has shape {_shape(wa)}, expected 4 dims")
    key = _key("dgrad", x_shape, _shape(wa), stride, padding, dilation, groups, layout,
               dtype_name(dya.dtype), tf32, False)
    _check_dy("dgrad", dya, key)
    return run("conv2d", key, bound, ("dy", "w"), {}, plan=plan)["dx"]


def conv2d_backward_weight(x: Any, dy: Any, w_shape: Sequence[int], stride: Any = 1,
                           padding: Any = 0, dilation: Any = 1, groups: int = 1,
                           layout: str = "NCHW", bias_grad: bool = True, tf32: bool = False,
                           plan: PlanLike | None = None) -> tuple[Any, Any]:
    """(dw, db) of ``y = conv2d(x, w, bias, stride, padding, dilation, groups)`` given ``dy``.

    ``w_shape`` is the weight's shape in ``layout``; ``db`` (K,) is dy summed over N, P, Q,
    fused into the weight-gradient kernels that can, or None when ``bias_grad`` is false.
    """
    bound = bind(x, dy)
    if bound.foreign:
        return bound.recurse(conv2d_backward_weight, w_shape, stride, padding, dilation,
                             groups, layout, bias_grad, tf32, plan)
    xa, dya = _prepared(bound)
    if len(xa.shape) != 4:
        raise ShapeError(f"conv2d wgrad: x has shape {_shape(xa)}, expected 4 dims")
    key = _key("wgrad", _shape(xa), w_shape, stride, padding, dilation, groups, layout,
               dtype_name(xa.dtype), tf32, bool(bias_grad))
    _check_dy("wgrad", dya, key)
    out = run("conv2d", key, bound, ("x", "dy"), {}, plan=plan)
    return out["dw"], out.get("db")
