"""Prebuilt add-ons tied to one torch line or one CUDA release (table prebuilt_pins)."""

from __future__ import annotations

from _doctor_helpers import doctor

TORCH_201 = "frameworks: {torch: {version: '2.0.1', cuda: '11.8'}}\n"


def test_auto_gptq_built_for_another_torch_line_fails(tmp_path):
    d = doctor(tmp_path, "os: Linux\n" + TORCH_201 +
               "extensions: {auto-gptq: {version: 0.5.0+cu118, built_from_source: false}}\n"
               "packages: {torch: '2.0.1', auto-gptq: 0.5.0+cu118}\n")
    [f] = d.of("build-mismatch", "auto-gptq")
    assert f["severity"] == "error" and f["evidence"]["built_for"] == "2.1"
    # the release built for torch 2.0, from the index of torch's CUDA variant
    assert '"auto-gptq==0.4.2"' in f["fix"] and "autogptq-index/whl/cu118/" in f["fix"]
    assert "download.pytorch.org/whl/cu118" in f["fix"] and "AutoGPTQ#297" in f["source"]
    assert not d.of("not-judged", "auto-gptq") and d.code == 1


def test_auto_gptq_of_the_torch_line_here_passes(tmp_path):
    d = doctor(tmp_path, "os: Linux\nframeworks: {torch: {version: '2.1.2'}}\n"
               "packages: {torch: '2.1.2', auto-gptq: '0.5.1'}\n")
    assert d.of("ok", "auto-gptq") and not d.codes("auto-gptq")


def test_a_source_build_is_not_held_to_the_wheel_pin(tmp_path):
    d = doctor(tmp_path, "os: Linux\n" + TORCH_201 +
               "extensions: {auto-gptq: {version: 0.7.1, built_from_source: true}}\n")
    assert not d.of("build-mismatch", "auto-gptq")


def test_auto_gptq_of_unknown_release_names_the_release_for_this_torch(tmp_path):
    d = doctor(tmp_path, "os: Linux\n" + TORCH_201 + "packages: {auto-gptq: null}\n")
    [f] = d.of("not-judged", "auto-gptq")
    assert "0.4.2: torch 2.0" in f["message"] and '"auto-gptq==0.4.2"' in f["fix"]


def test_pypi_pytorch3d_wheel_beside_another_torch_fails(tmp_path):
    d = doctor(tmp_path, "os: Linux\nframeworks: {torch: {version: '1.7.0'}}\n"
               "packages: {torch: '1.7.0', pytorch3d: '0.3.0'}\n")
    [f] = d.of("build-mismatch", "pytorch3d")
    assert "built for torch 1.6" in f["message"] and "torch==1.6" in f["fix"]
    assert "dl.fbaipublicfiles.com/pytorch3d" in f["fix"] and "pytorch3d#476" in f["source"]


def test_pytorch3d_with_nothing_known_says_the_pin(tmp_path):
    d = doctor(tmp_path, "os: Linux\nframeworks: {torch: {version: null}}\n"
               "extensions: {pytorch3d: {built_from_source: false}}\n")
    [f] = d.of("not-judged", "pytorch3d")
    assert "0.2.5/0.3.0: torch 1.6" in f["message"] and f["fix"]


def test_faiss_gpu_built_for_one_cuda_release_fails_on_another(tmp_path):
    d = doctor(tmp_path, "os: Linux\ncuda_runtimes: [{version: '9.1', source: system}]\n"
               "packages: {faiss-gpu: '1.2.1'}\n")
    [f] = d.of("cuda-mismatch", "faiss-gpu")
    assert f["severity"] == "error" and "CUDA 9.0" in f["message"]
    assert "conda install faiss-gpu=1.4.0 cuda91 -c pytorch" in f["fix"]
    assert "faiss#371" in f["source"]


def test_faiss_gpu_with_a_bundled_build_is_only_a_warning(tmp_path):
    d = doctor(tmp_path, "os: Linux\ncuda_runtimes: [{version: '9.2', source: system}]\n"
               "packages: {faiss-gpu: '1.4.0'}\n")
    [f] = d.of("cuda-mismatch", "faiss-gpu")
    assert f["severity"] == "warning" and "CUDA 8.0 build" in f["message"]
    assert "faiss-gpu=1.5.0 cuda92" in f["fix"]


def test_faiss_gpu_with_a_build_for_the_cuda_here_names_that_build(tmp_path):
    d = doctor(tmp_path, "os: Linux\ncuda_runtimes: [{version: '9.1', source: system}]\n"
               "packages: {faiss-gpu: '1.4.0'}\n")
    assert not d.codes("faiss-gpu")
    [f] = d.of("not-judged", "faiss-gpu")
    assert "faiss-gpu=1.4.0 cuda91" in f["fix"] and "conda list faiss-gpu" in f["fix"]


def test_faiss_gpu_of_unknown_release_names_the_build_for_this_cuda(tmp_path):
    d = doctor(tmp_path, "os: Linux\ncuda_runtimes: [{version: '9.1', source: system}]\n"
               "packages: {faiss-gpu: null}\n")
    [f] = d.of("not-judged", "faiss-gpu")
    assert "faiss-gpu=1.4.0 cuda91" in f["fix"] and "9.1" in f["message"]
