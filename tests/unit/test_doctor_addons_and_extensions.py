"""Add-ons' own GPU minimums (FlashAttention-2: compute capability 8.0; torch.compile's Triton
backend: 7.0) and the toolkit torch's extension builder uses (its CUDA major must be torch's:
torch/utils/cpp_extension.py raises on a major mismatch, warns on a minor one)."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor

TURING = "gpus: [{name: Quadro RTX 5000}]\n"
PASCAL = "gpus: [{name: NVIDIA GeForce GTX 1080 Ti}]\n"
AMPERE = "gpus: [{name: NVIDIA A100-SXM4-80GB}]\n"


def test_flash_attention_2_needs_ampere(tmp_path: Path) -> None:
    # Dao-AILab/flash-attention#762: Quadro RTX 5000 (Turing)
    got = doctor(tmp_path, TURING + 'packages: {flash-attn: "2.5.8"}\n')
    [f] = got.of("arch-unsupported", "flash-attn")
    assert f["severity"] == "error" and "Ampere GPUs or newer" in f["message"]
    assert "sdpa" in f["fix"] and f["evidence"]["min_cc"] == "8.0"
    assert "✗ flash-attn" in got.text
    assert doctor(tmp_path, AMPERE + 'packages: {flash-attn: "2.5.8"}\n').codes() == set()
    # FlashAttention 1.x is not this row's
    assert "flash-attn" not in doctor(tmp_path, TURING + 'packages: {flash-attn: "1.0.9"}\n'
                                      ).codes(info=True)


def test_torch_compile_needs_volta(tmp_path: Path) -> None:
    # MIC-DKFZ/nnUNet#2188: GTX 1080 Ti (6.1) with torch.compile
    got = doctor(tmp_path, PASCAL + "frameworks: {torch: {version: 2.3.1+cu121}}\n")
    [f] = got.of("arch-unsupported", "torch")
    assert f["severity"] == "warning" and "Triton only supports" in f["message"]
    assert "TORCHDYNAMO_DISABLE=1" in f["fix"] and got.code == 0
    # torch 1.13 has no torch.compile; a CPU build runs no GPU kernel; 7.5 is enough
    for snap in (PASCAL + "frameworks: {torch: {version: 1.13.1+cu117}}\n",
                 PASCAL + "frameworks: {torch: {version: 2.3.1+cpu}}\n",
                 TURING + "frameworks: {torch: {version: 2.3.1+cu121}}\n"):
        assert not doctor(tmp_path, snap).of("arch-unsupported", "torch"), snap


def test_no_second_finding_when_torch_itself_has_no_code(tmp_path: Path) -> None:
    got = doctor(tmp_path, PASCAL + "frameworks: {torch: {version: 2.9.1+cu130}}\n")
    found = got.of("arch-unsupported", "torch")
    assert [f["severity"] for f in found] == ["error"] and "torch.compile" not in got.text


def test_a_toolkit_of_another_major_than_torch(tmp_path: Path) -> None:
    # facebookresearch/xformers#748: nvcc 12.1 with torch 2.0.0+cu118
    tk = 'cuda_runtimes: [{{version: "{v}", source: "system:/usr/local/cuda-{v}"}}]\n'
    torch = "frameworks: {torch: {version: 2.0.0+cu118}}\n"
    got = doctor(tmp_path, AMPERE + tk.format(v="12.1") + torch)
    [f] = got.of("cuda-mismatch", "cuda")
    assert f["severity"] == "warning" and "mismatches the version" in f["message"]
    assert "CUDA 11.8 toolkit" in f["fix"] and "CUDA_HOME" in f["fix"]
    # the same major: at most an info, and none for the same minor
    minor = doctor(tmp_path, AMPERE + tk.format(v="11.7") + torch)
    assert minor.codes("cuda") == set() and minor.of("cuda-mismatch", "cuda")
    same = doctor(tmp_path, AMPERE + tk.format(v="11.8") + torch)
    assert not same.of("cuda-mismatch", "cuda")
    # pip's runtime wheels and the ld cache's libcudart are not toolkits
    pip = ('cuda_runtimes: [{version: "12.4.127", source: "pip:nvidia-cuda-runtime-cu12"}]\n')
    assert not doctor(tmp_path, AMPERE + pip + torch).of("cuda-mismatch", "cuda")


def test_cuda_python_bindings_need_a_driver_for_their_cuda_major(tmp_path: Path) -> None:
    # NVIDIA/cutlass#2866: cuda-python 13 on driver 570.133.20 -> cudaErrorInsufficientDriver
    got = doctor(tmp_path, "os: Linux\ndriver: {version: 570.133.20}\n"
                 'packages: {cuda-python: "13.0.0"}\n')
    [f] = got.of("driver-too-old", "cuda-python")
    assert f["severity"] == "error" and f["evidence"]["required"] == "580.65.06"
    assert "580.65.06" in f["fix"] and "pip install 'cuda-python<13'" in got.text
    assert "cutlass#2866" in f["source"]
    # the 12.x bindings run on that driver; cuda-bindings' own version wins over the metapackage
    ok = doctor(tmp_path, "os: Linux\ndriver: {version: 570.133.20}\n"
                'packages: {cuda-python: "12.9.0", cuda-bindings: "12.9.0"}\n')
    assert not ok.of("driver-too-old")
