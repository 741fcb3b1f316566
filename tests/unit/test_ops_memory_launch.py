"""Launch geometry and compilation of the memory-bound CUDA variants, without a GPU.

A recording stand-in for the cupy backend captures what each variant's ``build()`` compiles
(source, defines, template instances) and what its kernel launches (grid, block, shared
memory, arguments) on H200-sized problems; the launches must respect CUDA's limits. Where
libnvrtc is installed, every compiled module is also built with NVRTC exactly as on the GPU.
"""

from __future__ import annotations

import importlib.util
import os
import random
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dnnctl.backends import registry as backends
from dnnctl.backends.base import DeviceInfo
from dnnctl.ops import _spatial_norm as sp
from dnnctl.ops.registry import get_op, get_variant, variants

ROOT = Path(__file__).resolve().parents[2]
H200 = DeviceInfo(backend="cupy", index=0, name="NVIDIA H200", compute_capability="9.0",
                  sm_count=132, memory_bytes=141 << 30, l2_bytes=60 << 20,
                  smem_per_block_optin=232448)
MEMORY_OPS = ("activation", "softmax", "layer_norm", "rms_norm", "batch_norm", "group_norm",
              "pool2d", "global_avg_pool2d")


class FakeArray:
    """Enough of a CuPy array for the kernels' alignment checks and argument tuples."""

    def __init__(self, shape: Sequence[int], dtype: Any, ptr: int = 1 << 20) -> None:
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype) if dtype != "bfloat16" else dtype
        self.data = type("Ptr", (), {"ptr": ptr})()
        self.size = int(np.prod(self.shape))

    def __getitem__(self, item: Any) -> FakeArray:
        return self

    def fill(self, value: Any) -> None:  # (workspace counters are zeroed at build time)
        pass

    def view(self, dtype: Any) -> FakeArray:
        return FakeArray(self.shape, dtype, self.data.ptr)


class Function:
    def __init__(self, module: Module, name: str) -> None:
        self.module, self.name = module, name
        self.max_dynamic_shared_size_bytes = 0

    def __call__(self, grid: Sequence[int], block: Sequence[int], args: Sequence[Any],
                 shared_mem: int = 0) -> None:
        self.module.launches.append((self, tuple(grid), tuple(block), shared_mem, tuple(args)))


class Module:
    def __init__(self, source: str, defines: Mapping[str, Any], names: Sequence[str]) -> None:
        self.source, self.defines, self.names = source, dict(defines), tuple(names)
        self.launches: list[tuple] = []

    def get_function(self, name: str) -> Function:
        assert name in self.names, f"{name} not among the compiled instances {self.names[:4]}"
        return Function(self, name)


class RecordingBackend:
    name = "cupy"
    xp = None

    def __init__(self) -> None:
        self.modules: list[Module] = []

    def compile_module(self, source: str, *, defines: Mapping[str, Any] | None = None,
                       name_expressions: Sequence[str] = (), options: Sequence[str] = (),
                       device: int | None = None) -> Module:
        assert (ROOT / "kernels" / source).is_file(), source
        mod = Module(source, defines or {}, name_expressions)
        self.modules.append(mod)
        return mod


@pytest.fixture()
def recorder(monkeypatch: pytest.MonkeyPatch) -> RecordingBackend:
    rec = RecordingBackend()
    monkeypatch.setitem(backends._BACKENDS, "cupy", rec)
    from dnnctl.ops import _memory_common as mc

    monkeypatch.setattr(mc, "workspace", lambda device, nbytes: FakeArray((nbytes // 4 + 1,),
                                                                          np.float32))
    return rec


BIG: dict[str, list[dict[str, Any]]] = {
    "activation": [dict(fn="gelu", shape=(8192, 8192), dtype="float16"),
                   dict(fn="relu", shape=(256, 64, 112, 112), dtype="bfloat16",
                        bias="channel"),
                   dict(fn="silu", shape=(3,), dtype="float32", bias="channel",
                        layout="NHWC")],
    "softmax": [dict(rows=8192, cols=8192, dtype="float16"),
                dict(rows=4, cols=262144, dtype="float32"),
                dict(rows=1 << 20, cols=3, dtype="bfloat16", log=True),
                dict(rows=70000, cols=20000, dtype="float16")],
    "layer_norm": [dict(rows=8192, cols=8192, dtype="float16"),
                   dict(rows=3, cols=100000, dtype="float32")],
    "rms_norm": [dict(rows=16384, cols=4096, dtype="bfloat16")],
    "batch_norm": [dict(n=32, c=256, h=56, w=56, dtype="float16", layout="NHWC"),
                   dict(n=256, c=64, h=56, w=56, dtype="float16", layout="NHWC",
                        training=True),
                   dict(n=256, c=2048, h=7, w=7, dtype="float32", layout="NCHW",
                        training=True),
                   dict(n=1, c=3, h=1024, w=1024, dtype="bfloat16", layout="NCHW")],
    "group_norm": [dict(n=32, c=256, h=56, w=56, groups=32, dtype="float16", layout="NHWC"),
                   dict(n=1, c=64, h=256, w=256, groups=4, dtype="float32", layout="NCHW")],
    "pool2d": [dict(n=256, c=64, h=112, w=112, mode="max", kernel=3, stride=2, pad=1,
                    dtype="float16", layout="NHWC"),
               dict(n=256, c=64, h=112, w=112, mode="avg", kernel=3, stride=2, pad=1,
                    dtype="float16", layout="NCHW")],
    "global_avg_pool2d": [dict(n=256, c=2048, h=7, w=7, dtype="float16", layout="NHWC"),
                          dict(n=2, c=3, h=512, w=512, dtype="float32", layout="NCHW"),
                          dict(n=2, c=64, h=512, w=512, dtype="float16", layout="NHWC")],
}


BW = {"pass": "backward"}
# backward problems of the ResNet-50 / ViT-B/16 training shapes (and a few extremes)
BIG["activation"] += [dict(fn="relu", shape=(256, 64, 112, 112), dtype="float16", **BW),
                      dict(fn="gelu", shape=(197 * 64, 3072), dtype="bfloat16",
                           bias="channel", layout="NHWC", **BW),
                      dict(fn="silu", shape=(32, 256, 56, 56), dtype="float16",
                           bias="channel", **BW)]
BIG["softmax"] += [dict(rows=64 * 12 * 197, cols=197, dtype="float16", **BW),
                   dict(rows=1024, cols=32000, dtype="float32", log=True, **BW)]
BIG["layer_norm"] += [dict(rows=64 * 197, cols=768, dtype="bfloat16", **BW),
                      dict(rows=3, cols=16000, dtype="float32", **BW)]
BIG["rms_norm"] += [dict(rows=16384, cols=4096, dtype="bfloat16", **BW)]
BIG["batch_norm"] += [dict(n=64, c=256, h=56, w=56, dtype="float16", layout="NHWC",
                           training=True, **BW),
                      dict(n=256, c=2048, h=7, w=7, dtype="float32", layout="NCHW",
                           training=True, **BW)]
BIG["group_norm"] += [dict(n=32, c=256, h=56, w=56, groups=32, dtype="float16",
                           layout="NHWC", **BW)]
BIG["pool2d"] += [dict(n=256, c=64, h=112, w=112, mode="max", kernel=3, stride=2, pad=1,
                       dtype="float16", layout="NHWC", indices=True),
                  dict(n=256, c=64, h=112, w=112, mode="max", kernel=3, stride=2, pad=1,
                       dtype="float16", layout="NHWC", **BW),
                  dict(n=256, c=64, h=112, w=112, mode="avg", kernel=3, stride=2, pad=1,
                       dtype="bfloat16", layout="NCHW", **BW)]
BIG["global_avg_pool2d"] += [dict(n=256, c=2048, h=7, w=7, dtype="float16", layout="NHWC",
                                  **BW)]


def _fake_io(op: Any, problem: Any) -> tuple[dict, dict]:
    ins = {k: FakeArray(s.shape, s.dtype) for k, s in op.input_specs(problem).items()}
    outs = {k: FakeArray(s.shape, s.dtype) for k, s in op.output_specs(problem).items()}
    return ins, outs


def _check_launch(fn: Any, grid: tuple, block: tuple, smem: int, label: str) -> None:
    assert 1 <= len(grid) <= 3 and 1 <= len(block) <= 3, label
    assert all(g >= 1 for g in grid), f"{label}: empty grid {grid}"
    assert grid[0] < 2**31 and all(g <= 65535 for g in grid[1:]), f"{label}: grid {grid}"
    threads = int(np.prod(block))
    assert threads <= 1024 and threads % 32 == 0, f"{label}: block {block}"
    assert smem <= H200.smem_per_block_optin, f"{label}: {smem} bytes of shared memory"
    if smem > 48 * 1024:
        assert fn.max_dynamic_shared_size_bytes >= smem, f"{label}: smem opt-in missing"


@pytest.mark.parametrize("op_name", MEMORY_OPS)
def test_every_cuda_variant_launches_within_cuda_limits(recorder: RecordingBackend,
                                                        op_name: str) -> None:
    op = get_op(op_name)
    rng = random.Random(op_name)
    built = 0
    for key in BIG[op_name]:
        problem = op.problem(key)
        for variant in variants(op_name, "cupy"):
            if not variant.supports(problem, H200):
                continue
            space = list(variant.param_space(problem, H200))
            assert space, f"{variant.name} supports {problem.short()} with no valid params"
            for params in rng.sample(space, min(4, len(space))):
                assert variant.check_params(params) is None
                recorder.modules.clear()
                kernel = variant.build(problem, params, H200)
                ins, outs = _fake_io(op, problem)
                kernel(ins, outs, op.default_attrs(problem))
                launches = [la for m in recorder.modules for la in m.launches]
                assert launches, f"{variant.name}{params} launched nothing"
                for fn, grid, block, smem, args in launches:
                    _check_launch(fn, grid, block, smem, f"{problem.short()} {fn.name}")
                    for a in args:
                        assert a is None or isinstance(a, (FakeArray, np.generic)), (
                            f"{fn.name}: argument {a!r} has no fixed C type")
                built += 1
    assert built


def test_misaligned_arrays_launch_the_scalar_instance(recorder: RecordingBackend) -> None:
    op = get_op("softmax")
    problem = op.problem(rows=64, cols=512, dtype="float16")
    variant = next(v for v in variants("softmax", "cupy") if v.name == "block_row")
    kernel = variant.build(problem, {"block": 128, "vec": 8}, H200)
    kernel({"x": FakeArray((64, 512), np.float16, ptr=4096 + 2)},
           {"y": FakeArray((64, 512), np.float16)}, {})
    kernel({"x": FakeArray((64, 512), np.float16)}, {"y": FakeArray((64, 512), np.float16)}, {})
    names = [la[0].name for m in recorder.modules for la in m.launches]
    assert names == ["softmax_block<128,1,4>", "softmax_block<128,8,1>"]


def _nvrtc() -> tuple[Any, Path]:
    spec = importlib.util.spec_from_file_location("nvrtc_check", ROOT / "tools" / "nvrtc_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        mod._libnvrtc()
    except SystemExit:
        pytest.skip("libnvrtc is not installed (pip install 'nvidia-cuda-nvrtc>=13,<14')")
    cuda_inc = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    if not (cuda_inc / "cuda_fp16.h").is_file():
        pytest.skip(f"no CUDA headers in {cuda_inc} (set CUDA_HOME)")
    return mod, cuda_inc


SMALL: dict[str, dict[str, Any]] = {
    "activation": dict(fn="gelu_tanh", shape=(4, 6, 5), dtype="bfloat16", bias="channel"),
    "softmax": dict(rows=3, cols=8200, dtype="float16", log=True),
    "layer_norm": dict(rows=4, cols=1000, dtype="float32"),
    "rms_norm": dict(rows=4, cols=1000, dtype="float16"),
    "batch_norm": dict(n=4, c=8, h=30, w=30, dtype="bfloat16", layout="NHWC", training=True),
    "group_norm": dict(n=1, c=8, h=64, w=64, groups=2, dtype="float16", layout="NHWC"),
    "pool2d": dict(n=2, c=8, h=9, w=9, mode="max", kernel=3, stride=2, pad=1,
                   dtype="float16", layout="NHWC"),
    "global_avg_pool2d": dict(n=2, c=8, h=64, w=64, dtype="float32", layout="NCHW"),
}


HUGE: dict[str, dict[str, Any]] = {
    "activation": dict(fn="relu", shape=(3, 1 << 30), dtype="float16", bias="channel",
                       layout="NHWC"),
    "batch_norm": dict(n=1024, c=64, h=128, w=128, dtype="float16", layout="NCHW"),
    "pool2d": dict(n=512, c=64, h=224, w=224, mode="avg", kernel=3, stride=1, pad=1,
                   dtype="bfloat16", layout="NCHW"),
}


@pytest.mark.parametrize("op_name", MEMORY_OPS)
def test_every_compiled_module_builds_with_nvrtc(recorder: RecordingBackend,
                                                 op_name: str) -> None:
    """The exact (source, defines, template instances) each build compiles, through NVRTC."""
    nv, cuda_inc = _nvrtc()
    op = get_op(op_name)
    problems = [op.problem(SMALL[op_name])]
    if op_name in ("batch_norm", "pool2d", "global_avg_pool2d", "activation"):
        other = dict(SMALL[op_name], layout="NCHW" if problems[0]["layout"] == "NHWC"
                     else "NHWC")
        if op_name == "batch_norm":
            other["training"] = False
        problems.append(op.problem(other))
    if op_name in HUGE:  # 64-bit index instances (only compiled: nothing is allocated)
        problems.append(op.problem(HUGE[op_name]))
    # the backward pass (and max pooling with indices), both layouts where there are two
    for key in (SMALL[op_name], *([other] if len(problems) > 1 else [])):
        key = dict(key, **BW)
        if op_name == "batch_norm":
            key["training"] = True
        problems.append(op.problem(key))
    if op_name == "batch_norm":  # training NCHW (the statistics kernels over planes)
        problems.append(op.problem(dict(SMALL[op_name], layout="NCHW")))
    if op_name == "pool2d":
        problems += [op.problem(dict(SMALL["pool2d"], indices=True)),
                     op.problem(dict(SMALL["pool2d"], mode="avg", layout="NCHW", **BW))]
    seen = set()
    for problem in problems:
        for variant in variants(op_name, "cupy"):
            if not variant.supports(problem, H200):
                continue
            variant.build(problem, next(iter(variant.param_space(problem, H200))), H200)
    for mod in recorder.modules:
        key = (mod.source, tuple(sorted(mod.defines.items())), mod.names)
        if key in seen:
            continue
        seen.add(key)
        opts = ["-arch=sm_90a", "--std=c++17", f"-I{ROOT / 'kernels' / 'include'}",
                f"-I{cuda_inc}", "-DDNNCTL_HEADERS=0x0", *(f"-D{k}={int(v) if isinstance(v, bool) else v}"
                                          for k, v in sorted(mod.defines.items()))]
        ok, log = nv.nvrtc_compile(ROOT / "kernels" / mod.source, opts, list(mod.names))
        assert ok, f"{mod.source} {mod.defines}:\n{log[:3000]}"
        ptx = _ptx(nv, ROOT / "kernels" / mod.source, ["-arch=compute_90a", *opts[1:]],
                   list(mod.names))
        # everything is inlined: a call is a helper calling itself (or an unexpected libcall)
        calls = re.findall(r"^\s*call(?:\.uni)?\s.*$", ptx, re.M)
        assert not calls, f"{mod.source} {mod.defines}: PTX calls {calls[:3]}"
        # reducing kernels must still contain their barriers and shuffles (a helper that
        # recursed into itself once compiled to nothing: no call, no bar.sync, no shfl)
        text = (ROOT / "kernels" / mod.source).read_text()
        barriers = _kernels_using(text, r"block_(sum|max|welford|maxsum)\b|sync_block\(")
        shuffles = _kernels_using(text, r"block_(sum|max|welford|maxsum)\b|group_(sum|max)")
        for entry in re.split(r"\.entry\s+", ptx)[1:]:
            name = entry.split("(", 1)[0]
            if any(f"{len(k)}{k}" in name for k in barriers):  # Itanium-mangled identifier
                assert re.search(r"\bbar(rier)?\.sync", entry), f"{name}: no barrier in PTX"
            if any(f"{len(k)}{k}" in name for k in shuffles):
                assert "shfl.sync" in entry, f"{name}: no warp shuffle in PTX"
    assert seen


def _kernels_using(text: str, pattern: str) -> set[str]:
    """Names of the __global__ functions whose bodies match ``pattern``."""
    out = set()
    for m in re.finditer(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(",
                         text):
        i = start = text.index("{", m.end())
        depth = 0
        while True:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                break
            i += 1
        if re.search(pattern, text[start:i]):
            out.add(m.group(1))
    return out


def _ptx(nv: Any, path: Path, options: list[str], names: list[str]) -> str:
    """PTX of ``path`` through NVRTC (compute_90a), for inspection."""
    import ctypes

    lib = nv._libnvrtc()
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), path.read_bytes(), str(path).encode(), 0,
                                  None, None) == 0
    for n in names:
        lib.nvrtcAddNameExpression(prog, n.encode())
    opts = [o.encode() for o in options]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, buf)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    assert rc == 0, path
    return buf.value.decode(errors="replace")


def test_round2_variants_geometry(recorder: RecordingBackend) -> None:
    """Tiles cover the output, workspaces hold 16-byte-aligned parameter vectors, staged
    variants refuse what does not fit in shared memory."""
    from dnnctl.ops.registry import get_variant

    pool = get_op("pool2d").problem(n=256, c=64, h=112, w=112, mode="max", kernel=3, stride=2,
                                    pad=1, dtype="float16", layout="NHWC")
    tile = get_variant("pool2d", "cupy", "nhwc_tile")
    params = {"block": 256, "vec": 8, "th": 8, "tw": 8}
    assert tile.ct(pool, 8) == 8 and tile.patch_bytes(pool, params, 8) == 17 * 17 * 128
    assert tile.tiles(pool, params, 8) == 256 * 7 * 7
    kernel = tile.build(pool, params, H200)
    kernel(*_fake_io(get_op("pool2d"), pool), {})
    (fn, grid, block, smem, args), = [la for m in recorder.modules for la in m.launches]
    assert fn.name == "pool_tile<256,8,8,8,8>" and grid == (12544,) and smem == 36992
    assert recorder.modules[0].defines["OH"] == 56 and len(args) == 2

    bn = get_op("batch_norm").problem(n=32, c=200, h=7, w=9, dtype="bfloat16", layout="NHWC",
                                      training=True)
    stream = get_variant("batch_norm", "cupy", "train_stream")
    for params in stream.param_space(bn, H200):
        splits, m_off, s_off = stream.layout(bn, params, params["vec"], 132)
        assert m_off % 4 == 0 and s_off % 4 == 0 and m_off >= 3 * 200 * splits
        assert stream.workspace_bytes(bn, params) >= 4 * (s_off + 200)

    gn = get_variant("group_norm", "cupy", "async_group")
    big = get_op("group_norm").problem(n=1, c=16, h=128, w=128, groups=2, dtype="float16",
                                       layout="NHWC")  # 256 KB groups
    assert not gn.supports(big, H200)
    ok = get_op("group_norm").problem(n=32, c=256, h=56, w=56, groups=32, dtype="float16",
                                      layout="NHWC")
    assert gn.supports(ok, H200)
    assert {p["gpb"] for p in gn.param_space(ok, H200)} == {1, 2, 4}  # 4 x 50 KB fits


def test_last_block_workspaces_and_tiles() -> None:
    """train_lastblock / bwd_reduce_dx: 128-byte (bwd: 128 or 512-byte) NHWC channel tiles
    (as the kernels' TX),
    16-byte aligned workspace regions, and workspace_bytes covering every vector width."""
    op = get_op("batch_norm")
    fwd = get_variant("batch_norm", "cupy", "train_lastblock")
    bwd = get_variant("batch_norm", "cupy", "bwd_reduce_dx")
    for c, dtype in ((256, "float16"), (200, "bfloat16"), (24, "float32"), (2048, "float16")):
        key = dict(n=16, c=c, h=14, w=14, dtype=dtype, layout="NHWC", training=True)
        p_f, p_b = op.problem(key), op.problem(dict(key, **BW))
        size = 2 if dtype != "float32" else 4
        for params in fwd.param_space(p_f, H200):
            vec = params["vec"]
            tx = sp.tile_lanes(p_f, vec, params["tile"], params["block"])
            assert tx == min(params["tile"] // (vec * size), c // vec, params["block"])
            splits, tiles, s_off, k_off = fwd.layout(p_f, params, vec, 132)
            assert tiles == -(-(c // vec) // tx)
            assert s_off % 4 == 0 and k_off % 4 == 0 and s_off >= 2 * c * splits
            assert fwd.workspace_bytes(p_f, params) >= 4 * (k_off + tiles)
        for params in bwd.param_space(p_b, H200):
            vec = params["vec"]
            tx = sp.tile_lanes(p_b, vec, params["tile"], params["block"])
            assert tx == min(params["tile"] // (vec * size), c // vec, params["block"])
            s, tiles, coef, cnt = bwd.layout(p_b, params, vec, 132)
            assert tiles == -(-(c // vec) // tx)
            assert coef >= 2 * c * s and cnt >= coef + 3 * c and cnt % 4 == 0
            assert bwd.workspace_bytes(p_b, params) >= 4 * (cnt + tiles)
