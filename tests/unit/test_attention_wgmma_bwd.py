"""Our Hopper attention backward (``wgmma_bwd``) without a GPU: its tile and register rules,
an NVRTC compile (sm_90a, ptxas) of every parameter set of several problems with no spills
and no serialized wgmma in any of its three kernels, and small problems run on the CPU
emulator (TMA boxes, mbarriers, wgmma from shared memory and registers, its ordering rules
checked) against the float64 reference with poisoned outputs."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from _emu_helpers import emu_fixture, needs_emu

from dnnctl.backends import tma
from dnnctl.backends.base import DeviceInfo
from dnnctl.ops import registry
from dnnctl.ops.attention.bwd_wgmma import (
    BN,
    bwd_wg_regs_ok,
    bwd_wg_smem,
    stats_map,
    stats_shape,
)
from dnnctl.ops.registry import get_op, get_variant

OP = get_op("attention")
WB = get_variant("attention", "cupy", "wgmma_bwd")
H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=227 * 1024)
A100 = replace(H200, name="NVIDIA A100", compute_capability="8.0")


def _k(**kw):
    return OP.problem(dict({"batch": 1, "heads_q": 2, "dtype": "bfloat16", "pass": "backward"},
                           **kw))


def test_rules(monkeypatch):
    monkeypatch.setattr(tma, "available", lambda: True)
    big = _k(batch=4, heads_q=32, seq_q=4096, head_dim=128)
    assert WB.supports(big, H200)
    assert not WB.supports(big, A100)  # wgmma is sm_90a only
    assert not WB.supports(OP.problem(dict(big.key, **{"pass": "forward"})), H200)
    assert not WB.supports(_k(seq_q=64, head_dim=256), H200)  # dK / dV past the registers
    assert not WB.supports(_k(seq_q=64, head_dim=64, head_dim_v=128), H200)
    assert not WB.deterministic  # dQ by reductions: use_deterministic passes it over
    # dK + dV + S^T + dP^T: 64 + 64 + 32 + 32 at head dim 128 (query tile 64), 32 + 32 + 64
    # + 64 at 64 (query tile 128); each consumer's dQ share is one wgmma N
    assert bwd_wg_regs_ok(big, 64) and not bwd_wg_regs_ok(big, 128)
    d64 = _k(seq_q=2048, head_dim=64, dtype="float16")
    assert bwd_wg_regs_ok(d64, 128) and not bwd_wg_regs_ok(d64, 64)  # 64: dQ N would be 32
    assert WB.default_params(big, H200) == {"bm": 64, "stages": 2}
    assert WB.default_params(d64, H200) == {"bm": 128, "stages": 2}
    assert bwd_wg_smem(big, {"bm": 64, "stages": 2}) == (
        128 * (BN * 4 + 2 * 64 * 4) + 2 * 64 * BN * 2 + 2 * 2 * 64 * 4 + 64 * 128 * 4 + 8 * 7
        + 1024)
    for p in (big, d64, _k(seq_q=197, head_dim=96, layout="BSHD")):
        space = list(WB.param_space(p, H200))
        assert space and WB.default_params(p, H200) in space
        for params in space:
            assert bwd_wg_smem(p, params) <= 227 * 1024
    # the stats workspace: rows padded to 16 bytes for the copy engine
    odd = _k(batch=3, seq_q=197, head_dim=64)
    assert stats_shape(odd) == (6, 2, 200)
    m = stats_map(odd, 128)
    assert m.dims == (197, 2, 6) and m.strides == (800, 1600) and m.box == (128, 2, 1)
    assert tma.check_spec(m) is None
    var = _k(batch=3, seq_q=300, head_dim=64, layout="BSHD", varlen=True)
    assert stats_shape(var) == (2, 2, 300 + 4 * 3)
    assert stats_map(var, 64).dims == (312, 2, 2)


def test_deterministic_mode_passes_it_over(monkeypatch):
    monkeypatch.setattr(tma, "available", lambda: True)
    p = _k(seq_q=256, head_dim=128)
    assert "wgmma_bwd" in [v.name for v in registry.variants("attention", "cupy")]
    with registry.use_deterministic():
        names = [v.name for v in registry.variants("attention", "cupy")]
    assert "wgmma_bwd" not in names and "mma_bwd" in names
    assert p["pass"] == "backward"


# ----------------------------------------------------------------------------- NVRTC

NVRTC_PROBLEMS = [
    _k(batch=4, heads_q=32, seq_q=4096, head_dim=128),
    _k(seq_q=2048, head_dim=64, dtype="float16", softcap=30.0, window=128),
    _k(batch=3, seq_q=900, head_dim=96, layout="BSHD", varlen=True, causal="bottom_right"),
    _k(seq_q=1000, head_dim=128, head_dim_v=64, causal="top_left"),
]


@pytest.mark.parametrize("p", NVRTC_PROBLEMS, ids=lambda p: p.short())
def test_every_parameter_set_compiles_without_spills(p, monkeypatch):
    from _nvrtc_helpers import nvrtc, sm90a_clean_build

    monkeypatch.setattr(tma, "available", lambda: True)
    compile_ = nvrtc()
    space = list(WB.param_space(p, H200))
    assert space
    for params in space:
        defs = {"DNNCTL_DTYPE": 2 if p["dtype"] == "bfloat16" else 1, "ATT_D": p["head_dim"],
                "ATT_DV": p["head_dim_v"], "ATT_BM": params["bm"],
                "ATT_STAGES": params["stages"],
                "ATT_MASK": ("none", "top_left", "bottom_right").index(p["causal"]),
                "ATT_SOFTCAP": int(p["softcap"] > 0), "ATT_VARLEN": int(p["varlen"]),
                "ATT_LAYOUT": int(p["layout"] != "BHSD")}
        _, log = sm90a_clean_build(compile_, WB.source, defs)
        assert "serialized" not in log, f"{defs}: wgmma serialized\n{log}"
        # every kernel of the module: no stack frame, no spills
        frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores", log)
        assert len(frames) == 3 and all(f == ("0", "0") for f in frames), f"{defs}\n{log}"


# ----------------------------------------------------------------------------- emulator


emu = emu_fixture(tensor_maps=True)


EMU_CASES = [
    # one key tile, one query tile at head dim 128 (query tile 64), GQA 2:1
    dict(heads_kv=1, seq_q=64, seq_kv=128, head_dim=128),
    # odd lengths: a partial key tile and query tiles past the sequence, 2 stages wrapping
    # (3 query tiles), head dim 64 (query tile 128), fp16
    dict(seq_q=300, seq_kv=150, head_dim=64, dtype="float16"),
    # BSHD, bottom-right causal (a key tile sees no query: zeros), softcap
    dict(batch=2, seq_q=70, seq_kv=200, head_dim=64, layout="BSHD", causal="bottom_right",
         softcap=3.0),
    # varlen + GQA + top-left causal, head dim 96 (a half-empty 64-wide chunk)
    dict(batch=3, heads_q=4, heads_kv=2, seq_q=150, seq_kv=170, head_dim=96, layout="BSHD",
         varlen=True, causal="top_left"),
    # varlen over three sequences at head dim 64: sequences 1 and 2 start at odd positions,
    # their lse / D copies at 16-byte aligned ones (the copy engine refuses others)
    dict(batch=3, heads_q=4, seq_q=400, seq_kv=400, head_dim=64, layout="BSHD", varlen=True,
         causal="bottom_right"),
    # sliding window over several tiles; Dv != D
    dict(heads_q=1, seq_q=200, seq_kv=260, head_dim=128, head_dim_v=64, window=20),
]


@needs_emu
@pytest.mark.parametrize("key", EMU_CASES, ids=[f"case{i}" for i in range(len(EMU_CASES))])
def test_wgmma_backward_on_cpu_emulator(emu, key):
    from dnnctl.ops.check import check_variant

    p = _k(**key)
    dev = replace(emu.device(0), compute_capability="9.0", smem_per_block_optin=227 * 1024)
    assert WB.supports(p, dev), WB.supports(p, dev).reason
    for params in WB.param_space(p, dev):
        res = check_variant(OP, p, WB, params, emu, dev, seed=7)
        assert res.ok, f"{params}: {res.detail}"
        for g in ("dq", "dk", "dv"):
            assert res.errors[g] < OP.tolerance(p, g) / 2, (params, res.errors)
