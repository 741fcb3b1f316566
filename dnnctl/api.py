"""The library facade the CLI calls. Each function returns data; none prints or exits."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dnnctl.ops import registry

if TYPE_CHECKING:
    from dnnctl.doctor.model import DoctorReport


def list_kernels(op: str | None = None, backend: str | None = None) -> list[dict[str, Any]]:
    """Every registered variant: op, backend, name, parameter space, source file."""
    ops = [registry.get_op(op).name] if op else list(registry.ops())
    rows = []
    for name in ops:
        for v in registry.variants(name, backend):
            rows.append({
                "op": name, "backend": v.backend, "variant": v.name,
                "params": {k: list(vals) for k, vals in v.params.items()},
                "deterministic": v.deterministic, "source": v.source, "doc": v.doc,
            })
    return rows


# -- compat (the matrix as a planning tool) ----------------------------------------------------


def compat_check(*, gpu: str | None = None, driver: str | None = None, cuda: str | None = None,
                 cudnn: str | None = None, torch: str | None = None,
                 tensorflow: str | None = None, jax: str | None = None,
                 cupy: Sequence[str] = (), python: str | None = None,
                 matrix: Sequence[str | os.PathLike[str]] = ()) -> DoctorReport:
    """Judge a planned deployment (any subset of the flags) exactly as doctor would."""
    from dnnctl.compat.matrix import load_matrix
    from dnnctl.compat.queries import Plan, plan_snapshot
    from dnnctl.doctor.model import DoctorReport
    from dnnctl.doctor.rules import judge
    from dnnctl.errors import UsageError

    plan = Plan(gpu, driver, cuda, cudnn, torch, tensorflow, jax, list(cupy), python)
    if not any((gpu, driver, cuda, cudnn, torch, tensorflow, jax, cupy)):
        raise UsageError("nothing to check", hint="give at least one of --gpu --driver --cuda "
                         "--cudnn --torch --tensorflow --jax --cupy")
    table = load_matrix([Path(m) for m in matrix])
    env = plan_snapshot(plan)
    for g in env.gpus:  # what the matrix knows fills in what the plan left out
        model = table.gpu(g.name) if g.name else None
        if model is not None and g.compute_capability is None:
            g.compute_capability = model["cc"]
    return DoctorReport(env, judge(env, table), origin="planned deployment")


def compat_suggest(gpu: str, *, driver: str | None = None, framework: str | None = None,
                   python: str | None = None,
                   matrix: Sequence[str | os.PathLike[str]] = ()) -> dict[str, Any]:
    """Working combinations for ``gpu`` (name or compute capability), newest first."""
    from dnnctl.compat.matrix import load_matrix
    from dnnctl.compat.queries import suggest

    return suggest(load_matrix([Path(m) for m in matrix]), gpu, driver=driver,
                   framework=framework, python=python)


def compat_show(table: str, filters: Sequence[str] = (),
                matrix: Sequence[str | os.PathLike[str]] = ()) -> dict[str, Any]:
    """One matrix table (gpus, archs, cuda, cudnn, torch, tensorflow, jax, cupy), filtered."""
    from dnnctl.compat.matrix import load_matrix
    from dnnctl.compat.queries import show

    return show(load_matrix([Path(m) for m in matrix]), table, filters)
