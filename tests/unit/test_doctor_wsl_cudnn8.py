"""cuDNN 8 in WSL 2 opens libcuda.so by that name (rules_platform.wsl_libcuda)."""

from __future__ import annotations

from dnnctl.compat.matrix import load_matrix
from dnnctl.doctor.envfile import parse_env
from dnnctl.doctor.rules import judge


def _unreachable(os_line: str, torch: str) -> list[str]:
    text = (f"schema: dnnctl-env/1\nos: {os_line}\ndriver: {{cuda: '12.1'}}\n"
            f"frameworks: {{torch: {{version: '{torch}'}}}}\n")
    found = judge(parse_env(text, "t.yaml"), load_matrix())
    return [f.message for f in found if f.code == "libcuda-unreachable"]


def test_torch_wheel_with_cudnn8_in_wsl2_is_warned() -> None:
    (msg,) = _unreachable("Ubuntu 22.04 (WSL 2)", "2.0.0+cu118")
    assert "torch 2.0.0+cu118 (cuDNN 8." in msg and "libcudnn_cnn_infer.so.8" in msg


def test_cudnn9_wheel_or_native_linux_is_not() -> None:
    assert _unreachable("Ubuntu 22.04 (WSL 2)", "2.4.0+cu121") == []
    assert _unreachable("Ubuntu 22.04", "2.0.0+cu118") == []
