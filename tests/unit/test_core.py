"""The shared model: key fields, problems, error metric, backends, interop, resources."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dnnctl.backends.registry import get_backend, parse_device
from dnnctl.errors import ShapeError, UsageError
from dnnctl.ops.base import Choice, Field, Problem, dtype_name, np_dtype, rel_norm_error
from dnnctl.ops.dispatch import bind
from dnnctl.resources import compat_dir, kernels_dir


def test_int_field_rejects_bools_fractions_and_huge_numbers():
    f = Field("int", minimum=1)
    assert f.normalize("op", "n", "32") == 32
    assert f.normalize("op", "n", 4.0) == 4
    for bad in (True, 2.5, "x", 0, 10**20):
        with pytest.raises(UsageError, match="op key field 'n'"):
            f.normalize("op", "n", bad)


def test_ints_field_broadcasts_and_parses_text():
    f = Field("ints", length=2, minimum=1)
    assert f.normalize("conv2d", "stride", 2) == (2, 2)
    assert f.normalize("conv2d", "stride", [1, 2]) == (1, 2)
    assert f.normalize("conv2d", "stride", "3x1") == (3, 1)
    with pytest.raises(UsageError, match="expected 2 values"):
        f.normalize("conv2d", "stride", [1, 2, 3])


def test_choice_and_bool_fields():
    assert Field("bool").normalize("o", "b", "yes") is True
    with pytest.raises(UsageError, match="not one of"):
        Field("str", choices=("NCHW", "NHWC")).normalize("o", "layout", "NWHC")


def test_problem_is_hashable_and_round_trips():
    p = Problem("conv2d", (("n", 1), ("stride", (2, 2))))
    q = Problem("conv2d", (("n", 1), ("stride", (2, 2))))
    assert p == q and hash(p) == hash(q)
    assert p.as_dict() == {"n": 1, "stride": [2, 2]}
    assert p["stride"] == (2, 2) and p.get("missing", 7) == 7
    assert p.short() == "conv2d[n=1,stride=2x2]"


def test_choice_params_are_order_independent():
    assert Choice.of("mma", {"bm": 128, "bn": 64}) == Choice.of("mma", {"bn": 64, "bm": 128})
    assert Choice.of("mma", {"bm": 128}).label() == "mma(bm=128)"


def test_dtypes():
    assert np_dtype("bfloat16").itemsize == 2
    assert dtype_name(np.float16) == "float16"
    assert dtype_name("torch.bfloat16") == "bfloat16"
    with pytest.raises(UsageError):
        np_dtype("float8")


def test_rel_norm_error_catches_nan_and_unwritten_outputs():
    ref = np.linspace(-1, 1, 101)
    assert rel_norm_error(ref.copy(), ref) == 0.0
    out = ref.copy()
    out[3] = np.nan  # an element the kernel never wrote (poisoned)
    assert rel_norm_error(out, ref) == math.inf
    # NaN where the reference propagates NaN is right; a number there is wrong
    ref2 = ref.copy()
    ref2[5] = np.nan
    ok = ref2.copy()
    assert rel_norm_error(ok, ref2) == 0.0
    wrong = ref2.copy()
    wrong[5] = 0.0
    assert rel_norm_error(wrong, ref2) == math.inf
    assert rel_norm_error(ref[:-1], ref) == math.inf  # shape mismatch


def test_numpy_backend_times_a_real_function():
    be = get_backend("numpy")
    a = np.random.default_rng(0).standard_normal((256, 256))
    samples = be.time(lambda: a @ a, warmup_ms=1, budget_ms=5, min_samples=5, flush_l2=False)
    assert len(samples) >= 5 and np.all(samples > 0)


def test_parse_device():
    assert parse_device("cpu") == ("numpy", 0)
    assert parse_device("cuda:1") == ("cupy", 1)
    with pytest.raises(UsageError, match="unknown device"):
        parse_device("tpu:0")


def test_bind_rejects_non_arrays_and_mixed_kinds():
    with pytest.raises(ShapeError, match="expected an array"):
        bind([1, 2, 3])
    b = bind(np.zeros(3, np.float32), None)
    assert b.backend.name == "numpy" and b.arrays[1] is None


def test_bundled_data_is_found():
    assert (kernels_dir() / "include" / "dnnctl" / "common.cuh").is_file()
    assert compat_dir().is_dir()


def test_variant_supports_refuses_other_passes_first():
    from dnnctl.ops.base import SUPPORTED, Problem, Variant

    class Fwd(Variant):
        op, name, backend = "demo", "fwd", "numpy"

        def supports(self, problem, device):
            return SUPPORTED

        def build(self, problem, params, device):
            raise NotImplementedError

    class Bwd(Fwd):
        name, passes = "bwd", ("backward",)

    fw = Problem("demo", (("n", 1),))
    bw = Problem("demo", (("n", 1), ("pass", "backward")))
    assert Fwd().supports(fw, None) and Bwd().supports(bw, None)
    assert "not backward" in Fwd().supports(bw, None).reason
    assert "not forward" in Bwd().supports(fw, None).reason
