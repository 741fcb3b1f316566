"""The op / variant registry: register once, iterate everywhere (tests, tuner, CLI)."""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from contextvars import ContextVar

from dnnctl.errors import UsageError
from dnnctl.ops.base import Op, Variant

# Every module that registers ops or variants. Adding an op = one line here.
OP_MODULES: tuple[str, ...] = (
    "dnnctl.ops.activation",
    "dnnctl.ops.softmax",
    "dnnctl.ops.batch_norm",
    "dnnctl.ops.group_norm",
    "dnnctl.ops.rownorm",
    "dnnctl.ops.pool",
    "dnnctl.ops.conv2d",
    "dnnctl.ops.matmul",
    "dnnctl.ops.attention",
)

_OPS: dict[str, Op] = {}
_VARIANTS: dict[tuple[str, str], dict[str, Variant]] = {}  # (op, backend) -> name -> variant
_GENERATION = [0]  # bumped on every registration: memos of registry-derived answers key by it
_loaded = False
# set by dnnctl.use_deterministic (and, for torch callers, by the dispatcher when
# torch.use_deterministic_algorithms is on): variants() then lists deterministic ones only
_DETERMINISTIC: ContextVar[bool] = ContextVar("dnnctl_deterministic", default=False)


def deterministic_only() -> bool:
    """Whether the calls in flight may run only deterministic variants."""
    return _DETERMINISTIC.get()


@contextlib.contextmanager
def use_deterministic(enabled: bool = True) -> Iterator[None]:
    """Inside the block, ``dnnctl.ops`` calls run only variants whose results do not vary
    from run to run (no split-K partial sums meeting in float atomics): a plan entry naming
    another is passed over for the default heuristic, which chooses among deterministic
    variants only. torch callers get the same from ``torch.use_deterministic_algorithms``."""
    token = _DETERMINISTIC.set(bool(enabled))
    try:
        yield
    finally:
        _DETERMINISTIC.reset(token)


def register_op(cls: type[Op]) -> type[Op]:
    """Class decorator: instantiate and register an Op."""
    if cls.name in _OPS and type(_OPS[cls.name]) is not cls:
        raise RuntimeError(f"op {cls.name!r} registered twice")
    _OPS[cls.name] = cls()
    _GENERATION[0] += 1
    return cls


def register_variant(cls: type[Variant]) -> type[Variant]:
    """Class decorator: instantiate and register a Variant under (op, backend, name)."""
    table = _VARIANTS.setdefault((cls.op, cls.backend), {})
    if cls.name in table and type(table[cls.name]) is not cls:
        raise RuntimeError(f"variant {cls.op}/{cls.backend}/{cls.name} registered twice")
    table[cls.name] = cls()
    _GENERATION[0] += 1
    return cls


def generation() -> int:
    """A number that changes whenever an op or variant is registered (a plugin loaded)."""
    return _GENERATION[0]


PLUGINS_ENV = "DNNCTL_PLUGINS"


def plugin_modules() -> list[str]:
    """Extra modules named in $DNNCTL_PLUGINS (comma separated) that register ops/variants.

    Tuning workers inherit the environment, so a plugin's variants exist in every process.
    """
    return [m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]


def load_all() -> None:
    """Import every op module (and every plugin module) so the registry is complete.

    """
    global _loaded
    if _loaded:
        return
    for mod in OP_MODULES:
        importlib.import_module(mod)
    for mod in plugin_modules():
        try:
            importlib.import_module(mod)
        except ImportError as exc:
            raise UsageError(f"plugin module {mod!r} (from ${PLUGINS_ENV}) cannot be imported: "
                             f"{exc}", hint="check the module name and sys.path / PYTHONPATH"
                             ) from None
    _loaded = True


def ops() -> dict[str, Op]:
    load_all()
    return dict(sorted(_OPS.items()))


def get_op(name: str) -> Op:
    load_all()
    try:
        return _OPS[name]
    except KeyError:
        raise UsageError(f"unknown op {name!r}",
                         hint=f"known ops: {', '.join(sorted(_OPS))}") from None


def variants(op: str, backend: str | None = None) -> list[Variant]:
    """Variants of ``op`` (for one backend, or all), in registration order; deterministic
    ones only inside :func:`use_deterministic`."""
    load_all()
    out: list[Variant] = []
    for (o, b), table in _VARIANTS.items():
        if o == op and (backend is None or b == backend):
            out.extend(table.values())
    if _DETERMINISTIC.get():
        out = [v for v in out if v.deterministic]
    return out


def get_variant(op: str, backend: str, name: str) -> Variant:
    load_all()
    table = _VARIANTS.get((op, backend), {})
    try:
        return table[name]
    except KeyError:
        raise UsageError(
            f"unknown variant {name!r} of op {op!r} on backend {backend!r}",
            hint=f"known variants: {', '.join(table) or '(none)'}",
        ) from None
