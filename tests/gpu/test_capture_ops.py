"""Every public op call on torch CUDA tensors, captured in a CUDA graph, replays on new data.

Each case warms the call up on a side stream, captures it, then writes fresh random values
into the captured inputs and replays: the outputs must equal the same call run eagerly on
those values. A call whose work escapes the capture (a kernel or a copy launched on CuPy's
own stream, a buffer from CuPy's pool) ran once, on the data present while capturing, and
fails here; with unchanged inputs it would pass by accident.

    PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_capture_ops.py
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA build of torch and a GPU", allow_module_level=True)
pytest.importorskip("cupy")

import dnnctl.ops as dops  # noqa: E402

pytestmark = pytest.mark.gpu
CL = torch.channels_last


def _r(*shape, dtype=torch.float32, fmt=None, positive=False):
    t = torch.randn(*shape, device="cuda", dtype=torch.float32)
    t = (t.abs() + 0.5 if positive else t).to(dtype)
    return t.contiguous(memory_format=fmt) if fmt is not None else t


def _stats(x, axes):
    mean = x.float().mean(axes)
    return mean, (x.float().var(axes, unbiased=False) + 1e-5).rsqrt()


CASES = {
    # name: (make inputs, call); inputs are refilled in place before the replay
    "batch_norm_backward NCHW fp32": (
        lambda: [_r(8, 16, 12, 12), _r(8, 16, 12, 12), _r(16), _r(16, positive=True),
                 _r(16)],
        lambda dy, x, m, s, w: dops.batch_norm_backward(dy, x, m, s, weight=w)),
    "batch_norm_backward NHWC fp16": (
        lambda: [_r(8, 12, 12, 32, dtype=torch.float16), _r(8, 12, 12, 32, dtype=torch.float16),
                 _r(32), _r(32, positive=True), _r(32)],
        lambda dy, x, m, s, w: dops.batch_norm_backward(dy, x, m, s, weight=w, layout="NHWC")),
    "layer_norm_backward, statistics recomputed": (
        lambda: [_r(64, 96), _r(64, 96), _r(96)],
        lambda dy, x, w: dops.layer_norm_backward(dy, x, w)),
    "layer_norm_backward bf16 with statistics": (
        lambda: [_r(64, 96, dtype=torch.bfloat16), _r(64, 96, dtype=torch.bfloat16),
                 _r(96, dtype=torch.bfloat16), _r(64), _r(64, positive=True)],
        lambda dy, x, w, m, s: dops.layer_norm_backward(dy, x, w, m, s)),
    "rms_norm_backward, statistics recomputed": (
        lambda: [_r(32, 128), _r(32, 128), _r(128)],
        lambda dy, x, w: dops.rms_norm_backward(dy, x, w)),
    "group_norm_backward NHWC, statistics recomputed": (
        lambda: [_r(4, 8, 8, 32), _r(4, 8, 8, 32), _r(32)],
        lambda dy, x, w: dops.group_norm_backward(dy, x, 4, w, layout="NHWC")),
    "softmax_backward last axis": (
        lambda: [_r(48, 80).softmax(-1), _r(48, 80)],
        lambda y, dy: dops.softmax_backward(y, dy)),
    "softmax_backward axis 0 (copies)": (
        lambda: [_r(48, 80).softmax(0), _r(48, 80)],
        lambda y, dy: dops.softmax_backward(y, dy, axis=0)),
    "softmax axis 0 (prepare / finish)": (
        lambda: [_r(40, 72)],
        lambda x: dops.softmax(x, axis=0)),
    "layer_norm_with_stats": (
        lambda: [_r(64, 96), _r(96), _r(96)],
        lambda x, w, b: dops.layer_norm_with_stats(x, w, b)),
    "conv2d_backward_data NHWC": (
        lambda: [_r(4, 8, 8, 16, dtype=torch.float16), _r(16, 3, 3, 32, dtype=torch.float16)],
        lambda dy, w: dops.conv2d_backward_data(dy, w, (4, 8, 8, 32), padding=1,
                                                layout="NHWC")),
    "conv2d_backward_weight NCHW, strided dy": (
        lambda: [_r(4, 16, 10, 10), _r(4, 16, 10, 20)],
        lambda x, dy: dops.conv2d_backward_weight(x, dy[..., ::2], (16, 16, 3, 3), padding=1)),
    "matmul, strided operand (copy)": (
        lambda: [_r(64, 256), _r(128, 96)],
        lambda a, b: dops.matmul(a[:, ::2], b)),
    "relu_backward": (
        lambda: [_r(4096), _r(4096)],
        lambda dy, x: dops.relu_backward(dy, x)),
    # BSHD GQA decode: decode_ring on sm_90 (split-KV partials from the call's allocator,
    # merged by the last block through counters it keeps), else decode + attn_combine
    "attention decode BSHD GQA, split KV": (
        lambda: [_r(2, 1, 8, 64, dtype=torch.float16), _r(2, 2048, 2, 64, dtype=torch.float16),
                 _r(2, 2048, 2, 64, dtype=torch.float16)],
        lambda q, k, v: dops.attention(q, k, v, layout="BSHD", return_lse=True)),
    "attention decode over a paged cache": (
        lambda: [_r(3, 8, 1, 64, dtype=torch.bfloat16), _r(39, 16, 2, 64, dtype=torch.bfloat16),
                 _r(39, 16, 2, 64, dtype=torch.bfloat16),
                 torch.randperm(39, device="cuda", dtype=torch.int32).reshape(3, 13),
                 torch.randint(1, 209, (3,), device="cuda", dtype=torch.int32)],
        lambda q, k, v, table, used: dops.attention(q, k, v, block_table=table,
                                                    seqused_k=used, causal="bottom_right")),
    # the torch op a patched model's SDPA runs (the default variant, a vendor wrapper on
    # sm_90 included, adopting its outputs)
    "torch.ops.dnnctl.attention GQA causal": (
        lambda: [_r(2, 8, 300, 64, dtype=torch.float16), _r(2, 2, 300, 64, dtype=torch.float16),
                 _r(2, 2, 300, 64, dtype=torch.float16)],
        lambda q, k, v: _torch_ops().attention(q, k, v, True, None, True)),
    "torch.ops.dnnctl.attention decode": (
        lambda: [_r(4, 32, 1, 128, dtype=torch.bfloat16),
                 _r(4, 8, 2048, 128, dtype=torch.bfloat16),
                 _r(4, 8, 2048, 128, dtype=torch.bfloat16)],
        lambda q, k, v: _torch_ops().attention(q, k, v, False, None, True)),
}


def _torch_ops():
    import dnnctl.torch  # noqa: F401  (registers torch.ops.dnnctl)

    return torch.ops.dnnctl


def _flat(out):
    return [o for o in (out if isinstance(out, tuple) else (out,)) if o is not None]


@pytest.mark.parametrize("name", list(CASES))
def test_captured_call_replays_on_new_inputs(name):
    make, fn = CASES[name]
    torch.manual_seed(0)
    static = make()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: signatures, plans, kernels built
        for _ in range(2):
            fn(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _flat(fn(*static))
    for rnd in range(2):  # new values in the captured inputs, then a replay
        for t, new in zip(static, make()):
            t.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        want = _flat(fn(*static))
        assert len(want) == len(captured)
        for i, (got, ref) in enumerate(zip(captured, want)):
            where = f"{name}, replay {rnd}, output {i}"
            torch.testing.assert_close(got, ref, msg=lambda m, w=where: f"{w}: {m}")
