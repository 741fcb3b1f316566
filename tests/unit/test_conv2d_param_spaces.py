"""conv2d parameter spaces agree with support and with the kernels, on the CPU.

* every registered cupy conv2d variant, on every shape of the GPU tests' lists
  (tests/gpu/test_conv2d.py CASES, tests/gpu/test_conv_backward.py SHAPES) for each pass,
  dtype and layout: supports() => default parameters that are valid and a non-empty space;
* every parameter set the wgrad implicit-GEMM variants' spaces yield on those shapes, for
  each dtype, builds defines that NVRTC compiles (front end: template instantiation and
  static_asserts, where a tile the kernel cannot map fails), so a space wider than the
  kernel is caught without a GPU (skipped without libnvrtc);
* the deterministic wgrad's default split-K is in its space (the split-K path is taken).
"""

from __future__ import annotations

import importlib.util
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from _nvrtc_helpers import BuildRecorder, nvrtc

from dnnctl.backends import registry as base
from dnnctl.backends.base import DeviceInfo
from dnnctl.errors import UnsupportedError
from dnnctl.ops.conv2d import _cuda
from dnnctl.ops.conv2d.op import default_params
from dnnctl.ops.conv2d.wgrad_implicit_gemm import gather_fits
from dnnctl.ops.registry import get_op, get_variant, variants
from dnnctl.resources import kernels_dir

OP = get_op("conv2d")
ROOT = Path(__file__).resolve().parents[2]
H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=232448)
DTYPES = ("float32", "float16", "bfloat16")
WGRAD_GEMM = ("wgrad_implicit_gemm", "wgrad_implicit_gemm_atomic", "wgrad_nhwc_implicit_gemm")


def _gpu_list(module: str, name: str) -> list[tuple[str, dict]]:
    spec = importlib.util.spec_from_file_location(f"_gpu_{module}",
                                                  ROOT / "tests" / "gpu" / f"{module}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return list(getattr(mod, name))


def _shapes() -> list[tuple[str, dict]]:
    """The GPU tests' shapes: edge cases (epilogue keys dropped) and training shapes."""
    edge = [(cid, {k: v for k, v in case.items() if k not in ("activation", "residual")})
            for cid, case in _gpu_list("test_conv2d", "CASES")]
    return edge + _gpu_list("test_conv_backward", "SHAPES")


def _problems(shape: dict, which: str):
    for dtype in DTYPES:
        for layout in ("NHWC", "NCHW"):
            for tf32 in ((False, True) if dtype == "float32" else (False,)):
                key = {k: v for k, v in shape.items() if k != "tf32"}
                if which != "forward":
                    key.pop("bias", None)
                    key["bias"] = which == "wgrad"
                yield OP.problem(dict(key, dtype=dtype, layout=layout, tf32=tf32,
                                      **{"pass": which}))


SHAPES = _shapes()


@pytest.mark.parametrize("name", [v.name for v in variants("conv2d", "cupy")])
def test_support_implies_valid_parameters(name):
    v = get_variant("conv2d", "cupy", name)
    seen = 0
    for sid, shape in SHAPES:
        for which in v.passes:
            for p in _problems(shape, which):
                if not v.supports(p, H200):
                    continue
                seen += 1
                first = next(iter(v.param_space(p, H200)), None)
                assert first is not None, f"{name} supports {sid} {p.short()} but its space is empty"
                dp = default_params(v, p, H200)
                assert dp is not None, (sid, p.short())
                assert v.check_params(dp) is None, (sid, p.short(), dp)
                assert v.valid_params(p, dp, H200), (sid, p.short(), dp)
    if seen == 0:
        pytest.skip(f"{name} supports none of the GPU tests' shapes")


def test_atomic_wgrad_declines_what_it_cannot_split():
    v = get_variant("conv2d", "cupy", "wgrad_implicit_gemm_atomic")
    p = OP.problem(dict(n=2, c=24, h=15, w=13, k=40, r=3, s=3, stride=2, pad=[1, 0, 0, 1],
                        dtype="float16", layout="NHWC", bias=True, **{"pass": "wgrad"}))
    sup = v.supports(p, H200)
    assert not sup and "84 pixels" in sup.reason and "wgrad_implicit_gemm" in sup.reason
    assert next(iter(v.param_space(p, H200)), None) is None
    det = get_variant("conv2d", "cupy", "wgrad_implicit_gemm")
    assert det.supports(p, H200) and default_params(det, p, H200)["splitk"] == 1


def test_deterministic_wgrad_default_takes_the_split_k_path():
    """ResNet 3x3 (the GPU repeatability test's shape): the heuristic's split count (8 of
    49 k-tiles gives only 7 non-empty splits, outside the space) steps down to 4."""
    v = get_variant("conv2d", "cupy", "wgrad_implicit_gemm")
    p = OP.problem(dict(n=4, c=64, h=28, w=28, k=64, r=3, s=3, pad=1, dtype="float16",
                        layout="NHWC", bias=True, **{"pass": "wgrad"}))
    dp = default_params(v, p, H200)
    assert dp["splitk"] == 4 and v.valid_params(p, dp, H200)


def test_gather_fit_mirrors_the_kernel():
    # the H200 failure: bn 256 of single-channel copies needs 256 threads, 4 warps have 128
    assert not gather_fits(128, 256, 1)
    assert gather_fits(256, 256, 1) and gather_fits(128, 256, 2) and gather_fits(128, 32, 8)
    assert not gather_fits(128, 32, 64)
    v = get_variant("conv2d", "cupy", "wgrad_implicit_gemm")
    p = OP.problem(dict(n=1, c=3, h=45, w=43, k=32, r=7, s=7, stride=2, pad=3,
                        dtype="float32", tf32=True, layout="NHWC", **{"pass": "wgrad"}))
    bad = dict(bm=32, bn=256, bk=64, warps=4, stages=3, splitk=1)
    assert not v.valid_params(p, bad, H200)
    assert v.valid_params(p, dict(bad, warps=8), H200)
    with pytest.raises(UnsupportedError, match="threads per pixel row"):
        v.build(p, bad, H200)


def _opts(defs: tuple) -> list[str]:
    return ["-arch=sm_90a", "--std=c++17", f"-I{kernels_dir() / 'include'}",
            f"-I{os.environ.get('CUDA_HOME', '/usr/local/cuda')}/include",
            "-DDNNCTL_HEADERS=0x0", "--fdevice-syntax-only",
            *(f"-D{k}={int(v) if isinstance(v, bool) else v}" for k, v in defs)]


H200_FAILURE = (("DNNCTL_DTYPE", 0), ("EPI_OUT", 1), ("EPI_PAIR", 0), ("GEMM_BK", 64),
                ("GEMM_BM", 32), ("GEMM_BN", 256), ("GEMM_MATH", 2), ("GEMM_STAGES", 3),
                ("GEMM_VEC_A", 4), ("GEMM_VEC_B", 1), ("GEMM_WM", 1), ("GEMM_WN", 4))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_wgrad_gemm_parameter_set_compiles(dtype, monkeypatch):
    nvrtc_compile = nvrtc()
    src = kernels_dir() / "conv2d" / "wgrad_implicit_gemm.cu"
    ok, log = nvrtc_compile(src, _opts(H200_FAILURE), [])
    assert not ok and "column slots must map to threads" in log  # the check has teeth
    rec = BuildRecorder()
    monkeypatch.setitem(base._BACKENDS, "cupy", rec)
    sets = 0
    with _cuda.use_runtime(rec):
        for name in WGRAD_GEMM:
            v = get_variant("conv2d", "cupy", name)
            for _, shape in SHAPES:
                for p in _problems(shape, "wgrad"):
                    if p["dtype"] != dtype or not v.supports(p, H200):
                        continue
                    for params in v.param_space(p, H200):
                        v.build(p, params, H200)
                        sets += 1
    # one build per loader / warp geometry (the defines the gathers' static constraints
    # read); DNNCTL_NVRTC_ALL=1 compiles every distinct set instead (minutes)
    every = os.environ.get("DNNCTL_NVRTC_ALL") == "1"
    geometry_defs = ("DNNCTL_DTYPE", "GEMM_BN", "GEMM_BK", "GEMM_VEC_A", "GEMM_VEC_B",
                     "GEMM_WM", "GEMM_WN")
    geometry = {}
    for b in sorted(rec.builds):
        if b[0] == "conv2d/wgrad_implicit_gemm.cu":
            key = b[1] if every else tuple(kv for kv in b[1] if kv[0] in geometry_defs)
            geometry.setdefault(key, b)
    builds = list(geometry.values())
    assert sets > 500 and len(builds) > 8, (sets, len(builds))
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda b: nvrtc_compile(src, _opts(b[1]), []), builds))
    failures = [f"{dict(b[1])}:\n{log[-1500:]}" for b, (ok, log) in zip(builds, results)
                if not ok]
    assert not failures, f"{len(failures)} of {len(builds)} failed; " + "\n".join(failures[:2])
