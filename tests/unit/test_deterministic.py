"""Determinism at run time: inside ``dnnctl.use_deterministic()`` (or, for torch tensors,
with ``torch.use_deterministic_algorithms(True)``) a call never runs a variant flagged
non-deterministic: a plan entry naming one is passed over for the default heuristic, and
the heuristic chooses among deterministic variants only.

A non-deterministic numpy softmax variant is registered for the duration of each test (and
removed after), and a one-entry plan names it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest

import dnnctl
from dnnctl.ops import registry
from dnnctl.ops.base import Choice, Problem
from dnnctl.ops.dispatch import bind, resolve
from dnnctl.ops.passes import NumpyVariant
from dnnctl.ops.registry import get_op, register_variant, variants

SHAPE = (3, 37)  # a signature no other test calls softmax with


class _OnePlan:
    """A plan (dnnctl.ops.dispatch.PlanLike) whose only entry is every softmax problem."""

    def __init__(self, choice: Choice) -> None:
        self.choice = choice

    def lookup(self, problem: Problem, backend: str, device: Any) -> Choice | None:
        return self.choice if problem.op == "softmax" else None


class NondetSoftmax(NumpyVariant):
    op = "softmax"
    name = "test_nondet"
    doc = "test-only: counts its calls; flagged non-deterministic"
    deterministic = False
    calls = 0

    def compute(self, problem: Problem, inputs: Mapping[str, Any],
                attrs: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
        type(self).calls += 1
        x = np.asarray(inputs["x"], dtype=np.float64)
        e = np.exp(x - x.max(-1, keepdims=True))
        return {"y": e / e.sum(-1, keepdims=True)}


@pytest.fixture
def nondet() -> Iterator[type]:
    # one class for the module: built kernels are cached per (problem, choice) across tests
    NondetSoftmax.calls = 0
    register_variant(NondetSoftmax)
    try:
        yield NondetSoftmax
    finally:
        registry._VARIANTS[("softmax", "numpy")].pop("test_nondet")


def _ref(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_plan_entry_runs_unless_determinism_is_asked(nondet: type) -> None:
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    plan = _OnePlan(Choice.of("test_nondet"))
    y = dnnctl.ops.softmax(x, plan=plan)
    assert nondet.calls == 1
    with dnnctl.use_deterministic():
        for _ in range(2):  # the second call takes the site's cached path
            y2 = dnnctl.ops.softmax(x, plan=plan)
    assert nondet.calls == 1, "a non-deterministic plan entry ran inside use_deterministic"
    np.testing.assert_allclose(y2, _ref(x), rtol=1e-5, atol=1e-6)
    dnnctl.ops.softmax(x, plan=plan)  # outside the block the plan's entry runs again
    assert nondet.calls == 2
    np.testing.assert_allclose(y, y2, rtol=1e-5, atol=1e-6)


def test_torch_deterministic_algorithms_are_honoured(nondet: type) -> None:
    torch = pytest.importorskip("torch")
    x = torch.randn(*SHAPE, generator=torch.Generator().manual_seed(1))
    plan = _OnePlan(Choice.of("test_nondet"))
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        y = dnnctl.ops.softmax(x, plan=plan)
    finally:
        torch.use_deterministic_algorithms(was)
    assert nondet.calls == 0, "torch asked for deterministic algorithms"
    torch.testing.assert_close(y, torch.softmax(x, -1), rtol=1e-5, atol=1e-6)
    dnnctl.ops.softmax(x, plan=plan)
    assert nondet.calls == 1


def test_variants_and_resolve_leave_out_non_deterministic_ones(nondet: type) -> None:
    assert "test_nondet" in {v.name for v in variants("softmax", "numpy")}
    with dnnctl.use_deterministic():
        names = {v.name for v in variants("softmax", "numpy")}
    assert "test_nondet" not in names and names
    op = get_op("softmax")
    problem = op.problem({"rows": SHAPE[0], "cols": SHAPE[1], "dtype": "float32"})
    bound = bind(np.zeros(SHAPE, np.float32))
    plan = _OnePlan(Choice.of("test_nondet"))
    assert resolve(op, problem, bound.backend, bound.device, plan).variant == "test_nondet"
    got = resolve(op, problem, bound.backend, bound.device, plan, deterministic=True)
    assert got.variant != "test_nondet"
    assert got == op.default_choice(problem, "numpy", bound.device)
