"""conv2d_channels_last: logical (N, C, H, W) arrays stored channels-last (torch's
channels_last tensors as they are) run the NHWC problem with no per-call views, on the numpy
backend here, with the same result as dnnctl.ops.conv2d on the NHWC arrays."""

from __future__ import annotations

import numpy as np
import pytest

import dnnctl.ops as dops
from dnnctl.errors import ShapeError
from dnnctl.ops.conv2d.function import conv2d_channels_last


def _cl(a: np.ndarray) -> np.ndarray:
    """The logical (N, C, H, W) view of an (N, H, W, C) array: channels-last storage."""
    return a.transpose(0, 3, 1, 2)


@pytest.mark.parametrize("residual", [False, True])
def test_same_result_as_the_nhwc_call(residual):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 9, 11, 8), dtype=np.float32)  # N, H, W, C
    w = rng.standard_normal((6, 3, 3, 8), dtype=np.float32) * 0.2  # K, R, S, C
    b = rng.standard_normal(6, dtype=np.float32)
    r = rng.standard_normal((2, 5, 6, 6), dtype=np.float32) if residual else None
    want = dops.conv2d(x, w, b, stride=2, padding=1, activation="relu", residual=r,
                       layout="NHWC")
    got = conv2d_channels_last(_cl(x), _cl(w), b, stride=(2, 2), padding=(1, 1),
                               activation="relu", residual=None if r is None else _cl(r))
    assert got.shape == (2, 5, 6, 6)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_an_array_not_stored_channels_last_is_copied_not_misread():
    """A plain (N, C, H, W) array is valid input too: its NHWC view is strided, so the
    pipeline copies it instead of reading its memory as NHWC."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 4, 7, 7), dtype=np.float32)  # NCHW-contiguous
    w = rng.standard_normal((5, 4, 3, 3), dtype=np.float32)
    got = conv2d_channels_last(x, w, padding=(1, 1))
    want = dops.conv2d(x, w, padding=1)  # NCHW
    np.testing.assert_allclose(got, want.transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-5)


def test_not_4d_is_a_clear_error():
    with pytest.raises(ShapeError, match="x has shape"):
        conv2d_channels_last(np.zeros((4, 7, 7), np.float32), np.zeros((5, 4, 3, 3),
                                                                         np.float32))
