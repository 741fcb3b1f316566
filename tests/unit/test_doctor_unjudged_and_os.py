"""Nothing unjudged shown as a pass, and what the OS rules out (Secure Boot, vLLM on Windows,
GPU TensorFlow on macOS), DGL's GraphBolt per torch, jax's plugin of unknown version."""

from __future__ import annotations

from _doctor_helpers import doctor


def test_driver_of_unknown_version_is_not_judged(tmp_path):
    d = doctor(tmp_path, "os: Linux\ndriver: {present: true}\n"
               "gpus: [{name: NVIDIA A100-SXM4-80GB}]\n")
    found = d.of("not-judged", "driver")
    assert found and "nvidia-smi --query-gpu=driver_version" in found[0]["fix"]
    assert "✓ driver" not in d.text and "? driver" in d.text


def test_cuda_and_libraries_with_no_driver_nor_gpu_are_not_judged(tmp_path):
    d = doctor(tmp_path, "os: Linux\ncuda_runtimes: [{version: '9.1', source: system}]\n"
               "libraries: {cublas: [{version: '9.1', source: system}]}\n")
    assert d.of("not-judged", "cuda") and d.of("not-judged", "cublas")
    assert "✓ cuda" not in d.text and "✓ cublas" not in d.text


def test_no_driver_version_is_asked_for_where_the_driver_is_absent(tmp_path):
    """The no-driver error says why nothing runs: no line per runtime asking for a driver
    version that does not exist."""
    d = doctor(tmp_path, "os: Linux\ndriver: {present: false}\n"
               "cuda_runtimes: [{version: '13.0', source: 'system:/usr/local/cuda-13.0'}]\n"
               "libraries: {cublas: [{version: '13.0', source: system}]}\n")
    assert d.of("no-driver", "driver")
    assert not d.of("not-judged", "cuda") and not d.of("not-judged", "cublas")
    assert "driver: {version" not in d.text


def test_cuda_with_a_driver_is_judged_not_flagged(tmp_path):
    d = doctor(tmp_path, "os: Linux\ndriver: {version: '580.65.06'}\n"
               "gpus: [{name: NVIDIA H100 80GB HBM3}]\n"
               "cuda_runtimes: [{version: '12.8', source: 'pip:nvidia-cuda-runtime-cu12'}]\n")
    assert not d.of("not-judged", "cuda")


def test_gpu_package_with_no_rule_is_never_silent(tmp_path):
    d = doctor(tmp_path, "os: Linux\npackages: {faiss-gpu: null, pandas: '2.2.0', "
               "nvidia-cublas-cu12: '12.4.5.8'}\n")
    faiss = d.of("not-judged", "faiss-gpu")
    assert faiss and "CUDA release" in faiss[0]["message"] and "faiss#371" in faiss[0]["source"]
    assert not d.of("not-judged", "pandas") and not d.of("not-judged", "nvidia-cublas-cu12")


def test_prebuilt_extension_of_one_torch_is_not_judged(tmp_path):
    # 0.3.0 is a release the prebuilt_pins table lacks (its rows: test_doctor_prebuilt.py)
    d = doctor(tmp_path, "os: Linux\nframeworks: {torch: {version: '2.0.1', cuda: '11.8'}}\n"
               "extensions: {auto-gptq: {version: 0.3.0+cu118, built_from_source: false}}\n"
               "packages: {torch: '2.0.1', auto-gptq: 0.3.0+cu118}\n")
    found = d.of("not-judged", "auto-gptq")
    assert found and "torch release" in found[0]["message"] and found[0]["fix"]


def test_every_not_judged_finding_has_a_next_step(tmp_path):
    d = doctor(tmp_path, "os: Linux\nframeworks: {torch: {version: null}}\n"
               "extensions: {pytorch3d: {built_from_source: false}}\n")
    nj = [f for f in d.findings if f["code"] == "not-judged"]
    assert {f["component"] for f in nj} >= {"torch", "pytorch3d"}
    assert all(f["fix"] for f in nj)


def test_ok_finding_carries_no_fix(tmp_path):
    d = doctor(tmp_path, "os: Windows 10\nframeworks: {torch: {version: '2.4.1'}}\n")
    ok = d.of("ok", "torch")
    assert ok and all(f["fix"] is None for f in ok)
    assert "] ok (torch)" not in d.text


def test_header_names_only_what_the_snapshot_gives(tmp_path):
    assert "Python ?" not in doctor(tmp_path, "os: Fedora 34\n").text
    assert "(Python 3.11)" in " ".join(doctor(tmp_path, "python: '3.11'\n").text.split())


def test_no_driver_on_fedora_names_secure_boot_in_dnf_terms(tmp_path):
    d = doctor(tmp_path, "os: Fedora 34\ndriver: {present: false}\n"
               "gpus: [{name: NVIDIA GeForce RTX 2060 SUPER}]\n")
    f = d.of("no-driver", "driver")[0]
    assert f["source"] and "Secure Boot" in f["fix"] and "nouveau" in f["fix"]
    assert "mokutil --import /etc/pki/akmods/certs/public_key.der" in f["fix"]
    assert "akmod-nvidia" in f["fix"] and "apt" not in f["fix"]


def test_no_driver_on_ubuntu_keeps_apt_and_names_secure_boot(tmp_path):
    d = doctor(tmp_path, "os: Ubuntu 22.04 (Linux)\ndriver: {present: false}\n"
               "gpus: [{name: NVIDIA GeForce RTX 4090}]\n")
    f = d.of("no-driver", "driver")[0]
    assert "mokutil --sb-state" in f["fix"] and "nvidia-driver-580" in f["fix"]
    assert "dnf" not in f["fix"] and f["source"]


def test_vllm_on_native_windows_is_an_error(tmp_path):
    d = doctor(tmp_path, "os: Windows\npackages: {vllm: null}\n")
    f = d.of("cuda-mismatch", "vllm")
    assert f and f[0]["severity"] == "error" and "WSL 2" in f[0]["fix"]
    assert d.data["verdict"] == "fail"
    assert not doctor(tmp_path, "os: Linux (WSL2)\npackages: {vllm: null}\n").of(
        "cuda-mismatch", "vllm")


def test_tensorflow_gpu_on_macos_after_1_1(tmp_path):
    d = doctor(tmp_path, "os: macOS\nframeworks: {tensorflow: {version: '1.4.0', "
               "package: tensorflow-gpu}}\n")
    f = d.of("cuda-mismatch", "tensorflow")
    assert f and f[0]["severity"] == "warning" and "macOS" in f[0]["message"]
    d = doctor(tmp_path, "os: macOS\ngpus: [{name: NVIDIA GeForce GTX 1080 Ti}]\n"
               "frameworks: {tensorflow: {version: '1.4.0', package: tensorflow-gpu}}\n")
    assert d.of("cuda-mismatch", "tensorflow")[0]["severity"] == "error"
    assert not doctor(tmp_path, "os: macOS\nframeworks: {tensorflow: {version: '1.1.0', "
                      "package: tensorflow-gpu}}\n").of("cuda-mismatch", "tensorflow")
    assert not doctor(tmp_path, "os: macOS\nframeworks: {tensorflow: {version: '2.15.0'}}\n"
                      ).of("cuda-mismatch", "tensorflow")


def test_jax_plugin_of_unknown_version_says_the_pairing_rule(tmp_path):
    d = doctor(tmp_path, "frameworks:\n  jax: {version: '0.4.35', jaxlib: '0.4.35', "
               "plugin: jax-cuda12-plugin}\npackages: {jax: '0.4.35', jaxlib: '0.4.35', "
               "jax-cuda12-plugin: null}\n")
    f = [x for x in d.of("not-judged", "jax") if "jaxlib's own version" in x["message"]]
    assert f and 'pip install "jax[cuda12]==0.4.35"' in f[0]["fix"]


def test_jax_plugin_version_in_the_entry_is_compared(tmp_path):
    d = doctor(tmp_path, "frameworks:\n  jax: {version: '0.4.35', jaxlib: '0.4.35', "
               "plugin: jax-cuda12-plugin, plugin_version: '0.5.1'}\n")
    assert d.of("build-mismatch", "jax")


def test_dgl_graphbolt_per_torch_on_windows(tmp_path):
    d = doctor(tmp_path, "os: Windows 10\nframeworks: {torch: {version: '2.4.1'}}\n"
               "packages: {dgl: '2.2.1', torch: '2.4.1'}\n")
    f = d.of("build-mismatch", "dgl")
    assert f and f[0]["severity"] == "error" and "graphbolt_pytorch_2.4.1.dll" in f[0]["message"]
    assert "torch==2.1.*" in f[0]["fix"] and "dgl#7809" in f[0]["source"]


def test_dgl_graphbolt_covered_torch_is_fine(tmp_path):
    d = doctor(tmp_path, "os: Linux\nframeworks: {torch: {version: 2.3.1+cu121}}\n"
               "packages: {dgl: 2.2.1+cu121, torch: 2.3.1+cu121}\n")
    assert not [f for f in d.of("build-mismatch", "dgl") if "GraphBolt" in f["message"]]
