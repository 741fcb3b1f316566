"""Search strategies, one per file, registered here by name."""

from __future__ import annotations

from dnnctl.errors import UsageError
from dnnctl.tune.strategies.auto import Auto
from dnnctl.tune.strategies.base import Strategy
from dnnctl.tune.strategies.exhaustive import Exhaustive
from dnnctl.tune.strategies.local import LocalSearch
from dnnctl.tune.strategies.random_sample import RandomSample

STRATEGIES: dict[str, type[Strategy]] = {}


def register_strategy(cls: type[Strategy]) -> type[Strategy]:
    STRATEGIES[cls.name] = cls
    return cls


for _cls in (Auto, Exhaustive, RandomSample, LocalSearch):
    register_strategy(_cls)


def get_strategy(name: str, seed: int = 0, max_evals: int | None = None) -> Strategy:
    """A fresh strategy object by name."""
    cls = STRATEGIES.get(name)
    if cls is None:
        raise UsageError(f"unknown strategy {name!r}",
                         hint=f"use one of {', '.join(STRATEGIES)}")
    if max_evals is not None and max_evals < 1:
        raise UsageError("--max-evals must be >= 1")
    return cls(seed=seed, max_evals=max_evals)


__all__ = ["STRATEGIES", "Strategy", "get_strategy", "register_strategy"]
