"""Shared by the NVRTC sweep tests: a build recorder standing in for the cupy backend, and
the local NVRTC compiler (tools/nvrtc_check.py), skipping where it is not installed."""

from __future__ import annotations

import sys

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
