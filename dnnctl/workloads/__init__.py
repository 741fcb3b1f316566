"""Workloads: bundled ones generated from real architectures, and ``dnnctl-workload/1`` files.

``resolve("resnet50:batch=32,dtype=float16")``, ``resolve("my_app.yaml")`` or
``build("bert_base", seq=384)`` give a :class:`Workload`.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dnnctl.errors import UsageError
from dnnctl.ops.base import Problem
from dnnctl.workloads import cnn, transformer
from dnnctl.workloads.model import (
    SCHEMA,
    WorkItem,
    Workload,
    read_workload,
    workload_from_data,
    write_workload,
)

__all__ = ["BUNDLED", "SCHEMA", "WorkItem", "Workload", "WorkloadOptions", "build", "bundled", "default_workload",
           "read_workload", "resolve", "workload_from_data", "write_workload"]


@dataclass(frozen=True)
class Bundled:
    """A workload generator and the options it takes (with their defaults)."""

    name: str
    builder: Callable[..., Workload]

    @property
    def doc(self) -> str:
        return (inspect.getdoc(self.builder) or "").splitlines()[0]

    @property
    def options(self) -> dict[str, Any]:
        sig = inspect.signature(self.builder)
        return {k: p.default for k, p in sig.parameters.items()}


BUNDLED: dict[str, Bundled] = {b.name: b for b in (
    Bundled("resnet50", cnn.resnet50),
    Bundled("mobilenet_v2", cnn.mobilenet_v2),
    Bundled("bert_base", transformer.bert_base),
    Bundled("vit_b16", transformer.vit_b16),
    Bundled("llama7b_layer", transformer.llama7b_layer),
    Bundled("default", cnn.small),
)}


@dataclass(frozen=True)
class WorkloadOptions:
    """The options the command line gives bundled workloads (None: the workload's default;
    a workload without one of them rejects it by name). Library callers may pass any of a
    workload's options as a mapping instead."""

    batch: int | None = None
    seq: int | None = None
    dtype: str | None = None
    layout: str | None = None

    def given(self) -> dict[str, Any]:
        """The options that were set, by name."""
        return {k: v for k, v in vars(self).items() if v is not None}


def bundled() -> list[Bundled]:
    return list(BUNDLED.values())


def build(name: str, **options: Any) -> Workload:
    """The bundled workload ``name`` with ``options`` (None values keep the defaults)."""
    spec = BUNDLED.get(name)
    if spec is None:
        raise UsageError(f"unknown workload {name!r}",
                         hint=f"bundled workloads: {', '.join(BUNDLED)}; or give a "
                              "dnnctl-workload/1 file")
    allowed = spec.options
    opts: dict[str, Any] = {}
    for k, v in options.items():
        if v is None:
            continue
        if k not in allowed:
            raise UsageError(f"workload {name!r} has no option {k!r}",
                             hint=f"its options: {_fmt_opts(allowed)}")
        opts[k] = _coerce(name, k, v, allowed[k])
    return spec.builder(**opts)


def default_workload(backend: str) -> Workload:
    """What ``dnnctl tune`` with no arguments tunes: small, float16 NHWC on a GPU, float32
    NCHW on the CPU."""
    if backend == "cupy":
        return cnn.small(dtype="float16", layout="NHWC")
    return cnn.small()


# Documented defaults of a key given by hand (--key, api.tune(op=, key=)) for the fields an
# op leaves required: what the default workload uses on that backend.
KEY_DEFAULTS: dict[str, dict[str, str]] = {
    "cupy": {"dtype": "float16", "layout": "NHWC"},
    "numpy": {"dtype": "float32", "layout": "NCHW"},
}


def key_with_defaults(op: str, key: dict[str, Any], backend: str) -> dict[str, Any]:
    """``key`` plus the documented dtype / layout defaults of ``backend`` for the fields
    ``op`` has, requires and ``key`` leaves out (float16 NHWC on a GPU, float32 NCHW on the
    CPU; an op's own default always wins)."""
    from dnnctl.ops import registry

    fields = registry.get_op(op).fields
    out = dict(key)
    for name, value in KEY_DEFAULTS.get(backend, KEY_DEFAULTS["numpy"]).items():
        spec = fields.get(name)
        if spec is not None and spec.required and out.get(name) is None and (
                spec.choices is None or value in spec.choices):
            out[name] = value
    return out


def short_key(problem: Problem) -> str:
    """The key fields of ``problem`` that differ from its op's defaults, compactly
    (``m=512 n=512 k=512 float16``): dtype and layout values stand alone."""
    from dnnctl.ops import registry

    fields = registry.get_op(problem.op).fields
    parts = []
    for name, value in problem.key:
        spec = fields.get(name)
        if spec is not None and not spec.required and spec.default == value:
            continue
        text = "x".join(map(str, value)) if isinstance(value, tuple) else str(value)
        parts.append(text if name in ("dtype", "layout") else f"{name}={text}")
    return " ".join(parts)


def resolve(spec: str, **options: Any) -> Workload:
    """A workload from ``name[:opt=v,...]`` (bundled) or a path to a workload file."""
    path = Path(spec)
    if path.suffix.lower() in (".yaml", ".yml", ".json") or os.sep in spec or path.is_file():
        if any(v is not None for v in options.values()):
            raise UsageError("workload options (--batch, --seq, ...) apply to bundled "
                             "workloads, not to files", hint="edit the file instead")
        return read_workload(path)
    name, _, rest = spec.partition(":")
    inline = parse_kv(rest) if rest else {}
    for k, v in options.items():
        if v is not None:
            inline[k] = v
    return build(name.strip(), **inline)


def parse_kv(text: str) -> dict[str, str]:
    """'a=1,b=2x2,shape=8,128' -> {'a': '1', 'b': '2x2', 'shape': '8,128'}.

    A comma-separated piece without '=' continues the previous value (so lists need no
    quoting).
    """
    out: dict[str, str] = {}
    last: str | None = None
    for piece in text.split(","):
        piece = piece.strip()
        if not piece:
            continue
        if "=" in piece:
            k, _, v = piece.partition("=")
            last = k.strip()
            if not last:
                raise UsageError(f"empty name in {text!r}", hint="write name=value,...")
            if last in out:
                raise UsageError(f"{last!r} is given twice in {text!r}",
                                 hint="give each name once")
            out[last] = v.strip()
        elif last is not None:
            out[last] += "," + piece
        else:
            raise UsageError(f"{piece!r} in {text!r} is not name=value",
                             hint="write name=value,name=value")
    return out


def _coerce(name: str, key: str, value: Any, default: Any) -> Any:
    if isinstance(default, bool):
        if isinstance(value, str):
            return value.lower() in ("1", "true", "yes")
        return bool(value)
    if isinstance(default, int):
        try:
            out = int(value)
        except (TypeError, ValueError):
            raise UsageError(f"workload {name!r} option {key}={value!r} must be an integer"
                             ) from None
        if out < 1:
            raise UsageError(f"workload {name!r} option {key}={value!r} must be >= 1")
        return out
    return str(value)


def _fmt_opts(opts: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} (default {v})" for k, v in opts.items())
