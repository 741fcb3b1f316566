"""Our Hopper decode kernel (``decode_ring``) without a GPU: its rules (sm_90 only, packed rows,
registers, shared memory, the splits that fill whole waves), an NVRTC compile (sm_90a, ptxas)
of every parameter set of several problems with no spills, and small problems on the CPU
emulator (cp.async copies completing mbarrier phases, pending shared bytes checked) against the float64 reference
with poisoned outputs: one split, several splits merged by the last block, paged caches."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
from _emu_helpers import emu_fixture, needs_emu

from dnnctl.backends.base import DeviceInfo
from dnnctl.ops.attention.decode_ring import dec_grid, dec_smem, packed_rows
from dnnctl.ops.registry import get_op, get_variant

OP = get_op("attention")
DB = get_variant("attention", "cupy", "decode_ring")
H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=227 * 1024)
A100 = replace(H200, name="NVIDIA A100", compute_capability="8.0")


def _k(**kw):
    return OP.problem(dict({"batch": 1, "heads_q": 2, "seq_q": 1, "dtype": "bfloat16"}, **kw))


def test_rules():
    llama = _k(batch=8, heads_q=32, heads_kv=8, seq_kv=4096, head_dim=128)
    assert DB.supports(llama, H200)
    assert not DB.supports(llama, A100)  # built and measured for sm_90
    assert not DB.supports(_k(heads_q=32, heads_kv=1, seq_q=4, seq_kv=512, head_dim=64),
                           H200)  # 128 packed rows: a prefill
    assert not DB.supports(_k(seq_kv=512, head_dim=64, varlen=True, layout="BSHD"), H200)
    assert not DB.supports(OP.problem(dict(llama.key, **{"pass": "backward"})), H200)
    assert packed_rows(llama) == 4
    params = DB.default_params(llama, H200)
    assert params == {"bm": 16, "bn": 32, "warps": 4, "depth": 2}  # 8 x 17.4 KB of ring
    assert dec_smem(llama, params) == 2 * 16 * 136 + 8 * 32 * 272 * 2 + 16 * 8
    # 64 (batch, kv head) blocks, one block per SM: 2 splits fill 128 of 132 SMs
    assert dec_grid(llama, params, 132) == (2, 1, 64)
    # head dim 256: the ring of four warps does not fit, two warps of three stages
    assert DB.default_params(_k(heads_q=8, heads_kv=1, seq_kv=4096, head_dim=256), H200) == {
        "bm": 16, "bn": 32, "warps": 2, "depth": 3}
    # 256 blocks already fill 97 % of their second wave: no split
    big = _k(batch=32, heads_q=32, heads_kv=8, seq_kv=8192, head_dim=128)
    assert dec_grid(big, params, 132)[0] == 1
    # short caches keep >= 2 tiles per consumer warp: 16 tiles, 4 warps, 2 splits
    short = _k(batch=1, heads_q=8, heads_kv=8, seq_kv=512, head_dim=128)
    assert dec_grid(short, params, 132)[0] == 2
    for p in (llama, short, _k(heads_q=8, heads_kv=1, seq_q=3, seq_kv=2000, head_dim=256,
                               paged=16)):
        space = list(DB.param_space(p, H200))
        assert space and DB.default_params(p, H200) in space
        for prm in space:
            assert dec_smem(p, prm) <= 227 * 1024


NVRTC_PROBLEMS = [
    _k(batch=8, heads_q=32, heads_kv=8, seq_kv=4096, head_dim=128),
    _k(heads_q=16, heads_kv=2, seq_q=3, seq_kv=1000, head_dim=64, dtype="float16",
       paged=16, causal="bottom_right", softcap=30.0),
    _k(heads_q=8, heads_kv=1, seq_kv=2048, head_dim=256, window=128),
    _k(heads_q=4, heads_kv=4, seq_q=5, seq_kv=999, head_dim=96, head_dim_v=64,
       layout="BSHD", causal="top_left"),
]


@pytest.mark.parametrize("p", NVRTC_PROBLEMS, ids=lambda p: p.short())
def test_every_parameter_set_compiles_without_spills(p):
    from _nvrtc_helpers import nvrtc, sm90a_clean_build

    compile_ = nvrtc()
    space = list(DB.param_space(p, H200))
    assert space
    for params in space:
        defs = {"DNNCTL_DTYPE": 2 if p["dtype"] == "bfloat16" else 1, "ATT_D": p["head_dim"],
                "ATT_DV": p["head_dim_v"], "ATT_BM": params["bm"], "ATT_BN": params["bn"],
                "ATT_MASK": ("none", "top_left", "bottom_right").index(p["causal"]),
                "ATT_SOFTCAP": int(p["softcap"] > 0), "ATT_PAGED": p["paged"],
                "DEC_WARPS": params["warps"], "DEC_DEPTH": params["depth"]}
        _, log = sm90a_clean_build(compile_, DB.source, defs)
        frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores", log)
        assert frames and all(f == ("0", "0") for f in frames), f"{defs}\n{log}"


# ----------------------------------------------------------------------------- emulator


emu = emu_fixture(tensor_maps=True)

EMU_CASES = [
    # GQA 4:1 decode, several splits merged by the last block, a partial last tile
    (dict(batch=2, heads_q=4, heads_kv=1, seq_kv=300, head_dim=64),
     {"bm": 16, "bn": 32, "warps": 2, "depth": 2}, 60),
    # one split (no merge), 4 consumer warps, head dim 128, fp16
    (dict(heads_q=2, heads_kv=2, seq_kv=200, head_dim=128, dtype="float16"),
     {"bm": 16, "bn": 32, "warps": 4, "depth": 2}, 132),
    # paged cache (16-token pages), 3 queries x group 4 = 12 rows, bottom-right causal,
    # softcap, splits
    (dict(batch=2, heads_q=8, heads_kv=2, seq_q=3, seq_kv=170, head_dim=64, paged=16,
          causal="bottom_right", softcap=5.0),
     {"bm": 16, "bn": 32, "warps": 1, "depth": 3}, 40),
    # 24 rows in a 32-row block, BSHD, window (tiles skipped), Dv != D
    (dict(heads_q=8, heads_kv=1, seq_q=3, seq_kv=600, head_dim=64, head_dim_v=32,
          layout="BSHD", window=40), {"bm": 32, "bn": 64, "warps": 2, "depth": 2}, 30),
    # top-left causal with more keys than queries: later splits see no key (lse -inf there)
    # (head dim 96: 12 chunks a row, the producer's generic copy)
    (dict(heads_q=2, heads_kv=1, seq_q=2, seq_kv=400, head_dim=96, causal="top_left"),
     {"bm": 16, "bn": 32, "warps": 2, "depth": 2}, 60),
]


@needs_emu
@pytest.mark.parametrize(("key", "params", "sms"), EMU_CASES,
                         ids=[f"case{i}" for i in range(len(EMU_CASES))])
def test_decode_ring_on_cpu_emulator(emu, key, params, sms):
    from dnnctl.ops.check import check_variant

    p = _k(**key)
    dev = replace(emu.device(0), compute_capability="9.0", smem_per_block_optin=227 * 1024,
                  sm_count=sms)
    assert DB.supports(p, dev), DB.supports(p, dev).reason
    assert DB.valid_params(p, params, dev)
    res = check_variant(OP, p, DB, params, emu, dev, seed=11)
    assert res.ok, res.detail
    for g in ("out", "lse"):
        assert res.errors[g] < OP.tolerance(p, g) / 2, res.errors
    # a second call on fresh inputs: the counters the last block reset
    res = check_variant(OP, p, DB, params, emu, dev, seed=12)
    assert res.ok, res.detail


def test_splits_of_the_emulator_cases():
    """The cases above cover one split and several (their sm counts are chosen so)."""
    got = [dec_grid(_k(**key), params, sms)[0] for key, params, sms in EMU_CASES]
    assert got[1] == 1 and all(s > 1 for i, s in enumerate(got) if i != 1), got
    assert np.prod(got) > 1


@needs_emu
def test_misaligned_operands_get_a_clear_error(emu):
    """16-byte copies need 16-byte aligned q / k / v: a view at an odd element offset is
    refused by name, before any launch (on the GPU it would be a misaligned-address fault)."""
    from dnnctl.errors import ShapeError
    from dnnctl.ops.check import prepare

    p = _k(heads_q=2, heads_kv=1, seq_kv=64, head_dim=32)
    dev = replace(emu.device(0), compute_capability="9.0", smem_per_block_optin=227 * 1024)
    kern = DB.build(p, DB.default_params(p, dev), dev)
    prep = prepare(OP, p, emu, np.random.default_rng(0), with_reference=False)
    q = prep.inputs["q"]
    buf = np.zeros(q.size + 1, q.dtype)
    shifted = buf[1:].reshape(q.shape)  # 2 bytes past an aligned start
    shifted[...] = q
    with pytest.raises(ShapeError, match="q does not start at a 16-byte aligned"):
        kern(dict(prep.inputs, q=shifted), prep.outputs, prep.attrs)
    # the mma kernels (wgmma's fallback for such operands) refuse them the same way
    mma = get_variant("attention", "cupy", "mma")
    mk = mma.build(p, mma.default_params(p, dev), dev)
    with pytest.raises(ShapeError, match="q does not start at a 16-byte aligned"):
        mk(dict(prep.inputs, q=shifted), prep.outputs, prep.attrs)
