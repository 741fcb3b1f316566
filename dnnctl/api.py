"""The library facade the CLI calls. Each function returns data; none prints or exits."""

from __future__ import annotations

from typing import Any

from dnnctl.ops import registry


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
