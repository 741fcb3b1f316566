"""The TMA Hopper GEMM (``wgmma_tma``) without a GPU: tile rules, parameter spaces, the tensor
maps it asks the driver for (sizes, strides, boxes within the copy engine's limits), the
launch's by-value map argument, supports() reasons, and an NVRTC compile (sm_90a, ptxas) of
every parameter set its spaces yield, with no spills and no stack frame."""

from __future__ import annotations

import ctypes
import itertools
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from _emu_helpers import emu_fixture, needs_emu

from dnnctl.backends import cuda, tma
from dnnctl.backends.base import DeviceInfo
from dnnctl.ops.matmul.wgmma_tma import (
    TMA_SPACE,
    map_specs,
    tma_defines,
    tma_heuristic,
    tma_smem_bytes,
    tma_tile_ok,
)
from dnnctl.ops.registry import get_op, get_variant

H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=227 * 1024)
A100 = DeviceInfo(backend="cupy", index=0, name="NVIDIA A100", compute_capability="8.0",
                  sm_count=108, smem_per_block_optin=163 * 1024)
MM = get_op("matmul")
TMA = get_variant("matmul", "cupy", "wgmma_tma")
ROOT = Path(__file__).resolve().parents[2]
SHAPES = [dict(m=4096, n=4096, k=4096), dict(m=8192, n=16384, k=4096, trans_b=True),
          dict(m=16, n=4096, k=4096, trans_b=True), dict(m=1, n=8, k=8),
          dict(m=200, n=72, k=24, trans_a=True), dict(batch=3, m=256, n=96, k=512)]


def mm(**kw):
    return MM.problem(dict({"dtype": "bfloat16"}, **kw))


def _p(bm, bn, cons, stages):
    return {"bm": bm, "bn": bn, "consumers": cons, "stages": stages}


def test_tile_rules_and_shared_memory():
    big = _p(128, 256, 2, 4)
    assert tma_tile_ok(big, H200)
    assert tma_smem_bytes(big) == 4 * 384 * 128 + 2 * 10240 + 64 + 1024 <= 227 * 1024
    assert not tma_tile_ok(_p(128, 256, 2, 5), H200)   # the ring would not fit
    assert not tma_tile_ok(_p(128, 256, 1, 3), H200)   # 256 accumulators per thread
    assert not tma_tile_ok(_p(64, 128, 2, 4), H200)    # half an m64 slice per consumer
    assert tma_tile_ok(_p(256, 128, 2, 4), H200)       # two m64 slices per consumer
    assert not tma_tile_ok(_p(128, 128, 2, 6), A100) or tma_smem_bytes(
        _p(128, 128, 2, 6)) <= 163 * 1024


@pytest.mark.parametrize("shape", SHAPES)
def test_space_is_legal_and_default_inside(shape):
    p = mm(**shape)
    space = list(TMA.param_space(p, H200))
    assert space
    for params in space:
        assert TMA.check_params(params) is None and tma_tile_ok(params, H200)
        for spec in map_specs(p, params):
            assert tma.check_spec(spec) is None, spec
    assert TMA.default_params(p, H200) in space


def test_heuristic_by_shape():
    assert tma_heuristic(4096, 4096, 4096, 1, H200) == _p(128, 256, 2, 4)
    assert tma_heuristic(1024, 1024, 4096, 1, H200) == _p(128, 128, 2, 6)  # 32 big tiles
    assert tma_heuristic(16, 4096, 4096, 1, H200)["consumers"] == 1


@pytest.mark.parametrize(("ta", "tb"), list(itertools.product([False, True], repeat=2)))
def test_tensor_maps_follow_the_stored_layouts(ta, tb):
    p = mm(batch=2, m=200, n=96, k=136, trans_a=ta, trans_b=tb)
    sa, sb = map_specs(p, _p(128, 64, 2, 4))
    if ta:  # a stored (k, m): M innermost, 64 x 64 boxes (MN-major swizzle blocks)
        assert sa.dims == (200, 136, 2) and sa.box == (64, 64, 1)
        assert sa.strides == (200 * 2, 200 * 136 * 2)
    else:   # a stored (m, k): one 64-k x bm box
        assert sa.dims == (136, 200, 2) and sa.box == (64, 128, 1)
        assert sa.strides == (136 * 2, 200 * 136 * 2)
    if tb:  # b stored (n, k)
        assert sb.dims == (136, 96, 2) and sb.box == (64, 64, 1)
    else:   # b stored (k, n)
        assert sb.dims == (96, 136, 2) and sb.box == (64, 64, 1)
    d = tma_defines(p, _p(128, 64, 2, 4))
    assert (d["GEMM_A_KMAJOR"], d["GEMM_B_KMAJOR"]) == (int(not ta), int(tb))


def test_check_spec_refuses_what_the_driver_refuses():
    ok = tma.MapSpec("bfloat16", (64, 64, 1), (128, 8192), (64, 64, 1))
    assert tma.check_spec(ok) is None
    assert "multiples of 16" in tma.check_spec(
        tma.MapSpec("bfloat16", (60, 64, 1), (120, 7680), (64, 64, 1)))
    assert "outside 1..256" in tma.check_spec(
        tma.MapSpec("bfloat16", (64, 512, 1), (128, 65536), (64, 512, 1)))
    assert "swizzle span" in tma.check_spec(
        tma.MapSpec("bfloat16", (128, 64, 1), (256, 16384), (128, 64, 1)))
    with pytest.raises(Exception, match="tensor map refused"):
        tma.MapCache(tma.MapSpec("float16", (64, 8, 1), (100, 800), (64, 8, 1)))


def test_supports_reasons():
    assert "sm_90a" in TMA.supports(mm(m=64, n=64, k=64), A100).reason
    odd = TMA.supports(mm(m=64, n=60, k=64), H200)
    assert not odd and "multiples of 8" in odd.reason
    odd_a = TMA.supports(mm(m=20, n=64, k=64, trans_a=True), H200)
    assert not odd_a and "multiples of 8" in odd_a.reason
    got = TMA.supports(mm(m=1, n=64, k=64), H200)  # m = 1 with K-major a is fine
    if tma.available():
        assert got
    else:  # no CUDA driver on this machine: refused by name, never an exception
        assert not got and "cuTensorMapEncodeTiled" in got.reason


def test_launch_passes_a_map_by_value_in_an_aligned_slot():
    run = cuda.Launch(lambda *a, **k: None, (1,), (128,), 0)
    blob = bytes(range(128))
    args = (blob, bytes(128), 0x1234, None, np.int32(7), np.int64(-3))
    fmt = run._layout(args)
    base = ctypes.addressof(run.buf) + run.shift
    assert base % 64 == 0
    slots = [run.params[i] - base for i in range(len(args))]
    assert slots == [0, 128, 256, 264, 272, 280]
    fmt.pack_into(run.buf, run.shift, *(cuda.ptr(a) for a in args))
    raw = ctypes.string_at(base, 288)
    assert raw[:128] == blob and raw[128:256] == bytes(128)
    assert struct.unpack_from("<Q", raw, 256)[0] == 0x1234
    assert struct.unpack_from("<i", raw, 272)[0] == 7
    assert struct.unpack_from("<q", raw, 280)[0] == -3


def _all_spaces() -> list[tuple[dict, dict]]:
    """(key, params) covering every parameter set of every SHAPES space once, the keys
    rotating through dtypes, operand layouts and epilogues."""
    keys = [dict(dtype=dt, trans_a=ta, trans_b=tb, bias=b, activation=act)
            for (dt, ta, tb, b, act) in [
                ("bfloat16", False, True, True, "gelu"), ("float16", True, False, False, "none"),
                ("bfloat16", False, False, True, "relu"), ("float16", True, True, True, "silu")]]
    seen, out = set(), []
    for shape in SHAPES:
        for params in TMA.param_space(mm(**shape), H200):
            sig = tuple(sorted(params.items()))
            if sig not in seen:
                seen.add(sig)
                out.append((keys[len(out) % len(keys)], params))
    return out


def test_every_parameter_set_compiles_with_nvrtc():
    from _emu_helpers import CUDA_INC
    from _nvrtc_helpers import nvrtc, sm90a_clean_build

    compile_ = nvrtc()
    if not (CUDA_INC / "cuda_fp16.h").exists():
        pytest.skip("CUDA headers missing")
    builds = _all_spaces()
    assert len(builds) >= 30
    for key, params in builds:
        defs = tma_defines(mm(m=256, n=256, k=256, **key), params)
        regs, log = sm90a_clean_build(compile_, "gemm/wgmma_tma.cu", defs)
        assert "C7508" not in log, f"{defs}: setmaxnreg ignored\n{log}"
        assert regs <= 168 or params["consumers"] == 1, (defs, regs)
    sys.modules.pop("tools.nvrtc_check", None)


def test_space_declares_its_values():
    assert TMA.params == TMA_SPACE and TMA.source == "gemm/wgmma_tma.cu"


# ----------------------------------------------------------------------------- emulator


emu = emu_fixture(tensor_maps=True)


EMU_CASES = [
    # K-major a and b (x @ W^T), one consumer, 5 k-tiles around a 3-stage ring, bias + gelu
    (dict(m=64, n=64, k=296, dtype="bfloat16", trans_b=True, bias=True, activation="gelu"),
     _p(64, 64, 1, 3), 132),
    # k < 64, M and N tails, MN-major a, two consumers (setmaxnreg path)
    (dict(m=136, n=72, k=24, dtype="float16", trans_a=True, bias=True), _p(128, 64, 2, 3),
     132),
    # persistent grid: 3 x 2 x 2 tiles on 2 blocks, ring phases carried across tiles,
    # both MN-major, batch, relu
    (dict(batch=2, m=136, n=128, k=136, dtype="float16", trans_a=True, activation="relu"),
     _p(64, 64, 1, 3), 2),
    # m = 1, MN-major b (row-major product), 128-wide tile, bias
    (dict(m=1, n=120, k=128, dtype="bfloat16", bias=True), _p(64, 128, 1, 4), 132),
    # four m64 slices in one consumer (256 x 64), silu, 2 blocks for 2 tiles along N
    (dict(m=200, n=128, k=72, dtype="bfloat16", trans_b=True, activation="silu"),
     _p(256, 64, 1, 3), 1),
    # two consumers with two m64 slices each (256 x 64), tails
    (dict(m=260, n=40, k=64, dtype="float16", bias=True), _p(256, 64, 2, 3), 132),
]


@needs_emu
@pytest.mark.parametrize(("key", "params", "sms"), EMU_CASES,
                         ids=[f"case{i}" for i in range(len(EMU_CASES))])
def test_wgmma_tma_kernel_on_cpu_emulator(emu, key, params, sms):
    from dataclasses import replace

    from dnnctl.ops.check import check_variant

    p = MM.problem(key)
    dev = replace(emu.device(0), sm_count=sms)
    assert TMA.supports(p, dev), TMA.supports(p, dev).reason
    assert TMA.check_params(params) is None and tma_tile_ok(params, dev)
    res = check_variant(MM, p, TMA, params, emu, dev, seed=11)
    assert res.ok, res.detail
    assert res.max_rel_err < MM.tolerance(p, "y") / 2
