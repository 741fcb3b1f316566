"""Shared by the CPU-emulator kernel tests: the skip marker and the fixture that installs
tools/cuda_emu as the cupy backend (optionally with its own TMA tensor maps in place of the
driver's)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CUDA_INC = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"

needs_emu = pytest.mark.skipif(
    shutil.which("g++") is None or not (CUDA_INC / "cuda_fp16.h").exists()
    or not (ROOT / "tools" / "cuda_emu").is_dir(),
    reason="the CPU emulator needs g++ and the CUDA headers (/usr/local/cuda/include)")


def install_emulator(monkeypatch: Any, tensor_maps: bool = False) -> Iterator[Any]:
    """Yield the emulator installed as the cupy backend (body of an ``emu`` fixture)."""
    from dnnctl.backends import registry as base

    monkeypatch.syspath_prepend(str(ROOT))
    from tools.cuda_emu.emu import EmuBackend, emu_tensor_map

    be = EmuBackend()
    monkeypatch.setitem(base._BACKENDS, "cupy", be)
    if tensor_maps:
        from dnnctl.backends import tma

        monkeypatch.setattr(tma, "encode", emu_tensor_map)
        monkeypatch.setattr(tma, "available", lambda: True)
    yield be
    sys.modules.pop("tools.cuda_emu.emu", None)


def emu_fixture(tensor_maps: bool = False) -> Any:
    """A module's ``emu`` fixture: ``emu = emu_fixture()``."""

    @pytest.fixture(name="emu")
    def _emu(monkeypatch: Any) -> Iterator[Any]:
        yield from install_emulator(monkeypatch, tensor_maps)

    return _emu


def conv_emu_fixture() -> Any:
    """A conv2d module's ``emu`` fixture: tools/cuda_emu as the cupy backend (kernels built
    through it, cp.async checked) plus the conv2d runtime of test_conv2d_emulated (pointers,
    the kernels it builds itself, cuFFT, cuBLAS)."""

    @pytest.fixture(name="emu")
    def _emu(monkeypatch: Any) -> Iterator[Any]:
        from dnnctl.ops.conv2d import _cuda

        monkeypatch.syspath_prepend(str(ROOT / "tests" / "unit"))
        from test_conv2d_emulated import EmulatedRuntime, _toolchain

        runtime = EmulatedRuntime(_toolchain())
        for be in install_emulator(monkeypatch):
            with _cuda.use_runtime(runtime):
                yield be

    return _emu
