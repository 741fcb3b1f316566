"""A toolkit too old for the GPU beside a CUDA torch: the fix keeps torch's CUDA major."""

from __future__ import annotations

from _doctor_helpers import doctor

ADA = "gpus: [{name: NVIDIA GeForce RTX 4090, compute_capability: '8.9'}]\n"
NVCC = "cuda_runtimes: [{version: '%s', source: 'nvcc:/usr/local/cuda/bin/nvcc'}]\n"


def _fix(d):
    [f] = [f for f in d.of("cuda-mismatch", "cuda") if f["severity"] == "warning"]
    return f


def test_lowest_toolkit_of_torchs_major_with_its_driver_floor(tmp_path):
    d = doctor(tmp_path, "os: Ubuntu\n" + ADA + NVCC % "11.3" +
               "frameworks: {torch: {version: '1.10.2', cuda: '11.3'}}\n")
    f = _fix(d)
    assert "cuda-toolkit-11-8" in f["fix"] and "cuda-toolkit-12" not in f["fix"]
    assert "cuda-toolkit-13" not in f["fix"]
    assert "driver >= 520.61.05" in f["fix"]  # the driver here is not known
    assert 'TORCH_CUDA_ARCH_LIST="8.6+PTX"' in f["fix"]
    assert "_check_cuda_version" in f["source"]


def test_no_toolkit_of_torchs_major_knows_the_gpu(tmp_path):
    d = doctor(tmp_path, "os: Ubuntu\n" + ADA + NVCC % "10.2" +
               "frameworks: {torch: {version: '1.10.2', cuda: '10.2'}}\n")
    f = _fix(d)
    assert "no CUDA 10.x toolkit compiles for sm_89" in f["fix"]
    assert 'TORCH_CUDA_ARCH_LIST="7.5+PTX"' in f["fix"] and "apt-get" not in f["fix"]


def test_a_driver_that_runs_it_is_not_asked_for(tmp_path):
    d = doctor(tmp_path, "os: Ubuntu\n" + ADA + NVCC % "11.3" +
               "driver: {version: '535.183.01'}\n"
               "frameworks: {torch: {version: '2.0.1', cuda: '11.7'}}\n")
    f = _fix(d)
    assert "cuda-toolkit-11-8" in f["fix"] and "driver >=" not in f["fix"]


def test_torch_of_unknown_cuda_gets_one_answer_per_major_of_its_line(tmp_path):
    d = doctor(tmp_path, "os: Ubuntu\n" + ADA + NVCC % "11.3" +
               "frameworks: {torch: {version: '1.10'}}\n")
    f = _fix(d)
    assert "torch.version.cuda" in f["fix"] and "a CUDA 10.x torch" in f["fix"]
    assert "cuda-toolkit-11-8" in f["fix"] and "cuda-toolkit-13" not in f["fix"]


def test_without_torch_the_toolkit_fix_is_unchanged(tmp_path):
    d = doctor(tmp_path, "os: Ubuntu\n" + ADA + NVCC % "11.3" +
               "driver: {version: '535.183.01'}\n")
    f = _fix(d)
    assert "use a CUDA toolkit >= 11.8" in f["fix"] and "TORCH_CUDA_ARCH_LIST" not in f["fix"]
