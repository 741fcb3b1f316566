"""A fix that names another build must itself pass the doctor's checks here: the driver runs
its CUDA and it has code for every GPU; where no such build exists none is offered."""

from __future__ import annotations

from _doctor_helpers import doctor

T4_410 = 'driver: {version: "410.104"}\ngpus: [{name: Tesla T4}]\n'


def _driver_fix(d) -> str:
    found = d.of("driver-too-old", "torch")
    assert found, d.text
    return found[0]["fix"]


def test_older_cuda_alternative_is_of_the_same_line_and_runs_here(tmp_path) -> None:
    d = doctor(tmp_path, T4_410 + "frameworks: {torch: {version: 1.3.0, cuda: 10.1.243}}\n")
    fix = _driver_fix(d)
    assert "install NVIDIA driver >= 418.39" in fix
    assert "older CUDA: `pip install 'torch==1.3.*' --index-url " \
           "https://download.pytorch.org/whl/cu100`" in fix
    assert "CUDA 10.0, which this driver runs, with code for sm_75" in fix
    assert "2.15" not in fix and "580" not in fix


def test_a_conda_torch_gets_the_conda_command(tmp_path) -> None:
    d = doctor(tmp_path, T4_410 + "frameworks: {torch: {version: 1.3.0, cuda: 10.1.243}}\n"
               "packages: {pytorch: 1.3.0}\n")
    assert "`conda install pytorch=1.3 cudatoolkit=10.0 -c pytorch`" in _driver_fix(d)


def test_no_alternative_when_no_older_build_runs_here(tmp_path) -> None:
    # driver 450.51.05 is below the CUDA 11 minor-version floor (450.80.02): no torch build
    # for an older CUDA than 12.4 in the matrix runs on it
    d = doctor(tmp_path, 'driver: {version: "450.51.05"}\ngpus: [{name: NVIDIA A100-SXM4-80GB}]\n'
               "frameworks: {torch: {version: 2.5.1+cu124}}\n")
    fix = _driver_fix(d)
    assert "older CUDA" not in fix and fix.startswith("install NVIDIA driver >=")


def test_no_alternative_without_code_for_the_gpu(tmp_path) -> None:
    # CUDA 12.6 runs on driver 560, but no cu126 (or older) torch has code for sm_120
    d = doctor(tmp_path, 'driver: {version: "560.35.03"}\n'
               "gpus: [{name: NVIDIA GeForce RTX 5090}]\n"
               "frameworks: {torch: {version: 2.7.0+cu128}}\n")
    assert "older CUDA" not in d.fixes


def test_tensorflow_without_code_for_the_gpu_is_fixed_by_another_release(tmp_path) -> None:
    d = doctor(tmp_path, "gpus: [{name: GeForce RTX 3090}]\n"
               "cuda_runtimes: [{version: '11.1', source: 'system:/usr/local/cuda'}]\n"
               "frameworks: {tensorflow: {version: '1.14'}}\n")
    runtime = d.of("cuda-mismatch", "tensorflow")[0]["fix"]
    assert "install the CUDA 10.0 runtime" not in runtime
    assert runtime.startswith("install TensorFlow 2.") and "no code for sm_86" in runtime
    nokernel = [f for f in d.of("cudnn-mismatch") if "no kernels" in f["message"]]
    assert nokernel and nokernel[0]["fix"].startswith("install TensorFlow 2.")


def test_tensorflow_release_fix_says_the_driver_it_needs(tmp_path) -> None:
    # the first TensorFlow with sm_80 cubins (which run on sm_86) is 2.15, CUDA 12: driver 460
    # runs none of them, so the fix names the driver too
    d = doctor(tmp_path, 'driver: {version: "460.32.03"}\ngpus: [{name: GeForce RTX 3090}]\n'
               "frameworks: {tensorflow: {version: '1.14'}}\n")
    fixes = [f["fix"] for f in d.findings if (f["fix"] or "").startswith("install TensorFlow")]
    assert fixes and all("needs driver >= 525.60.13; this one is 460.32.03" in f for f in fixes)
    d = doctor(tmp_path, 'driver: {version: "580.65.06"}\ngpus: [{name: GeForce RTX 3090}]\n'
               "frameworks: {tensorflow: {version: '1.14'}}\n")
    fixes = [f["fix"] for f in d.findings if (f["fix"] or "").startswith("install TensorFlow")]
    assert fixes and all("needs driver" not in f for f in fixes)


def test_toolkit_fix_names_the_driver_its_oldest_release_needs(tmp_path) -> None:
    d = doctor(tmp_path, 'driver: {version: "367.44"}\ngpus: [{name: GeForce GTX 1070}]\n'
               "cuda_runtimes: [{version: '7.5', source: 'system:/usr/local/cuda'}]\n")
    fix = d.of("cuda-mismatch", "cuda")[0]["fix"]
    assert fix.startswith("use a CUDA toolkit >= 8.0 and <= 12.9")
    assert "CUDA 8.0 needs driver >= 367.48; this one is 367.44" in fix
    ok = doctor(tmp_path, 'driver: {version: "390.48"}\ngpus: [{name: GeForce GTX 1070}]\n'
                "cuda_runtimes: [{version: '7.5', source: 'system:/usr/local/cuda'}]\n")
    assert "driver" not in ok.of("cuda-mismatch", "cuda")[0]["fix"]


def test_cuda_python_alternative_only_when_the_driver_runs_the_older_major(tmp_path) -> None:
    d = doctor(tmp_path, 'driver: {version: "470.82.01"}\ngpus: [{name: Tesla T4}]\n'
               "packages: {cuda-python: 12.4.0}\n")
    assert "cuda-python<12" in d.of("driver-too-old", "cuda-python")[0]["fix"]
    d = doctor(tmp_path, 'driver: {version: "418.39"}\ngpus: [{name: Tesla T4}]\n'
               "packages: {cuda-python: 12.4.0}\n")
    assert "cuda-python<12" not in d.of("driver-too-old", "cuda-python")[0]["fix"]
