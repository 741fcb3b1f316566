"""Our CUDA attention kernels without a GPU: every build family compiled by NVRTC (sm_80 and
sm_90a), and small shapes run on the CPU emulator (tools/cuda_emu: every thread a fiber,
ldmatrix / mma.sync / cp.async emulated, bounds, shared-memory races and pending copies
checked) against the float64 reference with poisoned outputs, through each variant's own
build() and launch code."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _emu_helpers import CUDA_INC, emu_fixture, needs_emu

from dnnctl.backends.base import DeviceInfo
from dnnctl.ops.registry import get_op, get_variant, variants

ROOT = Path(__file__).resolve().parents[2]
OP = get_op("attention")
H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=227 * 1024)


emu = emu_fixture()


def _k(**kw):
    return dict({"batch": 1, "heads_q": 2, "dtype": "float16"}, **kw)


EMU_CASES = [
    # plain, GQA 2:1, odd lengths (tails of both tiles)
    ("mma", _k(heads_kv=1, seq_q=37, seq_kv=45, head_dim=32),
     {"bm": 64, "bn": 32, "wm": 32}),
    # bottom-right causal, BSHD, softcap, bf16
    ("mma", _k(batch=2, seq_q=20, seq_kv=50, head_dim=64, dtype="bfloat16",
               causal="bottom_right", layout="BSHD", softcap=3.0),
     {"bm": 64, "bn": 32, "wm": 32}),
    # varlen with GQA and causal
    ("mma", _k(batch=3, heads_kv=1, seq_q=60, seq_kv=70, head_dim=32, dtype="bfloat16",
               varlen=True, layout="BSHD", causal="bottom_right"),
     {"bm": 64, "bn": 32, "wm": 16}),
    # more queries than keys: rows without keys (out 0, lse -inf), window, Dv != D
    ("mma", _k(heads_q=1, seq_q=40, seq_kv=20, head_dim=32, head_dim_v=64,
               causal="bottom_right", window=5), {"bm": 64, "bn": 32, "wm": 32}),
    # seq 1, head dim 96
    ("mma", _k(seq_q=1, seq_kv=1, head_dim=96), {"bm": 64, "bn": 32, "wm": 16}),
    # top-left causal sliding window over several key tiles (skipped tiles at both ends)
    ("mma", _k(heads_q=1, seq_q=70, head_dim=32, causal="top_left", window=9),
     {"bm": 64, "bn": 32, "wm": 32}),
    # causal without window over 5 key tiles: interior tiles take the unmasked path
    ("mma", _k(heads_q=1, seq_q=150, head_dim=32, causal="top_left"),
     {"bm": 128, "bn": 32, "wm": 32}),
    # decode: GQA packing and split-KV with the combine kernel
    ("decode", _k(batch=2, heads_q=4, heads_kv=2, seq_q=1, seq_kv=150, head_dim=32),
     {"bm": 16, "bn": 32, "splits": 2}),
    # decode over a paged cache of 16-token pages, 2 queries, causal, one split
    ("decode", _k(batch=3, heads_q=8, heads_kv=2, seq_q=2, seq_kv=100, head_dim=32,
                  dtype="bfloat16", paged=16, causal="bottom_right"),
     {"bm": 16, "bn": 32, "splits": 1}),
    # decode: 3 queries x 4 heads of a group in 12 rows, pages of 32, window, 2 splits
    ("decode", _k(batch=2, heads_q=4, heads_kv=1, seq_q=3, seq_kv=130, head_dim=32,
                  paged=32, window=20), {"bm": 16, "bn": 32, "splits": 2}),
]


@needs_emu
@pytest.mark.parametrize(("name", "key", "params"), EMU_CASES,
                         ids=[f"{c[0]}{i}" for i, c in enumerate(EMU_CASES)])
def test_kernels_on_cpu_emulator(emu, name, key, params):
    from dnnctl.ops.check import check_variant

    variant = get_variant("attention", "cupy", name)
    p = OP.problem(key)
    dev = emu.device(0)
    assert variant.supports(p, dev) and variant.check_params(params) is None
    res = check_variant(OP, p, variant, params, emu, dev, seed=3)
    assert res.ok, res.detail
    assert res.errors["out"] < OP.tolerance(p, "out") / 4


BWD_CASES = [
    # GQA 2:1, odd lengths, more keys than queries
    (_k(heads_kv=1, seq_q=37, seq_kv=45, head_dim=32), {"bm": 32, "bn": 32}),
    # top-left causal, BSHD, bf16, several query and key tiles
    (_k(seq_q=70, head_dim=64, dtype="bfloat16", causal="top_left", layout="BSHD"),
     {"bm": 32, "bn": 32}),
    # varlen, GQA, bottom-right causal
    (_k(batch=3, heads_q=4, heads_kv=2, seq_q=50, seq_kv=70, head_dim=32, varlen=True,
        layout="BSHD", causal="bottom_right"), {"bm": 32, "bn": 32}),
    # softcap + window, Dv != D, queries without keys
    (_k(heads_q=1, seq_q=40, seq_kv=20, head_dim=32, head_dim_v=64, causal="bottom_right",
        window=6, softcap=2.0), {"bm": 32, "bn": 32}),
]


@needs_emu
@pytest.mark.parametrize(("key", "params"), BWD_CASES,
                         ids=[f"bwd{i}" for i in range(len(BWD_CASES))])
def test_backward_kernel_on_cpu_emulator(emu, key, params):
    from dnnctl.ops.check import check_variant

    variant = get_variant("attention", "cupy", "mma_bwd")
    p = OP.problem(dict(key, **{"pass": "backward"}))
    dev = emu.device(0)
    assert variant.supports(p, dev) and variant.check_params(params) is None
    res = check_variant(OP, p, variant, params, emu, dev, seed=4)
    assert res.ok, res.detail
    for name in ("dq", "dk", "dv"):
        assert 0 < res.errors[name] < OP.tolerance(p, name) / 2


# ----------------------------------------------------------------------------- NVRTC

BUILD_KEYS = [
    _k(batch=4, heads_q=32, seq_q=4096, head_dim=128, dtype="bfloat16"),
    _k(batch=4, heads_q=32, seq_q=4096, head_dim=128, dtype="bfloat16", causal="top_left"),
    _k(batch=4, heads_q=32, seq_q=2048, head_dim=64),
    _k(batch=4, heads_q=16, seq_q=4096, head_dim=256, dtype="bfloat16"),
    _k(batch=2, heads_q=12, seq_q=197, head_dim=96, layout="BSHD"),
    _k(batch=4, heads_q=8, heads_kv=2, seq_q=700, seq_kv=900, head_dim=128, varlen=True,
       layout="BSHD", causal="bottom_right", window=128, softcap=30.0),
    _k(batch=8, heads_q=32, heads_kv=8, seq_q=1, seq_kv=4096, head_dim=128, dtype="bfloat16"),
    _k(batch=8, heads_q=32, heads_kv=8, seq_q=4, seq_kv=4096, head_dim=128, paged=64,
       causal="bottom_right"),
    _k(batch=1, heads_q=8, seq_q=512, head_dim=128, **{"pass": "backward"}),
    _k(batch=1, heads_q=8, heads_kv=2, seq_q=512, head_dim=64, causal="top_left",
       layout="BSHD", **{"pass": "backward"}),
]


SM90_ONLY = {"attention/decode_ring.cu"}  # fence.mbarrier_init (sm_90)


def test_every_build_family_compiles_with_nvrtc(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    try:
        from tools.nvrtc_check import _libnvrtc, nvrtc_compile

        _libnvrtc()
    except (ImportError, SystemExit):
        pytest.skip("libnvrtc (pip install nvidia-cuda-nvrtc) or tools/nvrtc_check.py missing")
    from dnnctl.backends import registry as base
    from dnnctl.resources import kernels_dir

    builds = set()

    class _Rec:
        xp = None

        def compile_module(self, source, *, defines=None, name_expressions=(), options=(),
                           device=None):
            builds.add((source, tuple(sorted((defines or {}).items()))))

            class _Fn:
                max_dynamic_shared_size_bytes = 0

            class _Mod:
                def get_function(self, name):
                    return _Fn()

            return _Mod()

    monkeypatch.setitem(base._BACKENDS, "cupy", _Rec())
    for key in BUILD_KEYS:
        p = OP.problem(key)
        for v in variants("attention", "cupy"):
            if v.vendor or not v.supports(p, H200):
                continue
            v.build(p, v.default_params(p, H200), H200)
    assert len(builds) >= len(BUILD_KEYS)
    inc = CUDA_INC
    for src, defs in sorted(builds):
        for arch in ("sm_90a",) if src in SM90_ONLY else ("sm_80", "sm_90a"):
            opts = [f"-arch={arch}", "--std=c++17", f"-I{kernels_dir() / 'include'}",
                    f"-I{inc}", "-DDNNCTL_HEADERS=0x0", *(f"-D{k}={int(v)}" for k, v in defs)]
            ok, log = nvrtc_compile(kernels_dir() / src, opts, [])
            assert ok, f"{src} {arch} {dict(defs)}:\n{log}"
    sys.modules.pop("tools.nvrtc_check", None)


@needs_emu
@pytest.mark.parametrize(("name", "key", "params", "launches"), [
    ("mma", EMU_CASES[0][1], EMU_CASES[0][2], 1),
    ("decode", EMU_CASES[7][1], EMU_CASES[7][2], 2),  # split-KV: attn_fwd + attn_combine
    ("mma_bwd", dict(BWD_CASES[0][0], **{"pass": "backward"}), BWD_CASES[0][1], 3),
])
def test_kernels_launch_through_the_cuda_seam(emu, name, key, params, launches):
    """The attention kernels are flat_io (the dispatcher hands them the caller's arrays: torch
    CUDA tensors as they are), so they must launch through backends.cuda.Launch, which takes
    a torch tensor by data_ptr() on the call's stream; a direct CuPy RawKernel call raised
    "Unsupported type <class 'torch.Tensor'>" on the H200."""
    import numpy as np

    from dnnctl.ops import _memory_common as mc
    from dnnctl.ops.check import prepare

    p = OP.problem(key)
    dev = emu.device(0)
    kern = get_variant("attention", "cupy", name).build(p, params, dev)
    assert kern.flat_io
    prep = prepare(OP, p, emu, np.random.default_rng(0), with_reference=False)
    with mc.traced_launches() as log:
        kern(prep.inputs, prep.outputs, prep.attrs)
    assert len(log) == launches
    assert all(np.isfinite(np.asarray(v, np.float64)).all() for v in prep.outputs.values())
