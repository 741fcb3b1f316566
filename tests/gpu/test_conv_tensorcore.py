"""The tensor-core convolutions (implicit_gemm, gemm_1x1, and on Hopper implicit_gemm_wgmma:
NHWC fp16 / bf16 only) on the GPU, in depth: fp32 (FFMA and TF32) / fp16 / bf16 x NCHW / NHWC
against the float64 reference on fresh random inputs with
NaN-poisoned outputs, over N=1, C and K not multiples of 8, odd H/W, stride 2, dilation 2,
asymmetric padding, groups, 7x7 on 3 channels, deep reductions (split-K), 1x1 (strided too),
every epilogue; mostly split-K (else random) samples of the parameter space, some defaults.
Then the public API on torch channels_last tensors with the variant pinned.
(tests/gpu/test_conv2d.py runs every conv variant, these included, at lower depth.)
"""

from __future__ import annotations

import random

import pytest

from dnnctl.backends.registry import get_backend
from dnnctl.ops.base import Choice
from dnnctl.ops.check import check_variant
from dnnctl.ops.registry import get_op, get_variant

OP = get_op("conv2d")
VARIANTS = ("implicit_gemm", "gemm_1x1", "implicit_gemm_wgmma")

CASES: list[tuple[str, dict]] = [
    ("3x3_n1_odd_ck", dict(n=1, c=13, h=9, w=11, k=10, r=3, s=3, pad=1, bias=True,
                           activation="relu")),
    ("3x3", dict(n=2, c=16, h=10, w=12, k=24, r=3, s=3, pad=1)),
    ("s2_asym_pad", dict(n=2, c=24, h=15, w=13, k=40, r=3, s=3, stride=2, pad=[1, 0, 0, 1],
                         residual=True)),
    ("dilation2", dict(n=2, c=16, h=14, w=13, k=16, r=3, s=3, dilation=2, pad=2, bias=True,
                       activation="gelu")),
    ("groups2", dict(n=2, c=32, h=9, w=9, k=48, r=3, s=3, pad=1, groups=2, bias=True,
                     activation="silu", residual=True)),
    ("7x7_s2_c3", dict(n=1, c=3, h=33, w=31, k=16, r=7, s=7, stride=2, pad=3, bias=True)),
    ("deep_7x7_map", dict(n=1, c=256, h=7, w=7, k=64, r=3, s=3, pad=1, bias=True,
                          activation="relu")),
    ("1x1", dict(n=2, c=64, h=7, w=9, k=72, r=1, s=1, bias=True, residual=True,
                 activation="relu")),
    ("1x1_s2_odd", dict(n=1, c=40, h=13, w=13, k=20, r=1, s=1, stride=2)),
    ("1x1_deep", dict(n=1, c=1024, h=7, w=7, k=256, r=1, s=1, bias=True)),
    ("1x1_groups2", dict(n=2, c=32, h=6, w=6, k=16, r=1, s=1, groups=2, residual=True)),
    ("5x5_asym_tf32", dict(n=2, c=8, h=12, w=11, k=12, r=5, s=5, pad=[2, 1, 0, 3],
                           tf32=True)),
]


@pytest.fixture(scope="module")
def gpu():
    be = get_backend("cupy")
    return be, be.device(0)


def _params(variant, problem, dev, rng: random.Random, i: int) -> dict | None:
    """One parameter set per case: mostly a split-K sample (else a random one) of the space,
    the variant's default every fourth case (tests/gpu/test_conv2d.py checks the defaults)."""
    if i % 4 == 0:
        return variant.default_params(problem, dev)
    space = list(variant.param_space(problem, dev))
    split = [p for p in space if p["splitk"] > 1]
    return rng.choice(split or space) if space else None


COMBOS = [(name, dtype, layout) for name in VARIANTS
          for dtype in ("float32", "float16", "bfloat16") for layout in ("NHWC", "NCHW")
          if name != "implicit_gemm_wgmma" or (dtype != "float32" and layout == "NHWC")]


@pytest.mark.parametrize(("name", "dtype", "layout"), COMBOS,
                         ids=["-".join(c) for c in COMBOS])
def test_tensorcore_conv_matches_reference(name, dtype, layout, gpu):
    """Half the cases per combination (alternating, so every case runs in three of the six
    dtype x layout combinations): NVRTC compiles bound the run."""
    be, dev = gpu
    variant = get_variant("conv2d", "cupy", name)
    j = COMBOS.index((name, dtype, layout))
    rng = random.Random(f"{name}/{dtype}/{layout}")
    checked, failures = 0, []
    for i, (cid, case) in enumerate(CASES):
        if case.get("tf32") and dtype != "float32":
            continue
        if (i + j) % 2 and not case.get("tf32"):
            continue
        problem = OP.problem(dict(case, dtype=dtype, layout=layout))
        if not variant.supports(problem, dev):
            continue
        params = _params(variant, problem, dev, rng, i)
        assert params is not None, f"{name} supports {cid} but has no valid parameters"
        assert variant.valid_params(problem, params, dev)
        res = check_variant(OP, problem, variant, params, be, dev, seed=200 + i)
        checked += 1
        if not res.ok:
            failures.append(f"{cid} {params}: {res.detail}")
        elif dtype != "float32" or problem["tf32"]:
            assert res.max_rel_err < OP.tolerance(problem, "y") / 2, (cid, params, res)
    if checked == 0:
        pytest.skip(f"{name} supports none of this combination's cases")
    assert not failures, f"{name} {dtype} {layout}:\n" + "\n".join(failures)


class _Pin:
    def __init__(self, variant: str, params: dict):
        self.choice = Choice.of(variant, params)

    def lookup(self, problem, backend, device):
        return self.choice


@pytest.mark.parametrize(("variant", "params", "shape"), [
    ("implicit_gemm", {"bm": 128, "bn": 64, "bk": 32, "warps": 4, "stages": 4, "splitk": 1},
     dict(n=2, c=64, h=14, w=14, k=64, r=3, s=3, stride=1, pad=1)),
    ("implicit_gemm", {"bm": 64, "bn": 64, "bk": 64, "warps": 4, "stages": 3, "splitk": 2},
     dict(n=1, c=128, h=15, w=13, k=96, r=3, s=3, stride=2, pad=1)),
    ("gemm_1x1", {"bm": 64, "bn": 128, "bk": 32, "warps": 4, "stages": 4, "splitk": 1},
     dict(n=2, c=256, h=14, w=14, k=128, r=1, s=1, stride=2, pad=0)),
    ("implicit_gemm_wgmma", {"bm": 128, "bn": 64, "bk": 64, "warps": 8, "stages": 4,
                             "splitk": 1},
     dict(n=2, c=3, h=32, w=30, k=64, r=7, s=7, stride=2, pad=3)),  # conv1: channels padded
    ("implicit_gemm_wgmma", {"bm": 64, "bn": 128, "bk": 64, "warps": 4, "stages": 4,
                             "splitk": 2},
     dict(n=1, c=128, h=15, w=13, k=96, r=3, s=3, stride=2, pad=1)),
])
def test_public_api_channels_last_torch(variant, params, shape, gpu):
    torch = pytest.importorskip("torch")
    import dnnctl

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(11)
    n, c, h, w_, k, r, s = (shape[x] for x in ("n", "c", "h", "w", "k", "r", "s"))
    x = torch.randn(n, c, h, w_, device=dev, generator=g).half()
    wt = (torch.randn(k, c, r, s, device=dev, generator=g) / (c * r * s) ** 0.5).half()
    bias = torch.randn(k, device=dev, generator=g).half()
    x_nhwc = x.permute(0, 2, 3, 1).contiguous()
    w_nhwc = wt.permute(0, 2, 3, 1).contiguous()
    ref = torch.nn.functional.conv2d(x.double(), wt.double(), bias.double(),
                                     stride=shape["stride"], padding=shape["pad"]).relu()
    res = torch.randn_like(ref.permute(0, 2, 3, 1).contiguous(), dtype=torch.half)
    ref = ref + res.permute(0, 3, 1, 2).double()
    y = dnnctl.ops.conv2d(x_nhwc, w_nhwc, bias=bias, stride=shape["stride"],
                          padding=shape["pad"], activation="relu", residual=res,
                          layout="NHWC", plan=_Pin(variant, params))
    assert isinstance(y, torch.Tensor) and y.shape == res.shape
    err = ((y.permute(0, 3, 1, 2).double() - ref).norm() / ref.norm()).item()
    assert err < 2e-3, err
