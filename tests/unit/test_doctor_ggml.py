"""Native ggml builds (llama-cpp-python, pywhispercpp): a CPU-only build beside a GPU is a
warning with the reinstall for the version's CMake flag (LLAMA_CUBLAS up to 0.2.59, LLAMA_CUDA
0.2.60-0.2.81, GGML_CUDA from 0.2.82); a CUDA build without code for the GPU is an error."""

from __future__ import annotations

from pathlib import Path

from dnnctl.doctor.probe_python import relevant
from tests.unit._doctor_helpers import doctor

SNAP = """
os: Linux
driver: {version: "570.124.06"}
gpus: [{name: NVIDIA GeForce RTX 4090}]
%s
"""


def _llama(version: str, extra: str = "cuda_build: false") -> str:
    return SNAP % f'frameworks: {{llama-cpp-python: {{version: "{version}", {extra}}}}}'


def test_cpu_only_build_beside_a_gpu_names_the_flag_of_its_version(tmp_path: Path) -> None:
    for version, flag in (("0.2.20", "LLAMA_CUBLAS"), ("0.2.77", "LLAMA_CUDA"),
                          ("0.3.4", "GGML_CUDA")):
        d = doctor(tmp_path, _llama(version))
        [f] = d.of("cuda-mismatch", "llama-cpp-python")
        assert f["severity"] == "warning" and "CPU-only build" in f["message"]
        assert f'CMAKE_ARGS="-D{flag}=on" pip install --upgrade --force-reinstall' in f["fix"]
        assert f"llama-cpp-python=={version}" in f["fix"]


def test_cpu_only_build_without_a_gpu_is_a_conditional_warning(tmp_path: Path) -> None:
    # a plain pip install or upgrade builds it without CUDA (llama-cpp-python#787): with no
    # GPU listed the doctor cannot know a GPU was wanted, so it says so, never a pass
    d = doctor(tmp_path, 'os: Linux\nframeworks: {llama-cpp-python: {version: "0.3.4", '
                         'backends: [cpu]}}\n')
    [f] = d.of("cuda-mismatch", "llama-cpp-python")
    assert f["severity"] == "warning" and f["evidence"]["conditional"] is True
    assert "if this machine has an NVIDIA GPU meant for it" in f["message"]
    assert 'CMAKE_ARGS="-DGGML_CUDA=on" pip install --upgrade --force-reinstall' in f["fix"]
    assert "llama-cpp-python#787" in f["source"]
    assert not d.of("ok", "llama-cpp-python") and "✓ llama-cpp-python" not in d.text
    old = doctor(tmp_path, 'frameworks: {llama-cpp-python: {version: "0.2.11", '
                           'cuda_build: false}}\n')
    [f] = old.of("cuda-mismatch", "llama-cpp-python")
    assert 'CMAKE_ARGS="-DLLAMA_CUBLAS=on"' in f["fix"] and "==0.2.11" in f["fix"]
    whisper = doctor(tmp_path, "frameworks: {pywhispercpp: {cuda_build: false}}\n")
    [f] = whisper.of("cuda-mismatch", "pywhispercpp")
    assert "GGML_CUDA=1 pip install" in f["fix"]


def test_cpu_only_torch_without_a_gpu_stays_a_note(tmp_path: Path) -> None:
    # a +cpu wheel is chosen from torch's CPU index: the conditional warning is only for
    # packages whose default build is CPU-only
    d = doctor(tmp_path, 'frameworks: {torch: {version: "2.5.1+cpu"}}\n')
    assert not d.of("cuda-mismatch", "torch") and d.of("ok", "torch")


def test_a_cuda_build_without_code_for_the_gpu(tmp_path: Path) -> None:
    d = doctor(tmp_path, _llama("0.3.4", 'cuda_build: true, arch_list: ["90-real"]'))
    [f] = d.of("arch-unsupported", "llama-cpp-python")
    assert f["severity"] == "error" and "sm_89" in f["message"]
    assert "no kernel image" in f["message"]
    assert "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=89" in f["fix"]
    # CMake's forms: 86 is SASS + PTX (runs on 8.9), 80-virtual is PTX only (JIT)
    ok = doctor(tmp_path, _llama("0.3.4", 'cuda_build: true, arch_list: ["75-real;86"]'))
    assert not ok.of("arch-unsupported") and ok.of("ok", "llama-cpp-python")
    jit = doctor(tmp_path, _llama("0.3.4", 'backends: [cuda], arch_list: ["80-virtual"]'))
    assert jit.of("arch-ptx-jit", "llama-cpp-python")


def test_unknown_build_is_not_judged(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % 'packages: {llama-cpp-python: "0.2.90"}')
    [f] = d.of("not-judged", "llama-cpp-python")
    assert "llama_supports_gpu_offload" in f["fix"]
    d = doctor(tmp_path, _llama("0.3.4", "cuda_build: true"))
    [f] = d.of("not-judged", "llama-cpp-python")
    assert "which GPUs it has code for was not judged" in f["message"]


def test_pywhispercpp_cpu_wheel(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % 'frameworks: {pywhispercpp: {version: "1.3.0", '
                                'backends: [cpu]}}')
    [f] = d.of("cuda-mismatch", "pywhispercpp")
    assert "GGML_CUDA=1 pip install --force-reinstall --no-cache-dir" in f["fix"]


def test_detection_lists_the_bindings() -> None:
    assert relevant("llama-cpp-python") and relevant("pywhispercpp")
