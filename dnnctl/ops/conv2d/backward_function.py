"""The public conv2d gradient calls: ``conv2d_backward_data`` (dgrad) and
``conv2d_backward_weight`` (wgrad, with the bias gradient), on the forward's call pipeline."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops.base import dtype_name
from dnnctl.ops.conv2d.function import _padding, _pair
from dnnctl.ops.conv2d.op import LAYOUTS, output_size
from dnnctl.ops.dispatch import CallSpec, Parsed, PlanLike, call, spec_outputs


def _shape(a: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in a.shape)


def _ints4(name: str, value: Sequence[int]) -> tuple[int, int, int, int]:
    vals = tuple(value) if isinstance(value, Sequence) else ()
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


def _arrays(which: str, arrays: tuple[Any, ...], names: tuple[str, str]) -> str:
    """The one dtype of a gradient call's two arrays (both given)."""
    for a, name in zip(arrays, names):
        if a is None:
            raise ShapeError(f"conv2d {which}: {name} is missing",
                             hint=f"pass {name} as an array")
    dtypes = {dtype_name(a.dtype) for a in arrays}
    if len(dtypes) > 1:
        raise ShapeError(f"conv2d backward: inputs mix dtypes {sorted(dtypes)}",
                         hint="cast every input to one dtype")
    return dtypes.pop()


def _parsed(arrays: tuple[Any, ...], key: dict[str, Any], names: tuple[str, str],
            result: Any, xp: Any) -> Parsed:
    """The call's outputs (in the op's spec shapes) and inputs: by pointer when both arrays
    are C-contiguous, else through contiguous copies made on every call."""
    outputs = spec_outputs("conv2d", key)
    if all(a.flags.c_contiguous for a in arrays):
        return Parsed("conv2d", key, ((names[0], 0, None), (names[1], 1, None)), outputs,
                      result=result)

    def prepare(back: tuple[Any, ...]) -> dict[str, Any]:
        return {nm: xp.ascontiguousarray(a) for nm, a in zip(names, back)}

    return Parsed("conv2d", key, (), outputs, result=result, prepare=prepare)


def _parse_dgrad(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    x_shape, stride, padding, dilation, groups, layout, tf32 = scalars
    dtype = _arrays("dgrad", arrays, ("dy", "w"))
    dy, w = arrays
    if len(w.shape) != 4:
        raise ShapeError(f"conv2d dgrad: w has shape {_shape(w)}, expected 4 dims")
    key = _key("dgrad", x_shape, _shape(w), stride, padding, dilation, groups, layout, dtype,
               tf32, False)
    _check_dy("dgrad", dy, key)
    return _parsed(arrays, key, ("dy", "w"), "dx", xp)


def _parse_wgrad(arrays: tuple[Any, ...], scalars: tuple[Any, ...], xp: Any) -> Parsed:
    w_shape, stride, padding, dilation, groups, layout, bias_grad, tf32 = scalars
    dtype = _arrays("wgrad", arrays, ("x", "dy"))
    x, dy = arrays
    if len(x.shape) != 4:
        raise ShapeError(f"conv2d wgrad: x has shape {_shape(x)}, expected 4 dims")
    key = _key("wgrad", _shape(x), w_shape, stride, padding, dilation, groups, layout, dtype,
               tf32, bias_grad)
    _check_dy("wgrad", dy, key)
    return _parsed(arrays, key, ("x", "dy"), ("dw", "db" if bias_grad else None), xp)


_DGRAD = CallSpec("conv2d_backward_data", _parse_dgrad)
_WGRAD = CallSpec("conv2d_backward_weight", _parse_wgrad)


def conv2d_backward_data(dy: Any, w: Any, x_shape: Sequence[int], stride: Any = 1,
                         padding: Any = 0, dilation: Any = 1, groups: int = 1,
                         layout: str = "NCHW", tf32: bool = False,
                         plan: PlanLike | None = None) -> Any:
    """dx of ``y = conv2d(x, w, stride, padding, dilation, groups)`` given ``dy``.

    ``x_shape`` is the forward input's shape in ``layout``; ``dy`` has the forward output's
    shape. Runs the plan's dgrad variant for this shape (else the default heuristic); the
    result is of ``dy``'s array kind.
    """
    return call(_DGRAD, (dy, w), (x_shape, stride, padding, dilation, groups, layout,
                                  bool(tf32)), plan)


def conv2d_backward_weight(x: Any, dy: Any, w_shape: Sequence[int], stride: Any = 1,
                           padding: Any = 0, dilation: Any = 1, groups: int = 1,
                           layout: str = "NCHW", bias_grad: bool = True, tf32: bool = False,
                           plan: PlanLike | None = None) -> tuple[Any, Any]:
    """(dw, db) of ``y = conv2d(x, w, bias, stride, padding, dilation, groups)`` given ``dy``.

    ``w_shape`` is the weight's shape in ``layout``; ``db`` (K,) is dy summed over N, P, Q,
    fused into the weight-gradient kernels that can, or None when ``bias_grad`` is false.
    """
    return call(_WGRAD, (x, dy), (w_shape, stride, padding, dilation, groups, layout,
                                  bool(bias_grad), bool(tf32)), plan)
