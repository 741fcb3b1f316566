"""A component no rule judged is shown as ?, never ✓: libraries nothing loads, GPUs with no
driver, a torch wheel with no GPU given, a driver known only by its library path; conda's
cudatoolkit is named as the CUDA runtime it is. Through the real `dnnctl doctor --from`."""

from __future__ import annotations

from _doctor_helpers import doctor


def test_libraries_nothing_loads_are_not_judged(tmp_path):
    """NVIDIA/nccl#342's snapshot: cuDNN and NCCL in a CUDA image, GPUs, no framework."""
    d = doctor(tmp_path, "gpus: [{name: GeForce RTX 2080, compute_capability: '7.5'}]\n"
               "cudnn: [{version: 7.6.0.64, source: apt}]\n"
               "libraries: {nccl: [{version: 2.7.3, source: apt}]}\n")
    [cudnn] = d.of("not-judged", "cudnn")
    assert cudnn["message"].startswith("cudnn 7.6.0.64: nothing in the snapshot loads it")
    assert d.of("not-judged", "nccl")
    assert "✓ cudnn" not in d.text and "✓ nccl" not in d.text and "? cudnn" in d.text
    torch = doctor(tmp_path, "gpus: [{name: GeForce RTX 2080, compute_capability: '7.5'}]\n"
                   "cudnn: [{version: 8.9.2.26, source: 'pip:nvidia-cudnn-cu12'}]\n"
                   "frameworks: {torch: {version: 2.3.1+cu121}}\n")
    assert torch.of("not-judged", "cudnn") == []


def test_a_torch_wheel_with_no_gpu_given_is_not_a_pass(tmp_path):
    d = doctor(tmp_path, "frameworks: {torch: {version: 2.3.1+cu121}}\n")
    [f] = d.of("not-judged", "torch")
    assert f["message"].startswith("torch 2.3.1+cu121: wheel cu121 (CUDA 12.1, cuDNN 8.9.2.26);"
                                   " no GPU is given, so which GPUs it has code for was not "
                                   "judged")
    assert d.of("ok", "torch") == [] and "✓ torch" not in d.text
    gpu = doctor(tmp_path, "gpus: [{name: NVIDIA GeForce RTX 4090}]\n"
                 "frameworks: {torch: {version: 2.3.1+cu121}}\n")
    [ok] = gpu.of("ok", "torch")
    assert ok["message"].endswith("has code for sm_89")


def test_gpus_with_no_driver_and_a_driver_known_by_its_path_only(tmp_path):
    d = doctor(tmp_path, "driver: {present: false}\ngpus: [{name: NVIDIA GeForce RTX 2060 "
               "SUPER}]\n")
    assert d.of("no-driver") and d.of("not-judged", "gpu")[0]["message"].endswith(
        "no NVIDIA driver is loaded, so nothing here was judged against the GPUs")
    assert "✓ gpu" not in d.text
    path = doctor(tmp_path, "driver: {libcuda: /usr/lib/wsl/lib/libcuda.so.1}\n")
    [f] = path.of("not-judged", "driver")
    assert f["message"].startswith("the driver's version is not in the snapshot")


def test_cudatoolkit_is_named_as_condas_cuda_runtime(tmp_path):
    d = doctor(tmp_path, "os: Linux\npackages: {cudatoolkit: 11.3.1}\n")
    [f] = d.of("not-judged", "cudatoolkit")
    assert "it is conda's CUDA runtime (libcudart, cuBLAS" in f["message"]
    assert "named for CUDA" not in f["message"]
    assert f["fix"].startswith("list it under cuda_runtimes")
    assert "anaconda.org/anaconda/cudatoolkit" in f["source"]
