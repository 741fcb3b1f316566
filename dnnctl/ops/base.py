"""The op / variant model shared by the tuner, the dispatcher and the kernels.

* :class:`Problem` — an op name plus a frozen, hashable key (shape, dtype, layout, ...).
  Workload files, plan entries and run-time calls all use the same key.
* :class:`Op` — the key schema, a float64 numpy reference, a tolerance per dtype, an input
  generator, FLOP and minimum-byte counts, and a default heuristic.
* :class:`Variant` — one algorithm of one op on one backend: a parameter space with
  constraints, ``supports()`` with a reason, ``workspace_bytes()`` and ``build()``.

A built kernel is any callable ``kernel(inputs, outputs, attrs) -> None`` where ``inputs``
and ``outputs`` map names to backend arrays (CuPy or NumPy) and ``attrs`` holds the
non-shape scalars of the call (eps, momentum, negative_slope, ...). Kernels write every
element of every output; the tuner poisons outputs before each verification run. A kernel
marked ``adopts = True`` (a library that allocates its own results) may instead be called
without some outputs and returns those it made (``dnnctl.ops.dispatch.adopting``).
"""

from __future__ import annotations

import functools
import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from dnnctl.errors import UnsupportedError, UsageError

# ----------------------------------------------------------------------------- dtypes

DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")


def np_dtype(name: str) -> np.dtype:
    """NumPy dtype for a dnnctl dtype name (bfloat16 comes from ml_dtypes, as in CuPy 14)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if name in ("float32", "float16", "float64", "int32", "int64", "uint8"):
        return np.dtype(name)
    raise UsageError(f"unknown dtype {name!r}", hint=f"use one of {', '.join(DTYPES)}")


_DTYPE_NAMES: dict[Any, str] = {}
_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16",
            "fp32": "float32", "double": "float64"}


def dtype_name(dtype: Any) -> str:
    """dnnctl dtype name of a NumPy / CuPy / torch dtype (or of a name); memoized per dtype
    (every call's argument checks ask)."""
    try:
        return _DTYPE_NAMES[dtype]
    except TypeError:  # an unhashable description: no memo
        return _dtype_name(dtype)
    except KeyError:
        pass
    name = _dtype_name(dtype)
    if len(_DTYPE_NAMES) < 256:
        _DTYPE_NAMES[dtype] = name
    return name


def _dtype_name(dtype: Any) -> str:
    if not isinstance(dtype, str) and not str(dtype).startswith("torch."):
        try:
            dtype = np.dtype(dtype).name
        except TypeError:
            pass
    text = str(dtype).replace("torch.", "")
    return _ALIASES.get(text, text)


def dtype_size(name: str) -> int:
    return np_dtype(name).itemsize


# ----------------------------------------------------------------------------- keys

_REQUIRED = object()


@dataclass(frozen=True)
class Field:
    """Schema of one key field.

    kind: "int", "ints" (tuple of ``length`` ints; a scalar is broadcast), "str", "bool",
    "float". ``choices`` restricts values; ``minimum`` bounds ints.
    """

    kind: str
    default: Any = _REQUIRED
    choices: tuple[Any, ...] | None = None
    minimum: int | None = None
    length: int | None = None
    doc: str = ""

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED

    def normalize(self, op: str, name: str, value: Any) -> Any:
        """Validate and canonicalize one value; raise UsageError naming the field."""
        try:
            out = self._convert(value)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{op} key field '{name}': {value!r} is not a valid {self.kind} "
                             f"({exc})", hint=self.doc or None) from None
        if self.choices is not None and out not in self.choices:
            raise UsageError(f"{op} key field '{name}': {value!r} is not one of "
                             f"{list(self.choices)}")
        if self.minimum is not None:
            low = min(out, default=self.minimum) if type(out) is tuple else out
            if low < self.minimum:
                raise UsageError(f"{op} key field '{name}': {value!r} must be >= "
                                 f"{self.minimum}")
        return out

    def _convert(self, value: Any) -> Any:
        if self.kind == "int":
            return _as_int(value)
        if self.kind == "ints":
            if isinstance(value, str):
                value = [v for v in value.replace("x", ",").split(",") if v.strip()]
            if isinstance(value, (list, tuple)):
                vals = tuple(_as_int(v) for v in value)
            else:
                vals = (_as_int(value),) * (self.length or 1)
            if self.length is not None and len(vals) == 1:
                vals = vals * self.length
            if self.length is not None and len(vals) != self.length:
                raise ValueError(f"expected {self.length} values, got {len(vals)}")
            return vals
        if self.kind == "str":
            if not isinstance(value, str):
                raise TypeError("expected a string")
            return value
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
                return value.lower() in ("true", "1", "yes")
            if isinstance(value, int) and value in (0, 1):
                return bool(value)
            raise ValueError("expected true or false")
        if self.kind == "float":
            out = float(value)
            if not math.isfinite(out):
                raise ValueError("must be finite")
            return out
        raise TypeError(f"unknown field kind {self.kind}")


def _as_int(value: Any) -> int:
    if type(value) is int and -(2**40) <= value <= 2**40:  # the common case, checked below
        return value
    if isinstance(value, bool):
        raise TypeError("expected an integer, got a boolean")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("expected an integer")
        value = int(value)
    out = int(str(value).strip()) if isinstance(value, str) else int(value)
    if abs(out) > 2**40:
        raise ValueError("absurdly large")
    return out


@dataclass(frozen=True)
class Problem:
    """An op name plus its normalized key, as sorted (field, value) pairs. Hashable."""

    op: str
    key: tuple[tuple[str, Any], ...]

    def __hash__(self) -> int:
        # computed once: a plan looks the call's problem up on every planned call, and a
        # key's nested tuples cost ~0.5 us to hash again
        try:
            return self.__dict__["_hash"]
        except KeyError:
            h = self.__dict__["_hash"] = hash((self.op, self.key))
            return h

    def __reduce__(self) -> Any:
        # the fields only: a string's hash differs between processes
        return (Problem, (self.op, self.key))

    def __getitem__(self, name: str) -> Any:
        for k, v in self.key:
            if k == name:
                return v
        raise KeyError(name)

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for YAML/JSON (tuples become lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.key}

    def short(self) -> str:
        parts = []
        for k, v in self.key:
            text = "x".join(map(str, v)) if isinstance(v, tuple) else str(v)
            parts.append(f"{k}={text}")
        return f"{self.op}[{','.join(parts)}]"


def problem_sort_key(p: Problem) -> tuple[Any, ...]:
    """A total order on problems (op, then key values) that never compares int with str."""
    return (p.op, tuple((k, _sortable(v)) for k, v in p.key))


def _sortable(v: Any) -> tuple[int, Any]:
    if isinstance(v, bool):
        return (0, int(v))
    if isinstance(v, (int, float)):
        return (1, v)
    if isinstance(v, str):
        return (2, v)
    if isinstance(v, tuple):
        return (3, tuple(_sortable(x) for x in v))
    return (4, repr(v))


# ----------------------------------------------------------------------------- support


@dataclass(frozen=True)
class Support:
    """Answer of ``Variant.supports``: ``ok`` with a ``reason`` when it is not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


SUPPORTED = Support(True)


def unsupported(reason: str) -> Support:
    return Support(False, reason)


@dataclass(frozen=True)
class Choice:
    """A variant and its parameters: what a plan entry records and the dispatcher runs."""

    variant: str
    params: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, variant: str, params: Mapping[str, Any] | None = None) -> Choice:
        return cls(variant, tuple(sorted((params or {}).items())))

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)

    def label(self) -> str:
        if not self.params:
            return self.variant
        return self.variant + "(" + ",".join(f"{k}={v}" for k, v in self.params) + ")"


class Kernel(Protocol):
    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> Any: ...


class LazyKernel:
    """A kernel built on its first call: the fallback a fast kernel hands the calls it cannot
    take (e.g. operands the copy engine refuses), which most programs never make."""

    __slots__ = ("make", "kernel")

    def __init__(self, make: Callable[[], Kernel]) -> None:
        self.make = make
        self.kernel: Kernel | None = None

    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                 attrs: Mapping[str, Any]) -> None:
        if self.kernel is None:
            self.kernel = self.make()
        self.kernel(inputs, outputs, attrs)


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str


# ----------------------------------------------------------------------------- op


class Op(ABC):
    """One operation: key schema, reference, tolerances, counts and default heuristic."""

    name: ClassVar[str]
    fields: ClassVar[dict[str, Field]]
    doc: ClassVar[str] = ""
    # attrs: non-shape scalars with their defaults; the tuner uses these values.
    attrs: ClassVar[dict[str, Any]] = {}

    # -- keys
    def problem(self, key: Mapping[str, Any] | None = None, **kwargs: Any) -> Problem:
        """Normalize and validate a key (from a call, a workload file or the CLI)."""
        raw = dict(key or {}, **kwargs)
        unknown = sorted(set(raw) - set(self.fields))
        if unknown:
            raise UsageError(f"{self.name}: unknown key field(s) {unknown}",
                             hint=f"valid fields: {', '.join(self.fields)}")
        out: dict[str, Any] = {}
        for fname, spec in self.fields.items():
            if fname in raw and raw[fname] is not None:
                out[fname] = spec.normalize(self.name, fname, raw[fname])
            elif spec.required:
                raise UsageError(f"{self.name}: key field '{fname}' is missing",
                                 hint=spec.doc or f"valid fields: {', '.join(self.fields)}")
            else:
                out[fname] = spec.default
        self.check(out)
        return Problem(self.name, tuple(sorted(out.items())))

    def check(self, key: dict[str, Any]) -> None:
        """Cross-field validation of a normalized key; raise UsageError when inconsistent."""

    # -- tensors
    @abstractmethod
    def input_specs(self, problem: Problem) -> dict[str, TensorSpec]: ...

    @abstractmethod
    def output_specs(self, problem: Problem) -> dict[str, TensorSpec]: ...

    def make_inputs(self, problem: Problem, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Fresh random inputs (never zeros); ops override where values are constrained."""
        out = {}
        for name, spec in self.input_specs(problem).items():
            out[name] = rng.standard_normal(spec.shape, dtype=np.float32).astype(
                np_dtype(spec.dtype))
        return out

    def default_attrs(self, problem: Problem) -> dict[str, Any]:
        return dict(self.attrs)

    @abstractmethod
    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """float64 numpy reference of every output (inputs are upcast by the caller)."""

    def error_scale(self, problem: Problem, inputs: Mapping[str, np.ndarray],
                    attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Per output (only those that need one): the float64 magnitude of the terms each
        element is the sum of, e.g. rstd (|g| + |mean(g)| + |xhat mean(g xhat)|) for a norm's
        dx. Where the terms cancel (a row of length 1, two elements per channel) the result is
        tiny or zero while a correct kernel's rounding error stays relative to the terms, so
        errors are measured against max(|ref|, scale) (see :func:`rel_norm_error`). Inputs are
        upcast as for :meth:`reference`. Default: none (errors relative to |ref|)."""
        return {}

    def tolerance(self, problem: Problem, output: str) -> float:
        """Allowed ‖out − ref‖ / ‖max(|ref|, scale)‖ for ``output`` (scale: see
        :meth:`error_scale`), by the problem's dtype."""
        dtype = problem.get("dtype", "float32")
        return {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}.get(dtype, 1e-5)

    # -- roofline
    def flops(self, problem: Problem) -> float:
        return 0.0

    def min_bytes(self, problem: Problem) -> float:
        total = 0
        for spec in (*self.input_specs(problem).values(), *self.output_specs(problem).values()):
            total += math.prod(spec.shape) * dtype_size(spec.dtype)
        return float(total)

    # -- heuristic
    @abstractmethod
    def default_choice(self, problem: Problem, backend: str, device: Any) -> Choice:
        """The variant + params run when no plan covers ``problem`` (a sound default)."""


# ----------------------------------------------------------------------------- variant


PASSES: tuple[str, ...] = ("forward", "backward", "dgrad", "wgrad")


def pass_of(problem: Problem) -> str:
    """The pass a problem asks for (key field ``pass``; absent means forward)."""
    return problem.get("pass", "forward")


class Variant(ABC):
    """One algorithm of one op on one backend, with a searchable parameter space.

    ``passes`` names the passes (key field ``pass``) the variant computes; ``supports()``
    answers "no" for any other pass before the subclass's own checks run, so forward
    variants never claim a backward problem (and the other way round).
    """

    op: ClassVar[str]
    name: ClassVar[str]
    backend: ClassVar[str]  # "cupy" | "numpy"
    passes: ClassVar[tuple[str, ...]] = ("forward",)
    params: ClassVar[dict[str, tuple[Any, ...]]] = {}
    deterministic: ClassVar[bool] = True
    vendor: ClassVar[bool] = False  # a library's kernel (cuBLAS, cuDNN, torch, flash-attn)
    # the library is called through torch: a torch caller runs it on its own tensors and
    # stream (dnnctl.ops.torch_vendor), and the tuner times it so (native_io)
    via_torch: ClassVar[bool] = False
    source: ClassVar[str | None] = None  # kernels/<op>/<variant>.cu, relative to kernels/
    doc: ClassVar[str] = ""

    def valid_params(self, problem: Problem, params: Mapping[str, Any], device: Any) -> bool:
        """Constraints between parameters and the problem (tile fits, vector divides, ...)."""
        return True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("supports")
        if own is not None and not getattr(own, "_checks_pass", False):
            cls.supports = _pass_checked(own)  # type: ignore[method-assign]

    @abstractmethod
    def supports(self, problem: Problem, device: Any) -> Support: ...

    def workspace_bytes(self, problem: Problem, params: Mapping[str, Any]) -> int:
        return 0

    @abstractmethod
    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel: ...

    def param_space(self, problem: Problem, device: Any) -> Iterator[dict[str, Any]]:
        """Every valid parameter combination, in a fixed order."""
        return self.declared_space(lambda cand: self.valid_params(problem, cand, device))

    def declared_space(self, keep: Callable[[dict[str, Any]], bool]
                       ) -> Iterator[dict[str, Any]]:
        """Every combination of the declared ``params`` that ``keep`` accepts, in a fixed
        order (the product in declaration order)."""
        names = list(self.params)
        for values in itertools.product(*(self.params[n] for n in names)):
            cand = dict(zip(names, values))
            if keep(cand):
                yield cand

    def first_valid(self, problem: Problem, device: Any,
                    candidates: Iterable[Mapping[str, Any]],
                    workspace_limit: int | None = None) -> dict[str, Any] | None:
        """The first of ``candidates`` (a heuristic's picks, best first) that is in the
        declared space, passes :meth:`valid_params` and, with ``workspace_limit``, needs at
        most that many workspace bytes; else the first of the whole parameter space (None
        when it is empty). The usual tail of a variant's ``default_params``."""
        for cand in candidates:
            if (self.check_params(cand) is None and self.valid_params(problem, cand, device)
                    and (workspace_limit is None
                         or self.workspace_bytes(problem, cand) <= workspace_limit)):
                return dict(cand)
        return next(iter(self.param_space(problem, device)), None)

    def check_params(self, params: Mapping[str, Any]) -> str | None:
        """Reason the parameter dict is not in this variant's declared space, else None."""
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            return f"unknown parameter(s) {unknown} for {self.op}/{self.name}"
        for pname, values in self.params.items():
            if pname not in params:
                return f"parameter '{pname}' missing for {self.op}/{self.name}"
            if params[pname] not in values:
                return (f"parameter {pname}={params[pname]!r} is not one of {list(values)} "
                        f"for {self.op}/{self.name}")
        return None


def first_choice(table: Mapping[str, Variant], order: Iterable[str], problem: Problem,
                 backend: str, device: Any) -> Choice:
    """The first variant named in ``order`` (names not in ``table`` are skipped) that
    supports ``problem`` and has parameters for it: its own ``default_params()``, else the
    first of its space. The fallback walk of an op's ``default_choice``; UnsupportedError
    when no variant qualifies."""
    for name in order:
        variant = table.get(name)
        if variant is None or not variant.supports(problem, device):
            continue
        own = getattr(variant, "default_params", None)
        params = own(problem, device) if own is not None else next(
            iter(variant.param_space(problem, device)), None)
        if params is not None:
            return Choice.of(name, params)
    raise UnsupportedError(
        f"no registered {problem.op} variant on backend {backend!r} supports {problem.short()}",
        hint=f"run 'dnnctl kernels list --op {problem.op}' to see the registered variants")


def _pass_checked(fn: Any) -> Any:
    """Wrap a ``supports`` so a problem of another pass is refused with a reason first."""

    @functools.wraps(fn)
    def supports(self: Variant, problem: Problem, device: Any) -> Support:
        want = pass_of(problem)
        if want not in self.passes:
            return unsupported(f"{self.op}/{self.name} computes the {'/'.join(self.passes)} "
                               f"pass, not {want}")
        return fn(self, problem, device)

    supports._checks_pass = True  # type: ignore[attr-defined]
    return supports


# ----------------------------------------------------------------------------- helpers


@dataclass
class VerifyResult:
    ok: bool
    max_rel_err: float
    detail: str = ""
    errors: dict[str, float] = field(default_factory=dict)


def rel_norm_error(out: np.ndarray, ref: np.ndarray, scale: np.ndarray | None = None) -> float:
    """‖out − ref‖ / ‖max(|ref|, scale)‖ in float64; NaN/inf where the reference is finite
    gives inf.

    ``scale`` (optional, ref's shape or broadcastable) is the magnitude of the terms each
    output element is the sum of (see :meth:`Op.error_scale`): where they cancel, the rounding
    error of a correct kernel is relative to them, not to the (small or zero) result. Without
    it the denominator is ‖ref‖. Positions where the reference itself is NaN/inf must hold the
    same non-finite value (propagation); they are excluded from the norms.
    """
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        return math.inf
    ref_bad = ~np.isfinite(ref)
    if ref_bad.any():
        same = (np.isnan(ref) & np.isnan(out)) | (np.isinf(ref) & (out == ref))
        if not np.all(same[ref_bad]):
            return math.inf
    good = ~ref_bad
    o, r = out[good], ref[good]
    if not np.all(np.isfinite(o)):
        return math.inf
    denom = error_norm(ref, scale)
    diff = float(np.linalg.norm(o - r))
    if denom == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / denom


def error_norm(ref: np.ndarray, scale: np.ndarray | None = None) -> float:
    """The denominator of :func:`rel_norm_error`: ‖max(|ref|, scale)‖ over the positions
    where the reference is finite (‖ref‖ without a scale)."""
    ref = np.asarray(ref, dtype=np.float64)
    mag = np.abs(ref)
    if scale is not None:
        with np.errstate(invalid="ignore"):
            mag = np.fmax(mag, np.broadcast_to(np.asarray(scale, np.float64), ref.shape))
    good = np.isfinite(ref) & np.isfinite(mag)
    return float(np.linalg.norm(mag[good]))


def verify_outputs(op: Op, problem: Problem, outputs: Mapping[str, np.ndarray],
                   refs: Mapping[str, np.ndarray],
                   scales: Mapping[str, np.ndarray] | None = None) -> VerifyResult:
    """Compare every output against the reference with the op's tolerance (relative to the
    output's error scale where the op gives one, see :meth:`Op.error_scale`)."""
    errors: dict[str, float] = {}
    bad = []
    for name, ref in refs.items():
        err = rel_norm_error(outputs[name], ref, (scales or {}).get(name))
        errors[name] = err
        tol = op.tolerance(problem, name)
        if not err <= tol:
            bad.append(f"{name}: rel err {err:.3g} > tol {tol:.3g}")
    worst = max(errors.values(), default=0.0)
    return VerifyResult(not bad, worst, "; ".join(bad), errors)
