"""Workloads from ONNX models (extra ``dnnctl[onnx]``).

The graph's symbolic dimensions are bound (``--batch``, ``--dim name=value``), ONNX shape
inference gives every tensor its shape, and each node dnnctl implements becomes a problem
with its count. Fusions follow what an inference runtime does to the graph before it runs
it (ONNX Runtime's basic/extended fusions, TensorRT's layer fusion): BatchNormalization
after a Conv is folded into the conv's weights and bias; a Relu/Gelu/SiLU that is the only
consumer of a Conv, Gemm or MatMul(+bias) output becomes that problem's epilogue; an Add of
a Conv output and another tensor is the conv's residual input. Nodes dnnctl has no kernel
for are listed with their counts, never dropped silently.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dnnctl.errors import InputFileError, UsageError
from dnnctl.workloads.model import Workload
from dnnctl.workloads.onnx_nodes import SAME_SHAPE, Graph, Mapped
from dnnctl.workloads.onnx_rules import NODE_RULES, PATTERN_HEADS, activation

# view/metadata nodes: no data moved or only a copy a runtime elides; counted, not problems
VIEW_OPS = frozenset({"Constant", "ConstantOfShape", "Shape", "Reshape", "Flatten", "Squeeze",
                      "Unsqueeze", "Identity", "Dropout", "Cast", "Gather", "Slice",
                      "Range", "Expand"})
DTYPE_NAMES = {"fp16": "float16", "half": "float16", "float16": "float16",
               "bf16": "bfloat16", "bfloat16": "bfloat16",
               "fp32": "float32", "float": "float32", "float32": "float32"}


@dataclass
class OnnxImport:
    """A workload read from an ONNX model and what could not become a problem."""

    workload: Workload
    model: str
    nodes: int = 0
    mapped: Counter[str] = field(default_factory=Counter)  # ONNX op type -> nodes used
    fused: Counter[str] = field(default_factory=Counter)  # what was folded into what
    unimplemented: Counter[str] = field(default_factory=Counter)  # op type -> nodes
    skipped: dict[str, str] = field(default_factory=dict)  # op type -> why (first reason)
    views: Counter[str] = field(default_factory=Counter)
    attention: int = 0  # Q·Kᵀ -> softmax -> ·V patterns found
    dims: dict[str, int] = field(default_factory=dict)  # symbolic dims bound

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "dnnctl-onnx-import/1", "model": self.model,
                "workload": self.workload.name, "nodes": self.nodes,
                "problems": len(self.workload.items),
                "calls": self.workload.total_calls(), "mapped": dict(self.mapped),
                "fused": dict(self.fused), "unimplemented": dict(self.unimplemented),
                "skipped": dict(self.skipped), "views": dict(self.views),
                "attention_patterns": self.attention, "dims": dict(self.dims)}


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise UsageError("reading ONNX models needs the 'onnx' package",
                         hint="pip install 'dnnctl[onnx]'") from None
    return onnx


def parse_dims(items: list[str] | tuple[str, ...] | None) -> dict[str, int]:
    """``["seq=128", "batch=8"]`` -> ``{"seq": 128, "batch": 8}``."""
    out: dict[str, int] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--dim {item!r} is not name=value", hint="e.g. --dim seq=128")
        try:
            out[name.strip()] = int(value)
        except ValueError:
            raise UsageError(f"--dim {item!r}: {value!r} is not an integer") from None
        if out[name.strip()] < 1:
            raise UsageError(f"--dim {item!r} must be >= 1")
    return out


def workload_from_onnx(path: str | os.PathLike[str], *, batch: int | None = None,
                       dtype: str | None = None, dims: dict[str, int] | None = None,
                       layout: str = "NCHW", name: str | None = None) -> OnnxImport:
    """Read an ONNX model and return the problems one inference step runs.

    ``batch`` sets the first dimension of every graph input; ``dims`` binds symbolic
    dimensions by name; ``dtype`` overrides the model's float type; ``layout`` NHWC turns
    the model's NCHW convolutions and pools into NHWC problems.
    """
    onnx = _onnx()
    path = str(path)
    if layout not in ("NCHW", "NHWC"):
        raise UsageError(f"--layout {layout!r} must be NCHW or NHWC")
    if dtype is not None and dtype.lower() not in DTYPE_NAMES:
        raise UsageError(f"--dtype {dtype!r} is not a float type dnnctl runs",
                         hint="float16 (fp16), bfloat16 (bf16) or float32 (fp32)")
    try:
        model = onnx.load(path)
    except FileNotFoundError:
        raise InputFileError(path, "no such file") from None
    except Exception as exc:  # protobuf decode errors have no common base class
        raise InputFileError(path, f"not a readable ONNX model ({type(exc).__name__}: {exc})",
                             hint="export it with torch.onnx.export or check the file") from None
    if not model.graph.node and not model.graph.input and not model.ir_version:
        # protobuf parses an empty (or all-default) file as a model with nothing in it
        raise InputFileError(path, "not an ONNX model (it holds no graph)",
                             hint="export it with torch.onnx.export or check the file")
    bound = _bind_inputs(model, path, batch, dict(dims or {}))
    model = _infer_shapes(onnx, model, path)
    graph = Graph(model.graph, onnx, opset=_opset(model))
    out_dtype = DTYPE_NAMES[dtype.lower()] if dtype else graph.float_dtype()
    result = OnnxImport(Workload(name or os.path.splitext(os.path.basename(path))[0]), path,
                        nodes=len(model.graph.node), dims=bound)
    for node in model.graph.node:
        if graph.is_consumed(node):
            continue
        rule = NODE_RULES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if rule is None and node.op_type in PATTERN_HEADS and graph.pattern(node):
            rule = activation  # the first node of x/√2 -> Erf -> ... (GELU)
        if rule is None:
            (result.views if node.op_type in VIEW_OPS else result.unimplemented)[
                node.op_type] += 1
            continue
        mapped: Mapped | str = rule(graph, node, out_dtype, layout)
        if isinstance(mapped, str):  # the op exists, this node's form does not
            result.unimplemented[node.op_type] += 1
            result.skipped.setdefault(node.op_type, mapped)
            continue
        for op, key in mapped.problems:
            result.workload.add(op, key)
        result.mapped[node.op_type] += 1
        for what in mapped.fused:
            result.fused[what] += 1
        result.attention += mapped.attention
    return result


def _infer_shapes(onnx: Any, model: Any, path: str) -> Any:
    """ONNX shape inference; where it leaves a shape-preserving node's output untyped (it
    does for some function ops), the input's type is copied and inference runs again."""
    for _ in range(64):
        try:
            model = onnx.shape_inference.infer_shapes(model, strict_mode=False,
                                                      data_prop=True)
        except Exception as exc:  # inference errors are onnx's own exception types
            raise InputFileError(path, f"ONNX shape inference failed: {exc}",
                                 hint="check the model with onnx.checker.check_model"
                                 ) from None
        g = model.graph
        typed = {vi.name: vi for vi in (*g.input, *g.value_info, *g.output)
                 if vi.type.tensor_type.HasField("shape")}
        gaps = [(n.output[0], typed[n.input[0]]) for n in g.node
                if n.op_type in SAME_SHAPE and n.input and n.input[0] in typed
                and n.output[0] not in typed]
        if not gaps:
            return model
        for name, like in gaps:
            vi = g.value_info.add()
            vi.CopyFrom(like)
            vi.name = name
    return model


def _opset(model: Any) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 13


def _bind_inputs(model: Any, path: str, batch: int | None, dims: dict[str, int]
                 ) -> dict[str, int]:
    """Give every graph input fixed dimensions, or say which names need a value."""
    inits = {i.name for i in model.graph.initializer}
    missing: dict[str, str] = {}
    bound: dict[str, int] = {}
    used: set[str] = set()
    for inp in model.graph.input:
        if inp.name in inits or not inp.type.HasField("tensor_type"):
            continue
        for axis, dim in enumerate(inp.type.tensor_type.shape.dim):
            if axis == 0 and batch is not None:
                if dim.HasField("dim_param"):
                    bound[dim.dim_param] = batch
                    used.add(dim.dim_param)
                dim.dim_value = batch
                continue
            if dim.HasField("dim_value") and dim.dim_value > 0:
                continue
            label = dim.dim_param if dim.HasField("dim_param") else ""
            if label and label in dims:
                dim.dim_value = dims[label]
                bound[label] = dims[label]
                used.add(label)
            else:
                missing.setdefault(label or f"{inp.name}[{axis}]", f"input {inp.name!r} axis {axis}")
    if missing:
        names = ", ".join(f"{k} ({v})" for k, v in missing.items())
        example = " ".join(f"--dim {k}=VALUE" for k in missing if "[" not in k)
        raise UsageError(f"{path}: symbolic dimension(s) need a value: {names}",
                         hint=("give them, e.g. " + example + (" (or --batch N for axis 0)"
                               if any("axis 0" in v for v in missing.values()) else ""))
                         if example else "give --batch N for axis 0")
    unknown = sorted(set(dims) - used)
    if unknown:
        raise UsageError(f"--dim {', '.join(unknown)}: no input of {path} has such a "
                         "symbolic dimension",
                         hint="the model's symbolic dimensions: "
                              + (", ".join(sorted(_symbols(model))) or "none"))
    return bound


def _symbols(model: Any) -> set[str]:
    return {d.dim_param for i in model.graph.input if i.type.HasField("tensor_type")
            for d in i.type.tensor_type.shape.dim if d.HasField("dim_param")}
