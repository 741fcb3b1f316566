"""An explicit empty list (``cudnn: []``, ``cuda_runtimes: []``) means "looked, found none";
an absent list stays unknown. Libraries that dlopen cuDNN / the CUDA runtime then fail."""

from __future__ import annotations

from pathlib import Path

from dnnctl.doctor.envfile import load_env, parse_env, save_env
from tests.unit._doctor_helpers import doctor

CT2 = """
os: Linux
%s
packages: {faster-whisper: "1.0.1", ctranslate2: "%s"%s}
"""


def test_empty_list_is_kept_apart_from_absent(tmp_path: Path) -> None:
    env = parse_env("schema: dnnctl-env/1\ncudnn: []\n")
    assert env.none_found("cudnn") and not env.none_found("cuda_runtimes")
    assert not parse_env("schema: dnnctl-env/1\ncudnn: null\n").none_found("cudnn")
    assert not parse_env("schema: dnnctl-env/1\nos: Linux\n").none_found("cudnn")
    assert not parse_env("schema: dnnctl-env/1\ncudnn: [8.9.7]\n").none_found("cudnn")
    # saved and loaded again, and in the --json env
    again = load_env(save_env(env, tmp_path / "s.yaml"))
    assert again.none_found("cudnn")
    assert env.to_dict()["cudnn"] == []
    assert "cudnn" not in parse_env("schema: dnnctl-env/1\nos: Linux\n").to_dict()


def test_ctranslate2_cudnn8_wheel_with_no_cudnn_is_an_error(tmp_path: Path) -> None:
    # faster-whisper README: GPU execution needs cuBLAS and cuDNN of the wheel's CUDA
    d = doctor(tmp_path, CT2 % ("cudnn: []", "4.2.1", ""))
    [f] = d.of("cudnn-mismatch", "ctranslate2")
    assert f["severity"] == "error" and "none" in f["message"]
    assert "libcudnn_ops_infer.so.8" in f["message"]
    assert "nvidia-cudnn-cu12==8.*" in f["fix"]
    assert "ctranslate2>=4.6.3" in f["fix"]  # the first wheel built without cuDNN
    assert d.data["env"]["cudnn"] == []


def test_ctranslate2_with_cudnn_unknown_is_not_judged_as_missing(tmp_path: Path) -> None:
    d = doctor(tmp_path, CT2 % ("", "4.2.1", ""))
    assert not d.of("cudnn-mismatch")
    [f] = d.of("not-judged", "ctranslate2")  # a conditional warning naming the need
    assert f["severity"] == "warning" and "which cuDNN is installed here is not known" \
        in f["message"] and "unless it is cuDNN 8" in f["message"]


def test_empty_copies_but_a_cudnn_wheel_counts(tmp_path: Path) -> None:
    d = doctor(tmp_path, CT2 % ("cudnn: []", "4.2.1", ', nvidia-cudnn-cu12: "8.9.7.29"'))
    assert not d.of("cudnn-mismatch")
    d = doctor(tmp_path, CT2 % ("cudnn: []", "4.2.1", ', nvidia-cudnn-cu12: "9.1.0.70"'))
    [f] = d.of("cudnn-mismatch", "ctranslate2")
    assert "9.x" in f["message"]


JAX = """
os: Linux
driver: {version: "550.54.15"}
gpus: [{name: NVIDIA A100-SXM4-40GB}]
cuda_runtimes: [{version: "12.4", source: "system:/usr/local/cuda"}]
%s
frameworks:
  jax: {version: "0.4.26", jaxlib: "0.4.26+cuda12.cudnn89"}
%s
"""


def test_cuda_jaxlib_with_no_cudnn_is_an_error(tmp_path: Path) -> None:
    d = doctor(tmp_path, JAX % ("cudnn: []", ""))
    [f] = d.of("cudnn-mismatch")
    assert f["severity"] == "error" and "no cuDNN is installed" in f["message"]
    assert 'jax[cuda12]==0.4.26' in f["fix"]
    assert not d.of("not-judged", "jax")


def test_cuda_jaxlib_with_cudnn_unknown_or_a_wheel_is_no_error(tmp_path: Path) -> None:
    assert not doctor(tmp_path, JAX % ("", "")).of("cudnn-mismatch")
    wheel = 'packages: {nvidia-cudnn-cu12: "8.9.7.29"}'
    assert not doctor(tmp_path, JAX % ("cudnn: []", wheel)).of("cudnn-mismatch")


def test_tensorflow_with_no_cuda_runtime_is_a_cuda_mismatch(tmp_path: Path) -> None:
    d = doctor(tmp_path, """
os: Linux
cuda_runtimes: []
frameworks:
  tensorflow: {version: "2.15.0"}
""")
    [f] = d.of("cuda-mismatch", "tensorflow")
    assert "installed here are none:" in f["message"]
    assert "readable version" not in f["message"]


def test_onnxruntime_cudnn9_build_with_no_cudnn(tmp_path: Path) -> None:
    d = doctor(tmp_path, """
os: Linux
cuda_runtimes: [{version: "12.4", source: "system:/usr/local/cuda"}]
cudnn: []
packages: {onnxruntime-gpu: "1.19.2"}
""")
    [f] = d.of("cudnn-mismatch", "onnxruntime")
    assert "the cuDNN here is none" in f["message"]
