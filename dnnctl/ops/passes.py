"""The backward pass of a memory-bound op as the same op with key field ``pass: backward``.

An op keeps one key schema for both passes (so workloads, plans and ``--key`` name a backward
problem as ``{..., pass: backward}``); :func:`with_backward` puts a :class:`BackwardSpec` in
front of the op's per-problem methods: a backward problem goes to the spec, a forward one to
the op's own code. Key fields that equal their "absent" value (``pass: forward``) are left out
of the normalized key, so forward keys, plan entries and digests stay as they were.
The CPU variants of either pass derive from :class:`NumpyVariant` (say what a call computes).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

from dnnctl.ops.base import (
    SUPPORTED,
    Choice,
    Field,
    Kernel,
    Op,
    Problem,
    Support,
    TensorSpec,
    Variant,
    pass_of,
)

PASS_FIELD = Field("str", "forward", choices=("forward", "backward"),
                   doc="forward | backward (gradients of the inputs and parameters)")

# methods of an Op that take the problem first and branch on the pass
SPLIT = ("input_specs", "output_specs", "make_inputs", "reference", "error_scale", "tolerance",
         "flops", "min_bytes", "default_choice", "default_attrs")


class BackwardSpec:
    """The backward half of an op: tensors, gradients (the float64 reference and the numpy
    variant both run :meth:`grads`), tolerances, counts, default.

    Methods receive the op (``op``) as their first argument after ``self``; ``min_bytes``
    and ``default_attrs`` fall back to the op's generic behaviour.
    """

    attrs: dict[str, Any] = {}

    def check(self, op: Op, key: dict[str, Any]) -> None:
        """Cross-field validation of a backward key (raise UsageError)."""

    def input_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        raise NotImplementedError

    def output_specs(self, op: Op, problem: Problem) -> dict[str, TensorSpec]:
        raise NotImplementedError

    def make_inputs(self, op: Op, problem: Problem,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
        return Op.make_inputs(op, problem, rng)

    def grads(self, problem: Problem, inputs: Mapping[str, np.ndarray],
              attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        """Every output, computed in the precision of ``inputs``: float64 for
        :meth:`reference`, float32 for the numpy variant (:class:`NumpyBackward`)."""
        raise NotImplementedError

    def reference(self, op: Op, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        res = self.grads(problem, f64(inputs), attrs)
        return {k: res[k] for k in self.output_specs(op, problem)}

    def error_scale(self, op: Op, problem: Problem, inputs: Mapping[str, np.ndarray],
                    attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """See :meth:`Op.error_scale` (default: none)."""
        return {}

    def tolerance(self, op: Op, problem: Problem, output: str) -> float:
        return GRAD_TOL[problem["dtype"]]

    def flops(self, op: Op, problem: Problem) -> float:
        return 0.0

    def min_bytes(self, op: Op, problem: Problem) -> float:
        return Op.min_bytes(op, problem)

    def default_choice(self, op: Op, problem: Problem, backend: str, device: Any) -> Choice:
        if backend == "numpy":
            return Choice.of(NumpyBackward.name)
        return self.cuda_choice(op, problem, device)

    def cuda_choice(self, op: Op, problem: Problem, device: Any) -> Choice:
        """The default of the cupy backend (the numpy backend's is ``bwd_numpy``)."""
        raise NotImplementedError

    def default_attrs(self, op: Op, problem: Problem) -> dict[str, Any]:
        return {**op.attrs, **self.attrs}


# fields left out of a normalized key when they hold this value
ABSENT_WHEN: dict[str, Any] = {"pass": "forward"}


def with_backward(spec: BackwardSpec, absent: Mapping[str, Any] | None = None
                  ) -> Callable[[type[Op]], type[Op]]:
    """Class decorator: ``spec`` answers for backward problems of the decorated op.

    ``absent`` adds op-specific fields dropped from the key at their default (e.g. pool2d's
    ``indices: false``), so adding them changes no existing key.
    """
    drop = {**ABSENT_WHEN, **(absent or {})}

    def deco(cls: type[Op]) -> type[Op]:
        for name in SPLIT:
            setattr(cls, name, _split(getattr(cls, name), getattr(spec, name)))
        own_check, own_problem = cls.check, cls.problem

        def check(self: Op, key: dict[str, Any]) -> None:
            own_check(self, key)
            if key.get("pass", "forward") == "backward":
                spec.check(self, key)

        def problem(self: Op, key: Mapping[str, Any] | None = None, **kwargs: Any) -> Problem:
            out = own_problem(self, key, **kwargs)
            kept = tuple((k, v) for k, v in out.key if k not in drop or drop[k] != v)
            return out if len(kept) == len(out.key) else Problem(out.op, kept)

        cls.check = check  # type: ignore[method-assign]
        cls.problem = problem  # type: ignore[method-assign]
        cls.backward_spec = spec  # type: ignore[attr-defined]
        return cls

    return deco


def _split(forward: Callable[..., Any], backward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(forward)
    def method(self: Op, problem: Problem, *args: Any) -> Any:
        if pass_of(problem) == "backward":
            return backward(self, problem, *args)
        return forward(self, problem, *args)

    return method


def is_backward(problem: Problem) -> bool:
    return pass_of(problem) == "backward"


def f64(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every input upcast to float64 (integer index arrays kept as they are)."""
    return _floats_as(inputs, np.float64)


def f32(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every input as float32, the numpy variants' arithmetic (integer arrays kept)."""
    return _floats_as(inputs, np.float32)


def _floats_as(inputs: Mapping[str, np.ndarray], dtype: type) -> dict[str, np.ndarray]:
    return {k: v if np.issubdtype(np.asarray(v).dtype, np.integer)
            else np.asarray(v).astype(dtype, copy=False) for k, v in inputs.items()}


GRAD_TOL = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 2.4e-2}


def term_scale(*terms: np.ndarray) -> np.ndarray:
    """sum |t| of the (broadcast) terms an output element is the sum of: the scale its
    rounding error is relative to when they cancel (:meth:`Op.error_scale`)."""
    with np.errstate(all="ignore"):
        out = np.abs(terms[0])
        for t in terms[1:]:
            out = out + np.abs(t)
    return out


class NumpyVariant(Variant):
    """A CPU variant (numpy backend) that takes every problem of its passes; a subclass says
    what one call computes: :meth:`compute` returns every output (fp32 or float64 arrays,
    each written rounding once to the output's dtype), or :meth:`run` writes the outputs
    itself (the blocked variants, a chunk at a time)."""

    backend = "numpy"

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    def compute(self, problem: Problem, inputs: Mapping[str, Any],
                attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        raise NotImplementedError

    def run(self, problem: Problem, params: Mapping[str, Any], inputs: Mapping[str, Any],
            outputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> None:
        res = self.compute(problem, inputs, attrs)
        for k, dst in outputs.items():
            np.copyto(dst, res[k], casting="unsafe")

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        run = self.run

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            run(problem, params, inputs, outputs, attrs)

        return kernel


class NumpyBackward(NumpyVariant):
    """The numpy variant of a backward problem: its op's :meth:`BackwardSpec.grads` (a
    subclass names the op and the ``spec``) on float32 inputs."""

    passes = ("backward",)
    name = "bwd_numpy"
    spec: ClassVar[BackwardSpec]

    def compute(self, problem: Problem, inputs: Mapping[str, Any],
                attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        return self.spec.grads(problem, f32(inputs), attrs)

    @classmethod
    def of(cls, op: str, spec: BackwardSpec, doc: str) -> type[NumpyBackward]:
        """The ``bwd_numpy`` variant class of ``op`` (``spec`` answers its backward)."""
        title = "".join(p.title() for p in op.split("_"))
        return type(f"{title}BwdNumpy", (cls,), {"op": op, "spec": spec, "doc": doc,
                                                 "__module__": type(spec).__module__})


def f32_or_none(a: Any) -> Any:
    """A float32 view / copy of an optional input."""
    return None if a is None else np.asarray(a).astype(np.float32, copy=False)
