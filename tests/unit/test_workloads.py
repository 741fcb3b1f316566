"""Bundled workloads (built from the real architectures) and dnnctl-workload/1 files."""

from __future__ import annotations

from collections import Counter

import pytest

from dnnctl.errors import InputFileError, UsageError
from dnnctl.workloads import (
    BUNDLED,
    Workload,
    build,
    default_workload,
    parse_kv,
    read_workload,
    resolve,
    write_workload,
)


def calls(wl: Workload, op: str) -> int:
    return sum(it.count for it in wl.items if it.problem.op == op)


def find(wl: Workload, op: str, **key) -> int:
    """The count of the one problem of ``op`` whose key has these values."""
    hits = [it for it in wl.items if it.problem.op == op and all(
        it.problem[k] == (tuple(v) if isinstance(v, list) else v) for k, v in key.items())]
    assert len(hits) == 1, (op, key, [h.problem.short() for h in hits])
    return hits[0].count


def test_resnet50_layers():
    wl = build("resnet50", batch=32)
    assert calls(wl, "conv2d") == 53  # 1 stem + 16 bottlenecks x 3 + 4 projections
    assert len([it for it in wl.items if it.problem.op == "conv2d"]) == 24
    assert find(wl, "conv2d", c=3, k=64, r=7, stride=[2, 2], pad=[3, 3], h=224) == 1
    assert find(wl, "conv2d", c=64, k=64, r=3, h=56, activation="relu") == 3
    assert find(wl, "conv2d", c=128, k=128, r=3, h=56, stride=[2, 2]) == 1  # v1.5 stride
    assert find(wl, "conv2d", c=256, k=1024, r=1, h=14, residual=True) == 6
    assert find(wl, "conv2d", c=1024, k=2048, r=1, h=14, stride=[2, 2]) == 1  # projection
    assert calls(wl, "activation") == 16  # ReLU after each residual add
    assert find(wl, "pool2d", h=112, kernel=[3, 3], stride=[2, 2], mode="max") == 1
    assert find(wl, "global_avg_pool2d", c=2048, h=7) == 1
    assert find(wl, "matmul", m=32, n=1000, k=2048, bias=True) == 1
    assert all(it.problem["dtype"] == "float16" for it in wl.items)
    assert build("resnet50", batch=1, dtype="float32", layout="NCHW").items[0].problem[
        "layout"] == "NCHW"


def test_mobilenet_v2_layers():
    wl = build("mobilenet_v2", batch=8)
    depthwise = [it for it in wl.items if it.problem.op == "conv2d"
                 and it.problem["groups"] == it.problem["c"] > 1]
    assert sum(it.count for it in depthwise) == 17  # one per inverted residual block
    assert find(wl, "conv2d", c=960, k=960, groups=960, h=7) == 3  # 160-block x2, 320-block
    assert find(wl, "conv2d", c=144, k=144, groups=144, h=56, stride=[2, 2]) == 1
    assert find(wl, "conv2d", c=192, k=32, h=28, residual=True) == 2
    assert find(wl, "conv2d", c=320, k=1280, r=1, h=7) == 1
    assert calls(wl, "conv2d") == 52


def test_transformers():
    bert = build("bert_base", batch=8, seq=128)
    m = 8 * 128
    assert find(bert, "matmul", m=m, n=768, k=768, bias=True) == 48  # q, k, v, out x 12
    assert find(bert, "matmul", m=m, n=3072, k=768, activation="gelu") == 12
    assert find(bert, "matmul", batch=96, m=128, n=128, k=64, trans_b=True) == 12
    assert find(bert, "softmax", rows=96 * 128, cols=128) == 12
    assert calls(bert, "layer_norm") == 25
    vit = build("vit_b16", batch=4)
    assert find(vit, "conv2d", r=16, stride=[16, 16], k=768) == 1
    assert find(vit, "attention", batch=4, heads_q=12, seq_q=197, head_dim=64,
                causal="none") == 12
    assert calls(vit, "softmax") == 0
    unfused = build("vit_b16", batch=4, attention="unfused")
    assert find(unfused, "softmax", rows=4 * 12 * 197, cols=197) == 12
    assert find(vit, "matmul", m=4 * 197, n=2304, k=768) == 12
    llama = build("llama7b_layer", seq=256)
    assert find(llama, "matmul", m=256, n=11008, k=4096, activation="silu") == 1
    assert find(llama, "matmul", m=256, n=4096, k=4096, bias=False) == 4
    assert find(llama, "attention", heads_q=32, seq_q=256, head_dim=128,
                causal="top_left") == 1
    assert find(build("llama7b_layer", seq=256, attention="unfused"), "matmul", batch=32,
                m=256, n=256, k=128, trans_b=True) == 1
    assert find(build("llama7b_layer", dtype="float32"), "softmax", cols=512) == 1
    assert calls(llama, "rms_norm") == 2


def test_every_bundled_workload_builds_with_defaults():
    for name in BUNDLED:
        wl = build(name)
        assert wl.items and len(set(wl.problems)) == len(wl.items)
    small = default_workload("numpy")
    assert len(small.ops()) >= 6 and all(it.problem["dtype"] == "float32" for it in small.items)
    gpu = default_workload("cupy")
    assert all(it.problem["dtype"] == "float16" for it in gpu.items)


def test_resolve_and_options():
    assert resolve("bert_base:batch=2,seq=64").items[0].problem["rows"] == 128
    assert resolve("bert_base", seq=32, batch=1).items[0].problem["rows"] == 32
    with pytest.raises(UsageError, match="has no option 'seq'"):
        resolve("resnet50:seq=3")
    with pytest.raises(UsageError, match="must be an integer"):
        build("resnet50", batch="many")
    with pytest.raises(UsageError, match="unknown workload"):
        build("gpt5")
    assert parse_kv("shape=8,128,768,fn=gelu") == {"shape": "8,128,768", "fn": "gelu"}


def test_file_round_trip_and_only_ops(tmp_path):
    wl = build("resnet50", batch=2)
    path = tmp_path / "rn.yaml"
    write_workload(wl, path)
    back = read_workload(path)
    assert back.name == "resnet50" and back.items == wl.items
    assert resolve(str(path)).items == wl.items
    assert Counter(it.problem.op for it in back.only_ops(["conv2d"]).items) == {"conv2d": 24}
    with pytest.raises(UsageError, match="unknown op"):
        back.only_ops(["convolution"])


@pytest.mark.parametrize("text,words", [
    ("schema: dnnctl-workload/2\nproblems: []\n", "unsupported schema"),
    ("schema: dnnctl-workload/1\nproblems:\n  - {op: conv3d, key: {}}\n", "problem 0"),
    ("schema: dnnctl-workload/1\nproblems:\n  - {op: matmul, key: {m: 1, n: 1}}\n",
     "'k' is missing"),
    ("schema: dnnctl-workload/1\nproblems:\n  - {op: matmul, key: {m: 1, n: 1, k: 1, "
     "dtype: float32}, count: 0}\n", "count must be"),
    ("schema: dnnctl-workload/1\nproblems:\n  - !!python/name:os.system {}\n", "tag"),
    ("schema: dnnctl-workload/1\nextra: 1\nproblems: []\n", "unknown field 'extra'"),
])
def test_bad_workload_files(tmp_path, text, words):
    path = tmp_path / "w.yaml"
    path.write_text(text)
    with pytest.raises(InputFileError) as info:
        read_workload(path)
    assert str(info.value).startswith(str(path)) and words in str(info.value)


def test_mobilenet_v2_runs_relu6_in_the_conv_epilogues():
    """The keys a patched torch MobileNetV2 sends (conv + BN + ReLU6 fused): the projection
    1x1 convs have none, every other conv relu6."""
    wl = build("mobilenet_v2", batch=8)
    acts = {}
    for it in wl.items:
        if it.problem.op == "conv2d":
            acts[it.problem["activation"]] = acts.get(it.problem["activation"], 0) + it.count
    assert acts == {"relu6": 35, "none": 17}
