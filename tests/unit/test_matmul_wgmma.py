"""The Hopper ``wgmma`` matmul variant without a GPU: tile legality, parameter spaces, exact
workspaces, supports() reasons, default parameters; the kernel (kernels/gemm/wgmma.cu) on the
CPU emulator, which decodes the wgmma matrix descriptors by the PTX canonical layouts and
fails on missing fences / barriers / waits; and NVRTC compiles of representative builds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _emu_helpers import emu_fixture, needs_emu
from _nvrtc_helpers import nvrtc

from dnnctl.backends.base import DeviceInfo
from dnnctl.ops.matmul.gemm_launch import MATH_WGMMA, split_plan, tile_ok
from dnnctl.ops.matmul.wgmma import wg_heuristic, wg_tile
from dnnctl.ops.registry import get_op, get_variant

H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=227 * 1024)
A100 = DeviceInfo(backend="cupy", index=0, name="NVIDIA A100", compute_capability="8.0",
                  sm_count=108, smem_per_block_optin=163 * 1024)
B200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA B200", compute_capability="10.0",
                  sm_count=148, smem_per_block_optin=227 * 1024)
MM = get_op("matmul")
WG = get_variant("matmul", "cupy", "wgmma")
ROOT = Path(__file__).resolve().parents[2]


def mm(**kw):
    return MM.problem(dict({"dtype": "bfloat16"}, **kw))


def _p(bm, bn, warps, stages, splitk=1, reduce="fused", swap=0):
    return {"bm": bm, "bn": bn, "bk": 64, "warps": warps, "stages": stages, "splitk": splitk,
            "reduce": reduce, "swap": swap}


def test_tile_rules():
    big = wg_tile(_p(128, 256, 8, 4))
    assert big is not None and big.math == MATH_WGMMA and big.threads == 256
    assert big.acc_per_thread == 128
    assert big.smem_bytes("bfloat16") == 4 * (128 + 256) * 64 * 2 + 1024
    assert tile_ok(big, "bfloat16", H200)
    assert not tile_ok(wg_tile(_p(128, 256, 8, 5)), "bfloat16", H200)  # 241 KB > 227 KB
    assert wg_tile(_p(128, 256, 4, 3)) is None  # one warpgroup: 256 accumulators
    assert wg_tile(_p(64, 128, 8, 4)) is None   # two warpgroups need bm >= 128
    assert wg_tile(_p(256, 128, 8, 4)).acc_per_thread == 128
    assert wg_tile(dict(_p(64, 64, 4, 3), bk=32)) is None


def test_supports_reasons():
    assert WG.supports(mm(m=64, n=64, k=64), H200)
    assert WG.supports(mm(m=64, n=64, k=64, dtype="float16"), H200)
    assert "sm_90a" in WG.supports(mm(m=64, n=64, k=64), A100).reason
    assert "sm_90a" in WG.supports(mm(m=64, n=64, k=64), B200).reason
    fp32 = MM.problem({"m": 64, "n": 64, "k": 64, "dtype": "float32", "tf32": True})
    assert "float16" in WG.supports(fp32, H200).reason


@pytest.mark.parametrize("shape", [
    dict(m=4096, n=4096, k=4096), dict(m=16, n=11008, k=4096, trans_b=True),
    dict(m=128, n=4096, k=11008, trans_b=True), dict(m=1, n=1, k=1),
    dict(m=77, n=33, k=1000, trans_a=True), dict(batch=12, m=128, n=64, k=128, trans_b=True),
])
def test_space_respects_budgets_and_workspace_is_exact(shape):
    p = mm(**shape)
    space = list(WG.param_space(p, H200))
    assert space
    for params in space:
        cfg = wg_tile(params)
        assert cfg is not None and tile_ok(cfg, "bfloat16", H200)
        _, splits = split_plan(p["k"], 64, params["splitk"])
        assert splits == params["splitk"]
        slabs = p["batch"] * p["m"] * p["n"] * 4
        ws = WG.workspace_bytes(p, params)
        if splits == 1:
            assert ws == 0 and params["reduce"] == "fused"
        else:
            m, n = (p["n"], p["m"]) if params["swap"] else (p["m"], p["n"])
            tiles = -(-m // params["bm"]) * -(-n // params["bn"]) * p["batch"]
            assert ws == splits * slabs + (4 * tiles if params["reduce"] == "fused" else 0)
        if params["swap"]:
            assert p["m"] <= 64
    assert WG.default_params(p, H200) in space


def test_defaults_by_shape():
    square = WG.default_params(mm(m=4096, n=4096, k=4096), H200)
    assert (square["bm"], square["bn"], square["warps"], square["splitk"]) == (128, 256, 8, 1)
    skinny = WG.default_params(mm(m=16, n=4096, k=4096, trans_b=True), H200)
    assert skinny["swap"] == 1 and skinny["bn"] == 16 and skinny["splitk"] > 1
    m64 = WG.default_params(mm(m=64, n=4096, k=4096, trans_b=True), H200)
    assert (m64["bm"], m64["warps"], m64["swap"]) == (64, 4, 0) and m64["splitk"] > 1
    h = wg_heuristic(128, 4096, 4096, 1, H200)
    assert h["bm"] == 128 and h["splitk"] >= 2  # 16 tiles: split until the GPU is covered


# ----------------------------------------------------------------------------- emulator


emu = emu_fixture()


EMU_CASES = [
    # K-major A, N-major B (a row-major product), k-tiles wrap the 3-stage ring, bias
    (dict(m=64, n=64, k=1000, dtype="float16", bias=True), _p(64, 64, 4, 3)),
    # M-major A (trans_a), two warpgroups, gelu, M and N tails
    (dict(m=70, n=136, k=200, dtype="float16", trans_a=True, bias=True, activation="gelu"),
     _p(128, 128, 8, 4)),
    # both K-major (x @ W^T), fused split-K, tails
    (dict(m=33, n=100, k=300, dtype="bfloat16", trans_b=True), _p(64, 128, 4, 3, 2)),
    # both MN-major, batch, separate split-K, odd K (scalar loads of A)
    (dict(batch=2, m=65, n=64, k=257, dtype="float16", trans_a=True, trans_b=True, bias=True),
     _p(64, 64, 4, 4, 2, "separate")),
    # odd everything (single-element loads both sides), relu, 5-deep ring
    (dict(m=5, n=41, k=777, dtype="bfloat16", activation="relu"), _p(64, 64, 4, 5)),
    # two m64 slices per warpgroup (256 x 64), silu
    (dict(m=200, n=48, k=130, dtype="bfloat16", activation="silu"), _p(256, 64, 8, 3)),
    # swapped (C^T = B^T A^T): x @ W^T with 16-wide token tiles, fused split-K, bias + gelu
    (dict(m=11, n=150, k=700, dtype="bfloat16", trans_b=True, bias=True, activation="gelu"),
     _p(128, 16, 4, 4, 4, swap=1)),
    # swapped, both stored MN-major, batch, separate split-K, odd n
    (dict(batch=2, m=20, n=77, k=300, dtype="float16", trans_a=True, bias=True),
     _p(64, 64, 4, 3, 2, "separate", swap=1)),
    # swapped without split-K, two warpgroups
    (dict(m=40, n=130, k=100, dtype="float16", trans_b=True, activation="relu"),
     _p(128, 64, 8, 3, swap=1)),
]


@needs_emu
@pytest.mark.parametrize(("key", "params"), EMU_CASES,
                         ids=[f"case{i}" for i in range(len(EMU_CASES))])
def test_wgmma_kernel_on_cpu_emulator(emu, key, params):
    from dnnctl.ops.check import check_variant

    p = MM.problem(key)
    dev = emu.device(0)
    assert WG.supports(p, dev) and WG.check_params(params) is None
    assert WG.valid_params(p, params, dev) or params["bm"] == 256 or params["swap"]
    res = check_variant(MM, p, WG, params, emu, dev, seed=7)
    assert res.ok, res.detail
    assert res.max_rel_err < MM.tolerance(p, "y") / 2


# ----------------------------------------------------------------------------- NVRTC


def test_representative_builds_compile_with_nvrtc(monkeypatch):
    nvrtc_compile = nvrtc()
    import os

    from dnnctl.backends import registry as base
    from dnnctl.resources import kernels_dir

    builds = set()

    class _Rec:
        xp = None

        def compile_module(self, source, *, defines=None, name_expressions=(), options=(),
                           device=None):
            builds.add((source, tuple(sorted((defines or {}).items()))))

            class _Mod:
                def get_function(self, name):
                    return self

            return _Mod()

    monkeypatch.setitem(base._BACKENDS, "cupy", _Rec())
    for key, params in [
        (dict(m=4096, n=4096, k=4096), None),
        (dict(m=16, n=4096, k=4096, trans_b=True, bias=True, activation="gelu"), None),
        (dict(m=300, n=300, k=300, trans_a=True, dtype="float16"), _p(256, 128, 8, 3)),
        (dict(m=64, n=512, k=4096, trans_a=True, trans_b=True), _p(64, 256, 4, 4, 8, "separate")),
    ]:
        p = mm(**key)
        WG.build(p, params or WG.default_params(p, H200), H200)
    assert {s for s, _ in builds} >= {"gemm/wgmma.cu", "gemm/epilogue.cu"}
    inc = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    for src, defs in sorted(builds):
        opts = ["-arch=sm_90a", "--std=c++17", f"-I{kernels_dir() / 'include'}", f"-I{inc}",
                "-DDNNCTL_HEADERS=0x0", *(f"-D{k}={int(v)}" for k, v in defs)]
        ok, log = nvrtc_compile(kernels_dir() / src, opts, [])
        assert ok, f"{src} {dict(defs)}:\n{log}"
    sys.modules.pop("tools.nvrtc_check", None)
