"""Shared by the NVRTC sweep tests: a build recorder standing in for the cupy backend, and
the local NVRTC compiler (tools/nvrtc_check.py), skipping where it is not installed."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pytest

from dnnctl.resources import kernels_dir


class BuildRecorder:
    """The cupy backend and the conv2d runtime, recording (source, defines) of every build."""

    xp = np

    def __init__(self):
        self.builds: set[tuple[str, tuple]] = set()

    def compile_module(self, source, *, defines=None, **_):
        self.builds.add((source, tuple(sorted((defines or {}).items()))))
        return self

    def function(self, source, defines, name):
        self.builds.add((source, tuple(sorted(defines.items()))))
        return lambda *a, **k: None

    def get_function(self, name):
        return type("F", (), {"max_dynamic_shared_size_bytes": 0})()

    def fft_plan(self, *args):
        return args


def nvrtc():
    """tools.nvrtc_check.nvrtc_compile, or a skip."""
    sys.path.insert(0, str(kernels_dir().parent))
    try:
        from tools.nvrtc_check import _libnvrtc, nvrtc_compile
    except ImportError:
        pytest.skip("tools/nvrtc_check.py not available (installed wheel)")
    try:
        _libnvrtc()
    except SystemExit:
        pytest.skip("libnvrtc not installed")
    return nvrtc_compile


def sm90a_clean_build(compile_: Callable, source: str, defines: Mapping[str, int]
                      ) -> tuple[int, str]:
    """Compile kernels/<source> with ``defines`` for sm_90a, ptxas verbose; assert it built
    with no spills and no stack frame. Returns (registers per thread, the log)."""
    inc = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    opts = ["-arch=sm_90a", "--std=c++17", f"-I{kernels_dir() / 'include'}", f"-I{inc}",
            "-DDNNCTL_HEADERS=0x0", "--ptxas-options=-v",
            *(f"-D{k}={int(v)}" for k, v in defines.items())]
    ok, log = compile_(kernels_dir() / source, opts, [])
    assert ok, f"{dict(defines)}:\n{log}"
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in log, (
        f"{dict(defines)}: spills\n{log}")
    return int(re.search(r"Used (\d+) registers", log).group(1)), log
