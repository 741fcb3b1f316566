"""What native Windows and WSL 2 leave out that Linux has (RAPIDS, torch.distributed's NCCL,
torch.compile's Triton, pinned memory), through the real `dnnctl doctor --from`."""

from __future__ import annotations

from _doctor_helpers import doctor

WIN = "os: Windows 11\ngpus: [{name: NVIDIA GeForce RTX 4080}]\n"


def test_rapids_on_native_windows_is_an_error_with_the_wsl2_fix(tmp_path):
    """NVIDIA/cudf#11488: cuDF on Windows 10 (built from source: 'No module named skbuild')."""
    d = doctor(tmp_path, "os: Windows 10\npackages: {cudf: null, cuml-cu12: 24.12.0}\n")
    [f] = d.of("platform-unsupported", "cudf")
    assert f["severity"] == "error" and d.code == 1
    assert f["message"].startswith("cudf, cuml-cu12 24.12.0: RAPIDS has no native Windows "
                                   "build (not even a CPU one); on Windows it runs only "
                                   "inside WSL 2")
    assert "WSL 2" in f["fix"] and "7.0" in f["fix"]
    assert "docs.rapids.ai/platform-support" in f["source"] and "limits.yaml" in f["source"]
    linux = doctor(tmp_path, "os: Ubuntu 22.04\npackages: {cudf: null}\n")
    assert linux.of("platform-unsupported") == []


def test_a_cuda_torch_on_windows_gets_the_nccl_and_triton_conditions(tmp_path):
    """meta-llama/llama3#127 (no NCCL) and analogdevicesinc/ai8x-training#329 (no Triton)."""
    d = doctor(tmp_path, WIN + "frameworks: {torch: {version: 2.3.1+cu121}}\n")
    nccl, compile_ = d.of("platform-unsupported", "torch")
    assert nccl["severity"] == "warning" and nccl["evidence"]["conditional"] is True
    assert nccl["message"].startswith("if this program uses torch.distributed with the NCCL "
                                      "backend")
    assert "'Distributed package doesn't have NCCL built in'" in nccl["message"]
    assert 'init_process_group(backend="gloo")' in nccl["fix"]
    assert "$env:PL_TORCH_DISTRIBUTED_BACKEND=\"gloo\"" in nccl["fix"]  # PowerShell's form
    assert "Windows supports all collective communications backends but NCCL" in nccl["source"]
    assert compile_["message"].startswith("if this program calls torch.compile on a CUDA "
                                          "device: its default GPU backend (Inductor)")
    assert "'Cannot find a working triton installation'" in compile_["message"]
    assert "suppress_errors" in compile_["fix"] and "WSL 2" in compile_["fix"]
    assert "Supported Platforms: Linux" in compile_["source"]


def test_no_condition_for_cpu_torch_old_torch_triton_or_linux(tmp_path):
    cpu = doctor(tmp_path, WIN + "frameworks: {torch: {version: 2.3.1+cpu}}\n")
    assert cpu.of("platform-unsupported") == []
    old = doctor(tmp_path, WIN + "frameworks: {torch: {version: 1.13.1+cu117}}\n")
    assert [f["message"][:40] for f in old.of("platform-unsupported")] == [
        "if this program uses torch.distributed w"]
    triton = doctor(tmp_path, WIN + "frameworks: {torch: {version: 2.6.0+cu124}}\n"
                    "packages: {triton-windows: 3.2.0.post18}\n")
    assert len(triton.of("platform-unsupported")) == 1
    linux = doctor(tmp_path, "os: Ubuntu 22.04\n" + WIN.split("\n", 1)[1]
                   + "frameworks: {torch: {version: 2.3.1+cu121}}\n")
    assert linux.of("platform-unsupported") == []


def test_a_ggml_cuda_build_in_wsl2_gets_the_pinned_memory_condition(tmp_path):
    """ggml-org/llama.cpp#1230: out of memory loading a 13B model with --no-mmap under WSL 2."""
    d = doctor(tmp_path, "os: Ubuntu 22.04; Linux 5.15.153.1-microsoft-standard-WSL2 x86_64\n"
               "gpus: [{name: NVIDIA GeForce RTX 3050}]\n"
               "frameworks: {llama-cpp-python: {cuda_build: true}}\n")
    [f] = d.of("pinned-memory", "llama-cpp-python")
    assert f["severity"] == "warning" and f["evidence"]["conditional"] is True
    assert "WSL 2, which limits pinned (page-locked) host memory" in f["message"]
    assert "`export GGML_CUDA_NO_PINNED=1`" in f["fix"]
    assert "Known Limitations for Linux CUDA Applications" in f["source"]
    cpu = doctor(tmp_path, "os: Linux 5.15.153.1-microsoft-standard-WSL2\n"
                 "frameworks: {llama-cpp-python: {cuda_build: false}}\n")
    assert cpu.of("pinned-memory") == []
    native = doctor(tmp_path, "os: Ubuntu 22.04\nframeworks: {llama-cpp-python: "
                    "{cuda_build: true}}\n")
    assert native.of("pinned-memory") == []
