"""Test-only plugin for the tuner: an op ``toy_scale`` (y = 2x) with numpy variants that
are fast, slow, wrong, crash the process, segfault, hang, run out of memory, or are
non-deterministic.

Loaded ONLY into tuning subprocesses, via ``--plugin _tune_plugin`` / ``$DNNCTL_PLUGINS``
with ``tests/unit`` on PYTHONPATH: never imported by the pytest process itself, so the
registry other tests iterate stays clean.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from dnnctl.ops.base import (
    DTYPES,
    SUPPORTED,
    Choice,
    Field,
    Kernel,
    Op,
    Problem,
    Support,
    TensorSpec,
    Variant,
    np_dtype,
)
from dnnctl.ops.registry import register_op, register_variant


@register_op
class ToyScale(Op):
    name = "toy_scale"
    fields = {"n": Field("int", minimum=1), "dtype": Field("str", default="float32",
                                                          choices=DTYPES)}

    def input_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        return {"x": TensorSpec((problem["n"],), problem["dtype"])}

    def output_specs(self, problem: Problem) -> dict[str, TensorSpec]:
        return {"y": TensorSpec((problem["n"],), problem["dtype"])}

    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray],
                  attrs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {"y": 2.0 * np.asarray(inputs["x"], dtype=np.float64)}

    def default_choice(self, problem: Problem, backend: str, device: Any) -> Choice:
        return Choice.of("slow")


class _Toy(Variant):
    op = "toy_scale"
    backend = "numpy"
    reps = 1

    def supports(self, problem: Problem, device: Any) -> Support:
        return SUPPORTED

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        reps = int(params.get("reps", self.reps))
        dt = np_dtype(problem["dtype"])
        misbehave = self.misbehave

        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            misbehave()
            for _ in range(reps):
                np.multiply(inputs["x"], dt.type(2), out=outputs["y"])

        return kernel

    def misbehave(self) -> None:
        return None


@register_variant
class Slow(_Toy):
    name = "slow"
    reps = 32


@register_variant
class Fast(_Toy):
    name = "fast"
    params = {"reps": (4, 8)}


@register_variant
class Wrong(_Toy):
    name = "wrong"

    def build(self, problem: Problem, params: Mapping[str, Any], device: Any) -> Kernel:
        def kernel(inputs: Mapping[str, Any], outputs: Mapping[str, Any],
                   attrs: Mapping[str, Any]) -> None:
            np.multiply(inputs["x"], 3, out=outputs["y"])

        return kernel


@register_variant
class Exits(_Toy):
    name = "exits"

    def misbehave(self) -> None:
        os._exit(7)


@register_variant
class Segfault(_Toy):
    name = "segfault"

    def misbehave(self) -> None:
        ctypes.string_at(0)


@register_variant
class Hangs(_Toy):
    name = "hangs"

    def misbehave(self) -> None:
        time.sleep(3600)


@register_variant
class OutOfMemory(_Toy):
    name = "oom"

    def misbehave(self) -> None:
        raise MemoryError("toy allocation of 1 PiB failed")


@register_variant
class NonDeterministic(_Toy):
    """The fastest (one multiply), but flagged like a split-K kernel with atomics."""

    name = "atomic"
    deterministic = False
