"""Our Hopper attention forward (``wgmma``) without a GPU: tile and register rules, the
tensor maps it asks the driver for, an NVRTC compile (sm_90a, ptxas) of every parameter set
of several problems with no spills, and small problems run on the CPU emulator
(tools/cuda_emu: TMA boxes, mbarriers, wgmma from shared memory and from registers emulated,
their ordering rules checked) against the float64 reference with poisoned outputs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from _emu_helpers import emu_fixture, needs_emu

from dnnctl.backends import tma
from dnnctl.backends.base import DeviceInfo
from dnnctl.ops.attention.wgmma import (
    map_specs,
    wg_defines,
    wg_heuristic,
    wg_regs_ok,
    wg_smem_bytes,
)
from dnnctl.ops.registry import get_op, get_variant

ROOT = Path(__file__).resolve().parents[2]
OP = get_op("attention")
WG = get_variant("attention", "cupy", "wgmma")
H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=227 * 1024)
A100 = replace(H200, name="NVIDIA A100", compute_capability="8.0")


def _k(**kw):
    return OP.problem(dict({"batch": 1, "heads_q": 2, "dtype": "bfloat16"}, **kw))


def _p(cons, bn, stages=2, pingpong=None, overlap=1):
    pp = int(cons > 1) if pingpong is None else pingpong
    return {"consumers": cons, "bn": bn, "stages": stages, "pingpong": pp, "overlap": overlap}


def test_rules(monkeypatch):
    monkeypatch.setattr(tma, "available", lambda: True)
    big = _k(batch=4, heads_q=32, seq_q=4096, head_dim=128)
    assert WG.supports(big, H200)
    assert not WG.supports(big, A100)                      # wgmma is sm_90a only
    assert not WG.supports(_k(seq_q=1, seq_kv=64, head_dim=64, paged=16), H200)
    assert not WG.supports(_k(seq_q=64, head_dim=100), H200)  # 200-byte rows: not 16-aligned
    assert not WG.supports(OP.problem(dict(big.key, **{"pass": "backward"})), H200)
    # registers: S + O + P per consumer thread within its warpgroup's budget (240 / 160
    # after the producer's hand-over at two / three consumers)
    assert wg_regs_ok(big, _p(2, 128)) and wg_regs_ok(big, _p(3, 64))
    assert not wg_regs_ok(big, _p(3, 128))  # 64 + 64 + 32 > 160 - temporaries
    d256 = _k(seq_q=4096, head_dim=256)
    assert wg_regs_ok(d256, _p(2, 64)) and wg_regs_ok(d256, _p(2, 128, overlap=0))
    assert not wg_regs_ok(d256, _p(2, 128)) and not wg_regs_ok(d256, _p(3, 64))
    assert wg_smem_bytes(big, _p(2, 64)) == 128 * (2 * 128 + 2 * 64 * 4) + 8 * 9 + 1024
    assert wg_heuristic(big) == _p(2, 128) and wg_heuristic(d256) == _p(2, 64, pingpong=0)
    assert wg_heuristic(_k(seq_q=2048, head_dim=64)) == _p(2, 128)
    assert wg_heuristic(_k(seq_q=100, head_dim=64)) == _p(2, 128)
    assert wg_heuristic(_k(seq_q=1, seq_kv=4096, head_dim=128)) == _p(1, 64, overlap=0)
    assert wg_heuristic(_k(seq_q=64, head_dim=256)) == _p(1, 64)
    # with the products overlapped, at most 176 whatever the warpgroup's count
    assert wg_regs_ok(d256, _p(2, 128, overlap=0)) and not wg_regs_ok(d256, _p(2, 128))
    for p in (big, d256, _k(seq_q=197, head_dim=96, layout="BSHD")):
        space = list(WG.param_space(p, H200))
        assert space and WG.default_params(p, H200) in space
        for params in space:
            assert wg_regs_ok(p, params) and wg_smem_bytes(p, params) <= 227 * 1024


def test_maps_by_layout():
    bhsd = _k(batch=3, heads_q=8, heads_kv=2, seq_q=100, seq_kv=300, head_dim=128)
    m = map_specs(bhsd, _p(2, 64))
    assert m["q"].dims == (128, 100, 24) and m["q"].box == (64, 128, 1)
    assert m["k"].dims == (128, 300, 6) and m["k"].box == (64, 64, 1)
    bshd = replace_key(bhsd, layout="BSHD", head_dim_v=64)
    m = map_specs(bshd, _p(1, 128))
    assert m["q"].dims == (128, 8, 300) and m["q"].strides == (256, 8 * 256)
    assert m["v"].dims == (64, 2, 900) and m["v"].box == (64, 1, 128)
    var = replace_key(bshd, varlen=True, head_dim_v=0)
    assert map_specs(var, _p(2, 64))["k"].dims == (128, 2, 300)  # totals, not batch x seq
    for spec in m.values():
        assert tma.check_spec(spec) is None
    assert wg_defines(var, _p(2, 64))["ATT_LAYOUT"] == 1


def replace_key(p, **kw):
    return OP.problem(dict(p.key, **kw))


# ----------------------------------------------------------------------------- NVRTC

NVRTC_PROBLEMS = [
    _k(batch=4, heads_q=32, seq_q=4096, head_dim=128),
    _k(seq_q=4096, head_dim=256, causal="top_left"),
    _k(seq_q=2048, head_dim=64, dtype="float16", softcap=30.0, window=128),
    _k(batch=3, seq_q=900, head_dim=96, layout="BSHD", varlen=True, causal="bottom_right"),
]


@pytest.mark.parametrize("p", NVRTC_PROBLEMS, ids=lambda p: p.short())
def test_every_parameter_set_compiles_without_spills(p):
    from _nvrtc_helpers import nvrtc, sm90a_clean_build

    compile_ = nvrtc()
    for params in WG.param_space(p, H200):
        defs = wg_defines(p, params)
        regs, log = sm90a_clean_build(compile_, WG.source, defs)
        assert "serialized" not in log, f"{defs}: wgmma serialized\n{log}"
        assert regs <= 65536 // (128 * (params["consumers"] + 1))


# ----------------------------------------------------------------------------- emulator


emu = emu_fixture(tensor_maps=True)


EMU_CASES = [
    # GQA 2:1, odd lengths, 3 key tiles through a 2-stage ring (phases wrap), one consumer
    (dict(heads_kv=1, seq_q=37, seq_kv=150, head_dim=32), _p(1, 64)),
    # two consumers taking turns, BSHD, bottom-right causal, softcap, fp16, rows past the
    # sequence
    (dict(batch=2, seq_q=70, seq_kv=90, head_dim=64, dtype="float16", layout="BSHD",
          causal="bottom_right", softcap=3.0), _p(2, 64)),
    # three consumers taking turns over 4 key tiles; two consumers without turns
    (dict(seq_q=150, seq_kv=250, head_dim=64), _p(3, 64, 3)),
    (dict(seq_q=130, seq_kv=100, head_dim=32, causal="top_left"), _p(2, 128, 2, 0)),
    # one product at a time, with and without turns, 3 stages
    (dict(batch=2, seq_q=140, seq_kv=300, head_dim=64, layout="BSHD", causal="bottom_right"),
     _p(2, 128, 3, 1, 0)),
    (dict(seq_q=60, seq_kv=200, head_dim=64, window=50), _p(1, 64, 2, 0, 0)),
    # varlen + GQA + top-left causal, head dim 96 (a half-empty 64-wide chunk), 3 stages
    (dict(batch=3, heads_q=4, heads_kv=2, seq_q=150, seq_kv=170, head_dim=96, layout="BSHD",
          varlen=True, causal="top_left"), _p(1, 64, 3)),
    # more queries than keys (rows without keys), window, Dv != D, 128-key tile
    (dict(heads_q=1, seq_q=80, seq_kv=40, head_dim=32, head_dim_v=128,
          causal="bottom_right", window=7), _p(1, 128)),
    # sliding window without causal over several tiles; skipped tiles at both ends
    (dict(heads_q=1, seq_q=200, head_dim=64, window=20), _p(1, 64)),
    # the default tile at head dim 64 over a partial last key tile, bottom-right causal
    (dict(seq_q=130, seq_kv=400, head_dim=64, causal="bottom_right"), _p(2, 128)),
]


@needs_emu
@pytest.mark.parametrize(("key", "params"), EMU_CASES,
                         ids=[f"case{i}" for i in range(len(EMU_CASES))])
def test_wgmma_attention_on_cpu_emulator(emu, key, params):
    from dnnctl.ops.check import check_variant

    p = _k(**key)
    dev = emu.device(0)
    dev = replace(dev, compute_capability="9.0", smem_per_block_optin=227 * 1024)
    assert WG.supports(p, dev), WG.supports(p, dev).reason
    assert WG.check_params(params) is None and WG.valid_params(p, params, dev)
    res = check_variant(OP, p, WG, params, emu, dev, seed=5)
    assert res.ok, res.detail
    assert res.errors["out"] < OP.tolerance(p, "out") / 4


@needs_emu
@pytest.mark.parametrize("scale", [0.3, -0.3])
def test_explicit_scales_and_the_fallback_for_non_positive_ones(emu, scale):
    """The kernel keeps the maximum of the unscaled scores, so it takes scale > 0; a negative
    scale runs the mma kernel (one launch of attn_fwd, which takes pointers, not tensor maps)
    and is right too."""
    import numpy as np

    from dnnctl.ops import _memory_common as mc
    from dnnctl.ops.check import run_and_verify

    p = _k(seq_q=70, seq_kv=90, head_dim=64, causal="bottom_right")
    dev = replace(emu.device(0), compute_capability="9.0", smem_per_block_optin=227 * 1024)
    kern = WG.build(p, _p(1, 64), dev)
    with mc.traced_launches() as log:
        res = run_and_verify(OP, p, kern, emu, np.random.default_rng(2), {"scale": scale})
    assert res.ok, res.detail
    assert len(log) == 1
    took_maps = isinstance(log[0][3][0], bytes)  # attn_fwd_wgmma's first argument: Q's map
    assert took_maps == (scale > 0)
