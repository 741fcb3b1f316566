"""conv2d backward on the GEMM kernels: dgrad by stride phases (dgrad_phase.py; the phase
arithmetic against a brute-force enumeration, support answers) and the wgrad implicit GEMM
with split-K (wgrad_implicit_gemm.py). Every variant runs end to end on the CPU emulator
through its own build() against the float64 reference with poisoned outputs (stride 2,
dilation 2, groups 2, asymmetric padding, odd sizes, N=1, phases without taps, split-K in
fixed order and by atomics)."""

from __future__ import annotations

import pytest
from _emu_helpers import conv_emu_fixture, needs_emu

from dnnctl.backends.base import DeviceInfo
from dnnctl.ops.check import check_variant
from dnnctl.ops.conv2d.dgrad_phase import axis_phases, phases
from dnnctl.ops.conv2d.op import default_params, geometry
from dnnctl.ops.registry import get_op, get_variant

OP = get_op("conv2d")
H200 = DeviceInfo(backend="cupy", index=0, name="H200 (emulated)", compute_capability="9.0",
                  sm_count=132, smem_per_block_optin=232448)


def dgrad(**kw):
    base = {"dtype": "float16", "layout": "NHWC", "pass": "dgrad"}
    return OP.problem(dict(base, **kw))


def backward(name: str, **kw):
    which = name.split("_")[0]
    return OP.problem(dict({"dtype": "float16", "layout": "NHWC", "pass": which}, **kw))


@pytest.mark.parametrize(("size", "taps", "stride", "pad", "dil"), [
    (9, 3, 2, 1, 1), (8, 3, 2, 0, 1), (11, 5, 3, 2, 2), (7, 3, 1, 1, 2), (6, 1, 2, 0, 1),
    (10, 4, 2, 2, 3), (5, 7, 4, 3, 1),
])
def test_axis_phases_cover_every_input_row_tap_pair(size, taps, stride, pad, dil):
    """Each (input row, tap, dy row) triple of the convolution appears in exactly one phase."""
    out = (size + 2 * pad - dil * (taps - 1) - 1) // stride + 1
    want = {(h, r, (h + pad - r * dil) // stride) for h in range(size) for r in range(taps)
            if (h + pad - r * dil) % stride == 0 and 0 <= (h + pad - r * dil) // stride < out}
    got = set()
    for ph in axis_phases(size, out, taps, stride, pad, dil):
        assert ph.out >= ph.count
        for i in range(ph.count):
            h = ph.a + i * stride
            for jp in range(ph.taps):  # phase conv: dy row i - pad0 + jp * dil, flipped tap
                p = i - ph.pad0 + jp * ph.dil
                r = ph.r0 + (ph.taps - 1 - jp) * ph.step
                if 0 <= p < out:
                    got.add((h, r, p))
    assert got == want


def test_support_answers():
    v = get_variant("conv2d", "cupy", "dgrad_implicit_gemm")
    assert v.supports(dgrad(n=2, c=16, h=9, w=9, k=8, r=3, s=3, stride=2, pad=1), H200)
    patch = dgrad(n=1, c=3, h=64, w=64, k=16, r=16, s=16, stride=16)
    assert "stride phases" in v.supports(patch, H200).reason
    assert "dgrad_im2col_gemm" in v.supports(patch, H200).reason
    fwd = OP.problem(n=1, c=8, h=8, w=8, k=8, r=3, s=3, dtype="float16", layout="NHWC")
    assert "forward" in v.supports(fwd, H200).reason
    wino = get_variant("conv2d", "cupy", "dgrad_winograd")
    assert wino.supports(dgrad(n=1, c=8, h=8, w=8, k=8, r=3, s=3, pad=1, dtype="float32"),
                         H200)
    assert "3x3" in wino.supports(dgrad(n=1, c=8, h=8, w=8, k=8, r=3, s=3, pad=1, stride=2,
                                        dtype="float32"), H200).reason
    # 1x1 stride 2: one phase with the tap, three zero-filled
    ph = phases(geometry(dgrad(n=1, c=8, h=7, w=7, k=8, r=1, s=1, stride=2)))
    assert sum(p.problem is None for p in ph) == 3


emu = conv_emu_fixture()


EMU_CASES = [
    ("dgrad_implicit_gemm", dict(n=2, c=12, h=9, w=8, k=16, r=3, s=3, pad=1)),  # stride 1
    ("dgrad_implicit_gemm", dict(n=1, c=8, h=9, w=7, k=12, r=3, s=3, stride=2,
                                 pad=[1, 0, 0, 1], dtype="bfloat16")),
    ("dgrad_implicit_gemm", dict(n=2, c=8, h=7, w=8, k=8, r=3, s=3, dilation=2, pad=2,
                                 groups=2, layout="NCHW", dtype="float32", tf32=True)),
    ("dgrad_implicit_gemm_wgmma", dict(n=1, c=16, h=7, w=9, k=16, r=3, s=3, stride=2, pad=1)),
    ("dgrad_winograd", dict(n=1, c=5, h=7, w=6, k=6, r=3, s=3, pad=1, dtype="float32",
                            layout="NCHW")),
    ("dgrad_fft", dict(n=1, c=4, h=11, w=10, k=6, r=5, s=5, stride=2, pad=2)),
    ("dgrad_gemm_1x1", dict(n=2, c=16, h=7, w=7, k=8, r=1, s=1, stride=2)),
    ("wgrad_implicit_gemm", dict(n=2, c=12, h=9, w=8, k=16, r=3, s=3, pad=1, bias=True)),
    ("wgrad_implicit_gemm", dict(n=1, c=8, h=9, w=7, k=12, r=3, s=3, stride=2,
                                 pad=[1, 0, 0, 1], dtype="bfloat16")),
    ("wgrad_implicit_gemm", dict(n=2, c=6, h=7, w=8, k=10, r=3, s=2, dilation=2, pad=2,
                                 groups=2, dtype="float32", tf32=True, bias=True)),
    ("wgrad_implicit_gemm", dict(n=1, c=5, h=6, w=7, k=3, r=1, s=1, dtype="float32")),
    ("wgrad_implicit_gemm_atomic", dict(n=3, c=16, h=9, w=9, k=8, r=3, s=3, pad=1,
                                        bias=True)),
    ("dgrad_nhwc_implicit_gemm", dict(n=2, c=8, h=9, w=7, k=12, r=3, s=3, stride=2, pad=1,
                                      layout="NCHW")),
    ("wgrad_nhwc_implicit_gemm", dict(n=2, c=8, h=7, w=9, k=12, r=3, s=3, pad=[1, 0, 0, 1],
                                      layout="NCHW", dtype="bfloat16", bias=True)),
]

# split-K really split: fixed-order slabs and atomics (the emulator is slow: small tiles)
SPLIT_CASES = [
    ("wgrad_implicit_gemm", dict(n=2, c=8, h=16, w=16, k=16, r=3, s=3, pad=1),
     dict(bm=16, bn=64, bk=32, warps=4, stages=2, splitk=4)),
    ("wgrad_implicit_gemm_atomic", dict(n=2, c=8, h=16, w=16, k=16, r=3, s=3, pad=1,
                                        bias=True),
     dict(bm=16, bn=64, bk=32, warps=4, stages=3, splitk=2)),
    # Cg = 3: single-channel gather copies; bn 256 takes all 8 warps' threads per pixel row
    ("wgrad_implicit_gemm", dict(n=1, c=3, h=11, w=10, k=16, r=7, s=7, stride=2, pad=3),
     dict(bm=16, bn=256, bk=32, warps=8, stages=2, splitk=1)),
]


@needs_emu
@pytest.mark.parametrize(("name", "key"), EMU_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(EMU_CASES)])
def test_phased_dgrad_on_cpu_emulator(emu, name, key):
    v = get_variant("conv2d", "cupy", name)
    p = backward(name, **key)
    dev = emu.device(0)
    assert v.supports(p, dev), v.supports(p, dev).reason
    params = default_params(v, p, dev)
    assert params is not None and v.check_params(params) is None
    res = check_variant(OP, p, v, params, emu, dev, seed=7)
    assert res.ok, f"{name}{params} {p.short()}: {res.detail}"


@needs_emu
@pytest.mark.parametrize(("name", "key", "params"), SPLIT_CASES,
                         ids=[c[0] for c in SPLIT_CASES])
def test_wgrad_split_k_on_cpu_emulator(emu, name, key, params):
    v = get_variant("conv2d", "cupy", name)
    p = backward(name, **key)
    dev = emu.device(0)
    assert v.check_params(params) is None and v.valid_params(p, params, dev)
    res = check_variant(OP, p, v, params, emu, dev, seed=3)
    assert res.ok, f"{name}{params}: {res.detail}"


def test_wgrad_gemm_support_and_workspace():
    v = get_variant("conv2d", "cupy", "wgrad_implicit_gemm")
    va = get_variant("conv2d", "cupy", "wgrad_implicit_gemm_atomic")
    big = backward("wgrad", n=64, c=64, h=56, w=56, k=64, r=3, s=3, pad=1)
    d = v.default_params(big, H200)
    assert d is not None and d["splitk"] > 1  # 64 x 576 outputs: the pixels must be split
    assert v.workspace_bytes(big, d) <= (256 << 20)
    da = va.default_params(big, H200)
    slab = 64 * 576 * 4
    assert va.workspace_bytes(big, da) == -(-slab // 256) * 256  # one slab, any split
    assert not va.deterministic and v.deterministic
    nchw = backward("wgrad", n=1, c=8, h=8, w=8, k=8, r=3, s=3, layout="NCHW")
    assert "NHWC" in v.supports(nchw, H200).reason
