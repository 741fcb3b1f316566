"""Test configuration: GPU tests carry the ``gpu`` marker and skip cleanly without a GPU."""

from __future__ import annotations

import pytest


def _gpu_reason() -> str | None:
    from dnnctl.backends.registry import get_backend

    ok, reason = get_backend("cupy").availability()
    return None if ok else reason


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # everything under tests/gpu/ is a GPU test
        if "/tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
    if not any("gpu" in item.keywords for item in items):
        return
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"no usable GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
