"""Candidates: every (variant, parameters) that can run a problem on a device.

The enumeration order is the *preference order* used to break ties: the op's default
heuristic first (a tie keeps what would have run anyway), then the vendor libraries'
candidates (cuDNN, cuBLAS, torch's SDPA backends: the bar a plan must clear, measured early
so that a run cut by its budget has them), then the other variants in registration order
with their parameters in declaration order. It is a pure function of the registry, the
problem and the device, so the same machine always gives the same order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dnnctl.backends.base import DeviceInfo
from dnnctl.ops import registry
from dnnctl.ops.base import Choice, Problem


class Candidate(Choice):
    """One variant with one parameter set, as the tuner enumerates, measures and journals
    it: a :class:`~dnnctl.ops.base.Choice` (a small hashable value) that serializes."""

    @classmethod
    def from_choice(cls, choice: Choice) -> Candidate:
        return cls(choice.variant, choice.params)

    @property
    def choice(self) -> Choice:
        return Choice(self.variant, self.params)

    def to_dict(self) -> dict[str, Any]:
        return {"variant": self.variant, "params": self.param_dict}


@dataclass
class Space:
    """The candidates of one problem, in preference order, and what was left out and why."""

    problem: Problem
    candidates: list[Candidate]
    default: Candidate | None  # the heuristic's choice (may be outside ``candidates``)
    skipped: dict[str, str] = field(default_factory=dict)  # variant -> reason
    workspace: dict[Candidate, int] = field(default_factory=dict)
    starts: dict[str, Candidate] = field(default_factory=dict)  # variant -> its own default
    vendors: frozenset[str] = frozenset()  # the variants that are a library's (vendor)

    def order(self) -> dict[Candidate, int]:
        return {c: i for i, c in enumerate(self.candidates)}

    def __len__(self) -> int:
        return len(self.candidates)


def enumerate_space(problem: Problem, backend: str, device: DeviceInfo, *,
                    deterministic: bool = False, max_workspace: int | None = None) -> Space:
    """Every supported candidate for ``problem``, default heuristic first."""
    op = registry.get_op(problem.op)
    try:
        default: Candidate | None = Candidate.from_choice(
            op.default_choice(problem, backend, device))
    except Exception:  # an op with no runnable default still gets tuned
        default = None
    cands: list[Candidate] = []
    skipped: dict[str, str] = {}
    workspace: dict[Candidate, int] = {}
    starts: dict[str, Any] = {}
    vendors: set[str] = set()
    limit = max_workspace if max_workspace is not None else math.inf
    for variant in registry.variants(problem.op, backend):
        if variant.vendor:
            vendors.add(variant.name)
        if deterministic and not variant.deterministic:
            skipped[variant.name] = "non-deterministic (--deterministic)"
            continue
        support = variant.supports(problem, device)
        if not support:
            skipped[variant.name] = support.reason or "not supported"
            continue
        n_before = len(cands)
        too_big = 0
        for params in variant.param_space(problem, device):
            cand = Candidate.of(variant.name, params)
            ws = int(variant.workspace_bytes(problem, params))
            if ws > limit:
                too_big += 1
                continue
            workspace[cand] = ws
            cands.append(cand)
        if len(cands) == n_before:
            skipped[variant.name] = (f"every parameter set needs more workspace than "
                                     f"{limit:.0f} bytes" if too_big else
                                     "no valid parameters for this shape")
            continue
        starts[variant.name] = _variant_default(variant, problem, device, set(cands[n_before:]))
        if starts[variant.name] is None:
            starts[variant.name] = cands[n_before]
    cands.sort(key=lambda c: c.variant not in vendors)  # stable: vendors first, in order
    if default is not None and default in workspace:
        cands.remove(default)
        cands.insert(0, default)
    return Space(problem, cands, default, skipped, workspace, starts, frozenset(vendors))


def _variant_default(variant: Any, problem: Problem, device: DeviceInfo,
                     present: set[Candidate]) -> Candidate | None:
    """The variant's own default parameters (``default_params``), if they are candidates."""
    own = getattr(variant, "default_params", None)
    if own is None:
        return None
    try:
        params = own(problem, device)
    except Exception:
        return None
    cand = Candidate.of(variant.name, params) if params is not None else None
    return cand if cand in present else None
