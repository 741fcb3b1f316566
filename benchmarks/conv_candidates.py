"""Which conv2d candidates the benchmark times: a short, shape-aware list per variant.

Every supported variant contributes its default parameters (what ``dnnctl.ops.conv2d`` runs
without a plan) plus the few others most likely to win on the shape:

* tiled tensor-core variants (parameters bm, bn, bk, warps, stages, splitk: implicit_gemm,
  gemm_1x1, nhwc_implicit_gemm, ...): a fixed menu of block tiles, each with split-K where
  the tile grid underfills the GPU, filtered by the variant's own rules and ranked by a
  wave / padding / intensity estimate; parameters outside the menu keep their default value,
  and the two best-ranked tiles are also tried with each other value of them;
* depthwise, depthwise_planes, depthwise_tile: a handful of block shapes around the default;
* winograd: F(2x2) and F(4x4); im2col_gemm, fft (filters of 5x5 and up), direct (small
  problems only): the default;
* any other variant: the default and a few evenly spaced points of its space.

No GPU needed: the unit tests check the lists on an H200 description.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Any

TC_KEYS = frozenset({"bm", "bn", "bk", "warps", "stages", "splitk"})
# (bm, bn, bk, warps, stages): big tiles for big products, skinny ones for few pixels
TC_TILES: tuple[tuple[int, int, int, int, int], ...] = (
    (128, 128, 32, 4, 4), (128, 128, 32, 8, 4), (128, 256, 32, 8, 3), (256, 128, 32, 8, 3),
    (128, 128, 64, 4, 3), (256, 64, 32, 8, 4), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4),
    (128, 32, 32, 4, 4), (64, 64, 32, 4, 4), (64, 64, 64, 4, 3), (32, 128, 64, 4, 4),
    (32, 64, 64, 4, 4), (16, 64, 64, 4, 4), (16, 128, 64, 4, 3),
)
SPLITS = (1, 2, 4, 8, 16)
TC_KEEP = 10  # ranked tensor-core candidates per variant (plus the default)
DIRECT_MAX_FLOPS = 2e9  # direct (CUDA cores) only competes on small problems
FFT_MIN_TAPS = 25  # fft only for filters of 5x5 and larger
WS_LIMIT = 8 << 30


def label(name: str, params: Mapping[str, Any]) -> str:
    """Short readable name of a candidate, e.g. implicit_gemm(128x128x32 w4 s4 sk2)."""
    rest = dict(params)
    parts = []
    if set(rest) >= TC_KEYS:
        parts.append(f"{rest.pop('bm')}x{rest.pop('bn')}x{rest.pop('bk')} "
                     f"w{rest.pop('warps')} s{rest.pop('stages')}")
        sk = rest.pop("splitk")
        if sk > 1:
            parts.append(f"sk{sk}")
    parts += [f"{k}={v}" for k, v in sorted(rest.items())]
    return f"{name}({' '.join(parts)})" if parts else name


def gemm_shape(variant: Any, g: Any) -> tuple[int, int, int, int]:
    """(M, N, K, batch) of the GEMM a tensor-core conv variant runs for geometry ``g``."""
    if variant.name == "gemm_1x1":
        from dnnctl.ops.conv2d.gemm_1x1 import gemm_dims

        return gemm_dims(g)
    return g.npq, g.kg, g.crs, g.groups


def tc_score(params: Mapping[str, Any], m: int, n: int, k: int, batch: int, sms: int,
             elem_bytes: int) -> float:
    """Higher is more promising: useful fraction of the padded tile grid x fraction of the
    last wave that is busy x arithmetic intensity of the tile x a small split-K cost."""
    bm, bn, bk = params["bm"], params["bn"], params["bk"]
    splitk, warps, stages = params["splitk"], params["warps"], params["stages"]
    tm, tn = -(-m // bm), -(-n // bn)
    pad = (m * n) / (tm * bm * tn * bn)
    kt = -(-k // bk)
    kpad = k / (kt * bk)
    smem = stages * (bm + bn) * bk * elem_bytes
    per_sm = max(1, min(228 * 1024 // max(smem, 1), 2048 // (32 * warps), 8))
    blocks = tm * tn * batch * splitk
    slots = sms * per_sm
    waves = -(-blocks // slots)
    # one wave: busy SMs / all SMs; more: the last wave's idle slots
    busy = min(1.0, blocks / sms) if waves == 1 else blocks / (waves * slots)
    intensity = min(1.0, (bm * bn / (bm + bn)) / 64.0) ** 0.5
    split_cost = 1.0 / (1.0 + 0.15 * math.log2(splitk))
    return pad * kpad * busy * intensity * split_cost


def _valid(variant: Any, problem: Any, params: Mapping[str, Any], device: Any) -> bool:
    try:
        return (variant.check_params(params) is None
                and bool(variant.valid_params(problem, params, device))
                and variant.workspace_bytes(problem, params) <= WS_LIMIT)
    except Exception:  # a parameter the variant cannot even evaluate is not a candidate
        return False


def _snap(value: int, allowed: tuple[Any, ...]) -> Any:
    """The allowed value nearest to ``value`` (the larger one on a tie)."""
    if value in allowed or not allowed:
        return value
    return min(allowed, key=lambda a: (abs(math.log2(a / value)), -a))


def _tc(variant: Any, problem: Any, g: Any, default: dict[str, Any],
        device: Any) -> list[dict[str, Any]]:
    m, n, k, batch = gemm_shape(variant, g)
    sms = getattr(device, "sm_count", 0) or 132
    eb = 2 if g.dtype in ("float16", "bfloat16") else 4
    space = variant.params
    scored, seen = [], set()
    for tile, sk in itertools.product(TC_TILES, SPLITS):
        # the menu snapped to the variant's own values (e.g. a kernel with one bk)
        bm, bn, bk, warps, stages = (_snap(v, space[key]) for v, key in zip(
            tile, ("bm", "bn", "bk", "warps", "stages")))
        p = dict(default, bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, splitk=sk)
        ident = tuple(sorted(p.items()))
        if ident in seen:
            continue
        seen.add(ident)
        if p != default and _valid(variant, problem, p, device):
            scored.append((tc_score(p, m, n, k, batch, sms, eb), len(scored), p))
    scored.sort(key=lambda t: (-t[0], t[1]))
    out = [p for _, _, p in scored[:TC_KEEP]]
    # parameters beyond the tile (e.g. a pipeline or reduction choice): try the other
    # values on the two best tiles
    for key in sorted(set(variant.params) - TC_KEYS):
        for p in out[:2]:
            for value in variant.params[key]:
                q = dict(p, **{key: value})
                if q not in out and _valid(variant, problem, q, device):
                    out.append(q)
    return out


def _around(variant: Any, problem: Any, default: dict[str, Any], device: Any,
            changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for ch in changes:
        p = dict(default, **ch)
        if p != default and p not in out and _valid(variant, problem, p, device):
            out.append(p)
    return out


def _depthwise(variant: Any, problem: Any, g: Any, default: dict[str, Any],
               device: Any) -> list[dict[str, Any]]:
    if g.nhwc:
        changes = [dict(cb=cb, tq=tq, threads=t) for cb, tq, t in (
            (64, 1, 128), (64, 2, 128), (64, 4, 128), (32, 2, 128), (128, 2, 256),
            (128, 1, 128), (64, 2, 256))]
    else:
        changes = [dict(th=th, tw=tw, tq=tq, threads=t) for th, tw, tq, t in (
            (8, 32, 2, 128), (8, 32, 1, 256), (4, 32, 1, 128), (16, 32, 4, 128),
            (8, 16, 1, 128), (8, 64, 4, 128), (8, 8, 1, 64))]
    return _around(variant, problem, default, device, changes)[:5]


def _tile(variant: Any, problem: Any, default: dict[str, Any],
          device: Any) -> list[dict[str, Any]]:
    """depthwise_tile: tiles a block (one, two, four), then the output tile and outputs per
    thread around the default."""
    other = [dict(tpb=t) for t in (1, 2, 4) if t != default.get("tpb")]
    changes = [*other, *(dict(cb=cb, th=th, tw=tw, tq=tq) for cb, th, tw, tq in (
        (32, 8, 16, 2), (32, 4, 16, 4), (32, 8, 32, 4), (64, 4, 16, 4), (16, 8, 16, 4),
        (32, 16, 8, 2), (32, 4, 32, 4)))]
    return _around(variant, problem, default, device, changes)[:6]


def _planes(variant: Any, problem: Any, default: dict[str, Any],
            device: Any) -> list[dict[str, Any]]:
    pb = default["pb"]
    changes = [dict(pb=max(1, pb // 2)), dict(pb=pb * 2), dict(pb=pb * 4),
               dict(threads=384 - default["threads"]), dict(pb=pb * 2, threads=256)]
    return _around(variant, problem, default, device, changes)


def _spread(variant: Any, problem: Any, default: dict[str, Any], device: Any,
            count: int) -> list[dict[str, Any]]:
    space: Iterator[dict[str, Any]] = variant.param_space(problem, device)
    pool = [p for p in itertools.islice(space, 2000) if p != default]
    if not pool or count <= 0:
        return []
    step = max(1, len(pool) // (count + 1))
    return [p for p in pool[step::step][:count]
            if variant.workspace_bytes(problem, p) <= WS_LIMIT]


def shortlist(variant: Any, problem: Any, device: Any) -> list[dict[str, Any]]:
    """Parameter sets of ``variant`` worth timing on ``problem`` (default first); [] when the
    variant does not support the problem or cannot compete on it."""
    from dnnctl.ops.conv2d.op import default_params, geometry

    if not variant.supports(problem, device):
        return []
    g = geometry(problem)
    flops = 2.0 * g.n * g.k * g.p * g.q * g.crs
    name = variant.name
    if name == "direct" and flops > DIRECT_MAX_FLOPS:
        return []
    if name == "fft" and g.r * g.s < FFT_MIN_TAPS:
        return []
    default = default_params(variant, problem, device)
    if default is None or not _valid(variant, problem, default, device):
        return []
    out = [default]
    if set(variant.params) >= TC_KEYS:
        out += _tc(variant, problem, g, default, device)
    elif name == "depthwise":
        out += _depthwise(variant, problem, g, default, device)
    elif name == "depthwise_planes":
        out += _planes(variant, problem, default, device)
    elif name == "depthwise_tile":
        out += _tile(variant, problem, default, device)
    elif name == "winograd":
        out += _around(variant, problem, default, device, [dict(tile=2), dict(tile=4)])
    elif name in ("im2col_gemm", "fft", "direct"):
        pass
    else:
        out += _spread(variant, problem, default, device, 3)
    return out


def candidates(problem: Any, device: Any) -> list[tuple[Any, dict[str, Any]]]:
    """(variant, params) of every registered cupy conv2d variant's shortlist, our own
    heuristic's choice included: dnnctl's kernels, the ones held against cuDNN (the vendor
    variants are cuDNN)."""
    from dnnctl.ops.conv2d.op import own_choice
    from dnnctl.ops.registry import variants

    out = [(v, p) for v in variants("conv2d", "cupy") if not v.vendor
           for p in shortlist(v, problem, device)]
    try:
        choice = own_choice(problem, "cupy", device)
    except Exception:
        return out
    if not any(v.name == choice.variant and p == choice.param_dict for v, p in out):
        from dnnctl.ops.registry import get_variant

        out.append((get_variant("conv2d", "cupy", choice.variant), choice.param_dict))
    return out
