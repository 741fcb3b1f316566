"""ONNX models built in code -> workloads: shapes, attributes, fusions, counts, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("onnx")

from _onnx_models import resnet_like, unet_like, vit_like  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from dnnctl.cli.app import app  # noqa: E402
from dnnctl.errors import InputFileError, UsageError  # noqa: E402
from dnnctl.workloads import read_workload  # noqa: E402
from dnnctl.workloads.onnx import workload_from_onnx  # noqa: E402


def problems(result, op):
    return [(it.problem.as_dict(), it.count) for it in result.workload.items
            if it.problem.op == op]


def test_resnet_like_folds_bn_and_relu_into_convs_and_keeps_the_post_add_relu(tmp_path):
    res = workload_from_onnx(resnet_like(tmp_path / "r.onnx"), batch=4)
    convs = problems(res, "conv2d")
    stem = next(k for k, _ in convs if k["r"] == 7)
    assert (stem["n"], stem["c"], stem["h"], stem["k"], stem["stride"], stem["pad"]) == (
        4, 3, 32, 16, [2, 2], [3, 3])
    assert stem["bias"] and stem["activation"] == "relu"
    assert sum(c for _, c in convs) == 8 and res.fused["BatchNormalization -> Conv"] == 8
    # the last 1x1 of each bottleneck adds the shortcut; ReLU comes after the add
    expand = [(k, c) for k, c in convs if k["residual"]]
    assert [(k["c"], k["k"], k["activation"], c) for k, c in expand] == [(8, 32, "none", 2)]
    assert problems(res, "activation") == [({"bias": "none", "dtype": "float32", "fn": "relu",
                                             "inplace": False, "layout": "NCHW",
                                             "shape": [4, 32, 8, 8]}, 2)]
    (pool, _), = problems(res, "pool2d")
    assert (pool["mode"], pool["kernel"], pool["stride"], pool["pad"]) == (
        "max", [3, 3], [2, 2], [1, 1])
    (gemm, _), = problems(res, "matmul")
    assert (gemm["m"], gemm["n"], gemm["k"], gemm["trans_b"], gemm["bias"]) == (
        4, 10, 32, True, True)
    assert problems(res, "global_avg_pool2d")[0][0]["h"] == 8
    assert not res.unimplemented and res.views == {"Flatten": 1}
    assert res.dims == {"N": 4}


def test_vit_like_maps_attention_mlp_and_lists_what_dnnctl_does_not_run(tmp_path):
    res = workload_from_onnx(vit_like(tmp_path / "v.onnx"), dims={"seq": 17}, dtype="fp16")
    mm = {(k["batch"], k["m"], k["n"], k["k"], k["bias"], k["activation"]): c
          for k, c in problems(res, "matmul")}
    assert mm == {(1, 34, 32, 32, True, "none"): 4,  # q, k, v, out projection
                  (8, 17, 17, 8, False, "none"): 1,  # Q·Kᵀ over batch x heads
                  (8, 17, 8, 17, False, "none"): 1,  # P·V
                  (1, 34, 128, 32, True, "gelu"): 1,  # MLP up, erf-GELU fused
                  (1, 34, 32, 128, True, "none"): 1}
    assert problems(res, "softmax") == [({"cols": 17, "dtype": "float16", "log": False,
                                          "rows": 136}, 1)]
    assert problems(res, "layer_norm")[0][0]["rows"] == 34 and \
        problems(res, "layer_norm")[0][1] == 2
    assert res.attention == 1
    assert res.unimplemented == {"Transpose": 4, "Add": 2, "Div": 1}
    assert all(it.problem.as_dict()["dtype"] == "float16" for it in res.workload.items)


def test_unet_like_group_norm_silu_and_unimplemented_upsampling(tmp_path):
    res = workload_from_onnx(unet_like(tmp_path / "u.onnx", batch=2), layout="NHWC")
    gn = problems(res, "group_norm")
    assert [(k["h"], k["groups"], k["layout"], c) for k, c in gn] == [
        (16, 4, "NHWC", 2), (8, 4, "NHWC", 2)]
    silu = problems(res, "activation")
    assert [(k["fn"], k["shape"], c) for k, c in silu] == [
        ("silu", [2, 16, 16, 16], 2), ("silu", [2, 8, 8, 16], 2)]
    down = [k for k, _ in problems(res, "conv2d") if k["stride"] == [2, 2]]
    assert len(down) == 1 and down[0]["h"] == 16 and down[0]["layout"] == "NHWC"
    assert sum(k["residual"] for k, _ in problems(res, "conv2d")) == 2
    assert res.unimplemented == {"ConvTranspose": 1, "Concat": 1}


def test_unbound_symbolic_dimension_is_a_clear_error(tmp_path):
    path = vit_like(tmp_path / "v.onnx")
    with pytest.raises(UsageError) as err:
        workload_from_onnx(path)
    assert "seq (input 'x' axis 1)" in err.value.message and "--dim seq=" in err.value.hint
    with pytest.raises(UsageError, match="no input .* has such a symbolic dimension"):
        workload_from_onnx(path, dims={"seq": 8, "tokens": 3})


def test_a_file_that_is_not_onnx_names_the_file(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\xffnot a protobuf" * 10)
    with pytest.raises(InputFileError, match="bad.onnx"):
        workload_from_onnx(bad)


def test_cli_writes_a_workload_tune_reads_and_the_summary_fits_80_columns(tmp_path):
    model = resnet_like(tmp_path / "r.onnx")
    out = tmp_path / "r.yaml"
    res = CliRunner().invoke(app, ["workload", "from-onnx", str(model), "--batch", "2",
                                   "-o", str(out)], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "conv2d" in res.output and "wrote" in res.output
    assert max(len(line) for line in res.output.splitlines()) <= 80
    wl = read_workload(out)
    assert wl.total_calls() == 13 and {p.op for p in wl.problems} >= {"conv2d", "pool2d"}
    res = CliRunner().invoke(app, ["workload", "from-onnx", str(vit_like(tmp_path / "v.onnx")),
                                   "--json", "-o", str(tmp_path / "v.yaml")])
    assert res.exit_code == 2
    assert json.loads(res.output)["error"]["code"] == "usage"


def test_nodes_with_no_dnnctl_problem_are_counted(tmp_path):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 4, 3, 3, 3), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 6),
         helper.make_node("Resize", ["y", "", "scales"], ["z"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [w, numpy_helper.from_array(np.array([1, 1, 2, 2, 2], np.float32), "scales")])
    path = tmp_path / "c3d.onnx"
    import onnx

    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    res = workload_from_onnx(Path(path))
    assert not res.workload.items
    assert res.unimplemented == {"Conv": 1, "Resize": 1}
    assert "2-D convolutions" in res.skipped["Conv"]


def test_mobilenet_activations_map_and_fuse_into_convs(tmp_path):
    from _onnx_models import mobilenet_like

    res = workload_from_onnx(mobilenet_like(tmp_path / "m.onnx"))
    convs = {k["groups"]: k for k, _ in problems(res, "conv2d")}
    assert convs[1]["activation"] == "relu6" and convs[32]["activation"] == "hardswish"
    acts = sorted((k["fn"], tuple(k["shape"])) for k, _ in problems(res, "activation"))
    # the gate (torch's alpha 1/6) and the ReLU6 after the Gemm, whose epilogue has none
    assert acts == [("hardsigmoid", (2, 32, 1, 1)), ("relu6", (2, 10))]
    (gemm, _), = problems(res, "matmul")
    assert gemm["activation"] == "none"
    assert res.unimplemented.get("HardSigmoid") == 1  # ONNX's default alpha 0.2
