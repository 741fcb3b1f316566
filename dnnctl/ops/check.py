"""Verification of one candidate against the float64 reference (tests and the tuner use it).

Fresh random inputs every call, outputs poisoned with NaN before the run, every output
compared by relative norm error against the op's tolerance (relative to the magnitude of
the terms that cancel where the op declares one: ``Op.error_scale``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dnnctl.backends.base import Backend, DeviceInfo
from dnnctl.ops.base import Kernel, Op, Problem, VerifyResult, np_dtype, verify_outputs
from dnnctl.ops.dispatch import adopting, adoption_error


@dataclass
class Prepared:
    """Device inputs, poisoned outputs and the reference for one problem instance."""

    host_inputs: dict[str, np.ndarray]
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    attrs: dict[str, Any]
    refs: dict[str, np.ndarray]
    scales: dict[str, np.ndarray] = field(default_factory=dict)  # see Op.error_scale


def prepare(op: Op, problem: Problem, backend: Backend, rng: np.random.Generator,
            attrs: Mapping[str, Any] | None = None, with_reference: bool = True) -> Prepared:
    """Fresh inputs on ``backend``, NaN-poisoned outputs, and (optionally) the reference."""
    host = op.make_inputs(problem, rng)
    attrs = dict(op.default_attrs(problem), **(attrs or {}))
    refs: dict[str, np.ndarray] = {}
    scales: dict[str, np.ndarray] = {}
    if with_reference:
        up = {k: v.astype(np.float64) if v.dtype.kind == "f" or str(v.dtype) == "bfloat16"
              else v for k, v in host.items()}
        refs = op.reference(problem, up, attrs)
        scales = op.error_scale(problem, up, attrs)
    inputs = {k: backend.asarray(v) for k, v in host.items()}
    outputs = {}
    for name, spec in op.output_specs(problem).items():
        arr = backend.empty(spec.shape, np_dtype(spec.dtype))
        backend.poison(arr)
        outputs[name] = arr
    return Prepared(host, inputs, outputs, attrs, refs, scales)


def run_and_verify(op: Op, problem: Problem, kernel: Kernel, backend: Backend,
                   rng: np.random.Generator, attrs: Mapping[str, Any] | None = None
                   ) -> VerifyResult:
    """Run ``kernel`` once on fresh inputs with poisoned outputs; compare with the reference.
    A kernel that adopts its outputs (``dnnctl.ops.dispatch.adopting``) is also run as the
    pipeline calls it, without outputs, and what it returns is checked the same way."""
    prep = prepare(op, problem, backend, rng, attrs)
    kernel(prep.inputs, prep.outputs, prep.attrs)
    backend.synchronize()
    got = {k: backend.to_numpy(v) for k, v in prep.outputs.items()}
    res = verify_outputs(op, problem, got, prep.refs, prep.scales)
    if not res.ok or not adopting(kernel):
        return res
    made = kernel(prep.inputs, {}, prep.attrs)
    backend.synchronize()
    bad = adoption_error(op.output_specs(problem), made)
    if bad:
        return VerifyResult(False, float("inf"), bad)
    adopted = verify_outputs(op, problem, {k: backend.to_numpy(v) for k, v in made.items()},
                             prep.refs, prep.scales)
    if not adopted.ok:
        return VerifyResult(False, adopted.max_rel_err, "adopted outputs: " + adopted.detail,
                            adopted.errors)
    return res if res.max_rel_err >= adopted.max_rel_err else adopted


def check_variant(op: Op, problem: Problem, variant: Any, params: Mapping[str, Any],
                  backend: Backend, device: DeviceInfo, seed: int | None = None) -> VerifyResult:
    """Build ``variant`` with ``params`` and verify it on fresh inputs (new seed each call)."""
    rng = np.random.default_rng(seed)
    kernel = variant.build(problem, dict(params), device)
    return run_and_verify(op, problem, kernel, backend, rng)
