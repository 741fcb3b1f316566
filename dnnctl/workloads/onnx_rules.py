"""One rule per ONNX op type dnnctl implements: the node (and what it fuses) -> problems."""

from __future__ import annotations

import math
from typing import Any

from dnnctl.workloads.onnx_nodes import CONV_ACTS, GEMM_ACTS, Graph, Mapped, Rule


def _prod(xs: Any) -> int:
    return int(math.prod(int(x) for x in xs))


def _nhwc(shape: tuple[int, ...], layout: str) -> list[int]:
    if layout == "NHWC" and len(shape) == 4:
        return [shape[0], shape[2], shape[3], shape[1]]
    return list(shape)


def _fuse_activation(g: Graph, out: str, fused: list[str], allowed: frozenset[str]
                     ) -> tuple[str, str]:
    """Fold an activation reading ``out`` (its only reader) into the producer's epilogue."""
    act = g.activation_at(out)
    if act is None or act[0] not in allowed:
        return "none", out
    g.consume(*act[1])
    fused.append(f"{act[0]} -> epilogue")
    return act[0], act[2]


def conv(g: Graph, node: Any, dtype: str, layout: str) -> Mapped | str:
    x, w = g.shape(node.input[0], node), g.shape(node.input[1], node)
    if len(x) != 4:
        return f"only 2-D convolutions map to conv2d (this one has a {len(x)}-D input)"
    n, c, h, wd = x
    k, r, s = w[0], w[2], w[3]
    stride = list(g.attr(node, "strides", [1, 1]))
    dil = list(g.attr(node, "dilations", [1, 1]))
    pads = _pads(g, node, (h, wd), (r, s), stride, dil)
    bias = len(node.input) > 2 and node.input[2] != ""
    fused: list[str] = []
    out = node.output[0]
    bn = g.only_consumer(out)
    # ORT's ConvBNFusion / TensorRT: a BatchNormalization with constant statistics that is
    # the conv's only reader becomes the conv's weights and bias
    if bn is not None and bn.op_type == "BatchNormalization" and all(
            g.const(i) is not None for i in bn.input[1:5]) and len(bn.output) == 1:
        g.consume(bn)
        bias, out = True, bn.output[0]
        fused.append("BatchNormalization -> Conv")
    act, out = _fuse_activation(g, out, fused, CONV_ACTS)
    residual = False
    add = g.only_consumer(out)
    if add is not None and add.op_type == "Add" and len(add.input) == 2:
        other = add.input[1] if add.input[0] == out else add.input[0]
        if g.const(other) is None and g.shapes.get(other) == g.shapes.get(out):
            g.consume(add)
            residual = True
            fused.append("Add -> Conv residual")
    return Mapped([("conv2d", {
        "n": n, "c": c, "h": h, "w": wd, "k": k, "r": r, "s": s, "stride": stride,
        "pad": pads, "dilation": dil, "groups": int(g.attr(node, "group", 1)),
        "dtype": dtype, "layout": layout, "bias": bias, "activation": act,
        "residual": residual})], fused)


def _pads(g: Graph, node: Any, size: tuple[int, int], kernel: tuple[int, int],
          stride: list[int], dil: list[int]) -> list[int]:
    """dnnctl's [top, bottom, left, right] from ONNX pads / auto_pad."""
    auto = g.attr(node, "auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for i in range(2):
            total = max((math.ceil(size[i] / stride[i]) - 1) * stride[i]
                        + (kernel[i] - 1) * dil[i] + 1 - size[i], 0)
            small = total // 2
            out += [small, total - small] if auto == "SAME_UPPER" else [total - small, small]
        return out
    if auto == "VALID":
        return [0, 0, 0, 0]
    p = list(g.attr(node, "pads", [0, 0, 0, 0]))  # [top, left, bottom, right]
    return [p[0], p[2], p[1], p[3]]


def matmul(g: Graph, node: Any, dtype: str, layout: str) -> Mapped | str:
    a, b = g.shape(node.input[0], node), g.shape(node.input[1], node)
    if len(a) < 2 or len(b) < 2:
        return "a matrix-vector product (1-D operand) is not a matmul problem"
    fused: list[str] = []
    key: dict[str, Any] = {"m": 0, "n": b[-1], "k": a[-1], "dtype": dtype}
    if len(b) == 2:  # activations x weights: every leading dim is a row
        key["m"] = _prod(a[:-1])
        out, bias = node.output[0], False
        add = g.only_consumer(out)
        if add is not None and add.op_type == "Add":
            other = add.input[1] if add.input[0] == out else add.input[0]
            const = g.const(other)
            if const is not None and const.size == b[-1]:
                g.consume(add)
                out, bias = add.output[0], True
                fused.append("Add -> MatMul bias")
        key["bias"] = bias
        key["activation"], _ = _fuse_activation(g, out, fused, GEMM_ACTS)
        return Mapped([("matmul", key)], fused)
    batch = _broadcast(a[:-2], b[:-2])
    if batch is None:
        return f"batch dimensions {a[:-2]} and {b[:-2]} do not broadcast"
    key.update(batch=_prod(batch), m=a[-2])
    tr = g.producer.get(node.input[1])
    perm = list(g.attr(tr, "perm", [])) if tr is not None and tr.op_type == "Transpose" \
        else []
    if perm and perm[:-2] == list(range(len(perm) - 2)) and perm[-2:] == [
            len(perm) - 1, len(perm) - 2] and g.only_consumer(tr.output[0]) is node:
        g.consume(tr)  # Kᵀ: the matmul reads K transposed instead of a copy
        key["trans_b"] = True
        fused.append("Transpose -> MatMul trans_b")
    return Mapped([("matmul", key)], fused, attention=int(_is_attention(g, node)))


def _broadcast(x: tuple[int, ...], y: tuple[int, ...]) -> tuple[int, ...] | None:
    out = []
    for i in range(1, max(len(x), len(y)) + 1):
        p = x[-i] if i <= len(x) else 1
        q = y[-i] if i <= len(y) else 1
        if p != q and 1 not in (p, q):
            return None
        out.append(max(p, q))
    return tuple(reversed(out))


def _is_attention(g: Graph, node: Any) -> bool:
    """Q·Kᵀ -> [scale] -> [mask add] -> Softmax -> ·V, starting at ``node``."""
    cur = g.only_consumer(node.output[0])
    for optional in ("Div", "Mul", "Add"):
        if cur is not None and cur.op_type == optional:
            cur = g.only_consumer(cur.output[0])
    if cur is None or cur.op_type != "Softmax":
        return False
    pv = g.only_consumer(cur.output[0])
    return pv is not None and pv.op_type == "MatMul" and pv.input[0] == cur.output[0]


def gemm(g: Graph, node: Any, dtype: str, layout: str) -> Mapped | str:
    a, b = g.shape(node.input[0], node), g.shape(node.input[1], node)
    ta, tb = bool(g.attr(node, "transA", 0)), bool(g.attr(node, "transB", 0))
    m, k = (a[1], a[0]) if ta else (a[0], a[1])
    n = b[0] if tb else b[1]
    bias = len(node.input) > 2 and node.input[2] != ""
    if bias and _prod(g.shape(node.input[2], node)) != n:
        return "Gemm with a full C matrix (not a bias vector) has no matmul problem"
    fused: list[str] = []
    act, _ = _fuse_activation(g, node.output[0], fused, GEMM_ACTS)
    return Mapped([("matmul", {"m": m, "n": n, "k": k, "dtype": dtype, "trans_a": ta,
                               "trans_b": tb, "bias": bias, "activation": act})], fused)


def softmax(g: Graph, node: Any, dtype: str, layout: str) -> Mapped | str:
    x = g.shape(node.input[0], node)
    axis = int(g.attr(node, "axis", -1 if g.opset >= 13 else 1)) % len(x)
    cols = _prod(x[axis:]) if g.opset < 13 else x[axis]
    return Mapped([("softmax", {"rows": _prod(x) // cols, "cols": cols, "dtype": dtype,
                                "log": node.op_type == "LogSoftmax"})])


def _norm(op: str) -> Rule:
    def rule(g: Graph, node: Any, dtype: str, layout: str) -> Mapped | str:
        x = g.shape(node.input[0], node)
        axis = int(g.attr(node, "axis", -1)) % len(x)
        cols = _prod(x[axis:])
        key = {"rows": _prod(x) // cols, "cols": cols, "dtype": dtype}
        if op == "layer_norm":
            key["bias"] = len(node.input) > 2 and node.input[2] != ""
        return Mapped([(op, key)])
    return rule


def _nchw(x: tuple[int, ...]) -> tuple[int, int, int, int] | None:
    if len(x) == 4:
        return x[0], x[1], x[2], x[3]
    if len(x) == 3:
        return x[0], x[1], x[2], 1
    if len(x) == 2:
        return x[0], x[1], 1, 1
    return None


def batch_norm(g: Graph, node: Any, dtype: str, layout: str) -> Mapped | str:
    dims = _nchw(g.shape(node.input[0], node))
    if dims is None:
        return "BatchNormalization of a tensor with more than 4 dimensions"
    n, c, h, w = dims
    return Mapped([("batch_norm", {"n": n, "c": c, "h": h, "w": w, "dtype": dtype,
                                   "layout": layout,
                                   "training": bool(g.attr(node, "training_mode", 0))})])


def group_norm(g: Graph, node: Any, dtype: str, layout: str) -> Mapped | str:
    dims = _nchw(g.shape(node.input[0], node))
    if dims is None:
        return f"{node.op_type} of a tensor with more than 4 dimensions"
    n, c, h, w = dims
    groups = c if node.op_type == "InstanceNormalization" else int(
        g.attr(node, "num_groups", 1))
    return Mapped([("group_norm", {"n": n, "c": c, "h": h, "w": w, "groups": groups,
                                   "dtype": dtype, "layout": layout})])


def pool(g: Graph, node: Any, dtype: str, layout: str) -> Mapped | str:
    x = g.shape(node.input[0], node)
    if len(x) != 4:
        return f"only 2-D pooling maps to pool2d (this one has a {len(x)}-D input)"
    kernel = list(g.attr(node, "kernel_shape"))
    stride = list(g.attr(node, "strides", [1, 1]))
    dil = list(g.attr(node, "dilations", [1, 1]))
    p = _pads(g, node, (x[2], x[3]), (kernel[0], kernel[1]), stride, dil)
    if p[0] != p[1] or p[2] != p[3]:
        return f"asymmetric padding {p} (pool2d pads both sides alike)"
    key = {"n": x[0], "c": x[1], "h": x[2], "w": x[3],
           "mode": "max" if node.op_type == "MaxPool" else "avg", "kernel": kernel,
           "stride": stride, "pad": [p[0], p[2]], "dtype": dtype, "layout": layout,
           "ceil_mode": bool(g.attr(node, "ceil_mode", 0))}
    if node.op_type == "MaxPool":
        key["dilation"] = dil
    else:
        key["count_include_pad"] = bool(g.attr(node, "count_include_pad", 0))
    return Mapped([("pool2d", key)])


def global_pool(g: Graph, node: Any, dtype: str, layout: str) -> Mapped | str:
    x = g.shape(node.input[0], node)
    if len(x) != 4:
        return f"only 2-D global pooling maps to global_avg_pool2d ({len(x)}-D input)"
    return Mapped([("global_avg_pool2d", {"n": x[0], "c": x[1], "h": x[2], "w": x[3],
                                          "dtype": dtype, "layout": layout})])


def activation(g: Graph, node: Any, dtype: str, layout: str) -> Mapped | str:
    found = g.pattern(node)
    if found is None:
        return "not an activation pattern dnnctl knows"
    fn, nodes, x, _ = found
    g.consume(*nodes)
    return Mapped([("activation", {"fn": fn, "shape": _nhwc(g.shape(x, node), layout),
                                   "dtype": dtype})],
                  [f"{fn} ({len(nodes)} nodes)"] if len(nodes) > 1 else [])


def attention(g: Graph, node: Any, dtype: str, layout: str) -> Mapped | str:
    """ONNX Attention (opset 23): Q·Kᵀ, softmax, ·V over (batch, heads, seq, head_dim)."""
    q, k, v = (g.shape(node.input[i], node) for i in range(3))
    if len(q) == 4:
        b, hq, sq, d = q
        skv, dv = k[2], v[3]
    else:
        hq = int(g.attr(node, "q_num_heads", 0))
        hkv = int(g.attr(node, "kv_num_heads", 0))
        if not hq or not hkv:
            return "3-D Attention without q_num_heads / kv_num_heads"
        b, sq, d = q[0], q[1], q[2] // hq
        skv, dv = k[1], v[2] // hkv
    return Mapped([
        ("matmul", {"batch": b * hq, "m": sq, "n": skv, "k": d, "dtype": dtype,
                    "trans_b": True}),
        ("softmax", {"rows": b * hq * sq, "cols": skv, "dtype": dtype}),
        ("matmul", {"batch": b * hq, "m": sq, "n": dv, "k": skv, "dtype": dtype})],
        attention=1)


NODE_RULES: dict[str, Rule] = {
    "Conv": conv, "MatMul": matmul, "Gemm": gemm, "Softmax": softmax, "LogSoftmax": softmax,
    "LayerNormalization": _norm("layer_norm"), "RMSNormalization": _norm("rms_norm"),
    "BatchNormalization": batch_norm, "GroupNormalization": group_norm,
    "InstanceNormalization": group_norm, "MaxPool": pool, "AveragePool": pool,
    "GlobalAveragePool": global_pool, "Attention": attention,
    **{op: activation for op in ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "Gelu", "HardSwish",
                                 "HardSigmoid", "Clip")},
}
# heads of multi-node activation patterns (x/√2 -> Erf ... is GELU): mapped when they match
PATTERN_HEADS = frozenset({"Div", "Mul"})
