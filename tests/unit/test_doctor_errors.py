"""Error messages a user saw (snapshot ``errors``): what each means, and the cause where the
rest of the snapshot decides it, through the real `dnnctl doctor --from`."""

from __future__ import annotations

import json

from _doctor_helpers import doctor

NO_KERNEL = "RuntimeError: CUDA error: no kernel image is available for execution on the device"


def _errors(*messages: str) -> str:
    return "errors:\n" + "".join(f"  - {json.dumps(m)}\n" for m in messages)


def test_an_error_another_finding_explains_points_at_it_and_adds_no_error(tmp_path):
    d = doctor(tmp_path, "gpus: [{name: NVIDIA GeForce GTX 1080}]\ndriver: {version: 570.124.06}\n"
               "frameworks: {torch: {version: 2.8.0+cu128}}\n" + _errors(NO_KERNEL))
    [f] = d.of("error-message", "errors")
    assert f["severity"] == "info" and f["evidence"]["error_row"] == "no-kernel-image"
    assert f["evidence"]["see"] == ["arch-unsupported (torch)"]
    assert "Cause here: the framework build has no code for the GPU" in f["message"]
    assert "(see [arch-unsupported] under torch)" in f["message"]
    n_errors = sum(x["severity"] == "error" for x in d.findings)
    assert n_errors == len(d.of("arch-unsupported")) == 1  # the cause, once
    assert "→ errors" in d.text and "✓ errors" not in d.text


def test_the_extension_not_the_framework_when_torch_has_code(tmp_path):
    """torch 2.5.1+cu124 carries sm_86; detectron2 built for sm_75 only does not."""
    d = doctor(tmp_path, "gpus: [{name: NVIDIA GeForce RTX 3090}]\ndriver: {version: 570.124.06}\n"
               "frameworks: {torch: {version: 2.5.1+cu124}}\n"
               "extensions: {detectron2: {version: '0.6', arch_list: [sm_75]}}\n"
               + _errors(NO_KERNEL))
    [f] = d.of("error-message", "errors")
    assert f["severity"] == "error"
    assert "detectron2 (sm_75) has no code for sm_86" in f["message"]
    assert "torch" not in f["message"].split("Cause here:")[1]
    assert "rebuild the extension on this machine" in f["fix"]


def test_the_compute_capability_the_message_names_decides_when_no_gpu_is_given(tmp_path):
    msg = ("Found GPU0 Tesla K40m which is of cuda capability 3.5. PyTorch no longer supports "
           "this GPU because it is too old. The minimum cuda capability supported by this "
           "library is 3.7.")
    d = doctor(tmp_path, "frameworks: {torch: {version: 2.5.1+cu124}}\n" + _errors(msg))
    [f] = d.of("error-message", "errors")
    assert f["severity"] == "error" and f["evidence"]["cc"] == "3.5"
    assert "given the compute capability 3.5 the message names" in f["message"]
    assert "no code for" in f["message"] and "sm_35" in f["message"]
    assert f["fix"] and "torch" in f["fix"]
    assert d.of("arch-unsupported") == []  # the snapshot itself names no GPU: no such finding


def test_the_driver_version_torch_reports_names_the_upgrade(tmp_path):
    msg = ("The NVIDIA driver on your system is too old (found version 11040). Please update "
           "your GPU driver")
    d = doctor(tmp_path, "gpus: [{name: NVIDIA GeForce RTX 3090}]\n"
               "frameworks: {torch: {version: 2.1.0+cu121}}\n" + _errors(msg))
    [f] = d.of("error-message", "errors")
    assert f["severity"] == "error" and f["evidence"]["driver_cuda"] == "11040"
    assert "the driver's CUDA 11.4 the message names" in f["message"]
    assert "driver" in f["fix"] and ">=" in f["fix"]


def test_a_driver_older_than_the_runtime_with_the_snapshots_own_versions(tmp_path):
    d = doctor(tmp_path, "gpus: [{name: NVIDIA GeForce RTX 3090}]\n"
               "driver: {version: 470.256.02}\nframeworks: {torch: {version: 2.1.0+cu121}}\n"
               + _errors("CUDA driver version is insufficient for CUDA runtime version"))
    [f] = d.of("error-message", "errors")
    assert f["evidence"]["error_row"] == "driver-insufficient"
    assert f["severity"] == "info" and "driver-too-old" in f["evidence"]["see"][0]


def test_nvcc_older_than_the_architecture_it_was_asked_for(tmp_path):
    """No GPU named (a build machine): the message's architecture against the toolkit."""
    d = doctor(tmp_path, "cuda_runtimes: [{version: '11.3', source: 'nvcc:/usr/local/cuda/bin/nvcc'}]\n"
               + _errors("nvcc fatal   : Unsupported gpu architecture 'compute_89'"))
    [f] = d.of("error-message", "errors")
    assert f["severity"] == "error" and f["evidence"]["arch"] == "compute_89"
    assert "nvcc of CUDA 11.3 is older than sm_89: CUDA 11.8 is the first release" in f["message"]
    assert "CUDA 11.8 or newer toolkit" in f["fix"]


def test_a_toolkit_that_can_target_it_rules_that_cause_out(tmp_path):
    d = doctor(tmp_path, "cuda_runtimes: [{version: '12.4', source: 'nvcc:/usr/bin/nvcc'}]\n"
               + _errors("nvcc fatal : Unsupported gpu architecture 'compute_89'"))
    [f] = d.of("error-message", "errors")
    assert f["severity"] == "warning"
    assert "Ruled out here: the CUDA toolkit (nvcc) here cannot target compute_89" in f["message"]
    assert "another nvcc runs the build" in f["message"]
    assert "(1) the build was told to target compute_89" in f["message"]


def test_a_host_compiler_newer_than_nvcc_accepts(tmp_path):
    d = doctor(tmp_path, "toolchain: {gcc: 12.3.0}\n" + _errors(
        "#error -- unsupported GNU version! gcc versions later than 10 are not supported!"))
    [f] = d.of("error-message", "errors")
    assert f["severity"] == "error" and "gcc 12.3.0 is newer than gcc 10" in f["message"]
    assert "CUDAHOSTCXX" in f["fix"]


def test_cudnn_of_the_major_asked_for_is_not_installed(tmp_path):
    msg = ("Could not load library libcudnn_ops_infer.so.8. Error: libcudnn_ops_infer.so.8: "
           "cannot open shared object file: No such file or directory")
    d = doctor(tmp_path, "frameworks: {torch: {version: 2.5.1+cu124}}\n"
               "cudnn: [{version: 9.1.0.70, source: 'pip:nvidia-cudnn-cu12'}]\n"
               "packages: {ctranslate2: 4.4.0, faster-whisper: 1.0.3}\n" + _errors(msg))
    [f] = d.of("error-message", "errors")
    assert f["evidence"]["major"] == "8" and f["evidence"]["lib"] == "libcudnn_ops_infer"
    assert f["severity"] == "info" and f["evidence"]["see"] == ["cudnn-mismatch (ctranslate2)"]
    assert "Cause here: no cuDNN 8 is installed" in f["message"]
    assert f["fix"] == "follow the fix of [cudnn-mismatch] under ctranslate2"
    # without the package that needs it, the snapshot's copies alone decide it
    d = doctor(tmp_path, "frameworks: {torch: {version: 2.5.1+cu124}}\n"
               "cudnn: [{version: 9.1.0.70, source: 'pip:nvidia-cudnn-cu12'}]\n" + _errors(msg))
    [f] = d.of("error-message", "errors")
    assert f["severity"] == "error"
    assert "no cudnn 8 is installed here (only 9.1.0.70 (pip:nvidia-cudnn-cu12)" in f["message"]
    assert "pip install nvidia-cudnn-cuNN==8.*" in f["fix"]


def test_cudnn_of_that_major_present_points_at_the_search_path(tmp_path):
    msg = "libcudnn.so.8: cannot open shared object file: No such file or directory"
    d = doctor(tmp_path, "cudnn: [{version: 8.9.7, source: 'conda:/opt/env'}]\n" + _errors(msg))
    [f] = d.of("error-message", "errors")
    assert f["severity"] == "warning"
    assert "Likely here: a cuDNN 8 is installed but not where the loader looks" in f["message"]
    assert "Ruled out here: no cuDNN 8 is installed" in f["message"]
    assert "LD_LIBRARY_PATH" in f["fix"]


def test_nccl_on_windows_is_gloo_and_on_linux_the_os_is_ruled_out(tmp_path):
    msg = "RuntimeError: Distributed package doesn't have NCCL built in"
    win = doctor(tmp_path, "os: Windows 11\ngpus: [{name: NVIDIA GeForce RTX 4080}]\n"
                 + _errors(msg))
    [f] = win.of("error-message", "errors")
    assert f["severity"] == "error" and "this is native Windows" in f["message"]
    assert "backend='gloo'" in f["fix"]
    lin = doctor(tmp_path, "os: Ubuntu 22.04 (Linux)\n"
                 "frameworks: {torch: {version: 2.3.0+cpu}}\n" + _errors(msg))
    [g] = lin.of("error-message", "errors")
    assert g["severity"] == "error" and "torch 2.3.0+cpu is a CPU-only build" in g["message"]
    assert "this is Linux" not in g["message"]  # a decided cause lists no ruled-out ones


def test_undecided_errors_list_their_causes_and_how_to_tell_them(tmp_path):
    d = doctor(tmp_path, "gpus: [{name: NVIDIA A100-SXM4-80GB}]\n"
               + _errors("RuntimeError: CUDA error: an illegal memory access was encountered"))
    [f] = d.of("error-message", "errors")
    assert f["severity"] == "warning" and f["evidence"]["candidates"] == 2
    assert "Possible causes the snapshot does not decide: (1) a bug or bad input" in f["message"]
    assert "check: CUDA_LAUNCH_BLOCKING=1" in f["message"]
    assert d.data["verdict"] == "warn"


def test_an_unknown_message_is_not_recognized_never_guessed(tmp_path):
    d = doctor(tmp_path, "gpus: [{name: NVIDIA A100-SXM4-80GB}]\n"
               + _errors("Segmentation fault (core dumped)"))
    [f] = d.of("not-judged", "errors")
    assert f["severity"] == "info"
    assert "is not in the error catalogue (compat/errors.yaml)" in f["message"]
    assert d.of("error-message") == []
    assert "? 'Segmentation fault (core dumped)' is not in the error" in d.text


def test_the_same_message_twice_is_judged_once(tmp_path):
    d = doctor(tmp_path, _errors("CUDA error: out of memory", "CUDA error:  out of memory"))
    assert len(d.of("error-message", "errors")) == 1


def test_no_errors_no_block(tmp_path):
    d = doctor(tmp_path, "gpus: [{name: NVIDIA A100-SXM4-80GB}]\n")
    assert not [f for f in d.findings if f["component"] == "errors"]
    assert "errors " not in d.text


def test_before_cuda_11_a_library_file_names_its_minor(tmp_path):
    """libcudart.so.10.0 is not in CUDA 10.1 (whose file is libcudart.so.10.1); from CUDA 11
    one file serves the major (libcudart.so.11.0 for every 11.x)."""
    old = doctor(tmp_path, "cuda_runtimes: [{version: 10.1.105, source: 'system:/opt/cuda'}]\n"
                 + _errors("libcudart.so.10.0 => not found"))
    [f] = old.of("error-message", "errors")
    assert f["severity"] == "error" and "no cudart 10.0 is installed here" in f["message"]
    new = doctor(tmp_path, "cuda_runtimes: [{version: 11.8.89, source: 'system:/opt/cuda'}]\n"
                 + _errors("libcudart.so.11.0: cannot open shared object file"))
    [g] = new.of("error-message", "errors")
    assert g["severity"] == "warning" and "Likely here: a copy of that release is installed" \
        in g["message"] and "a cudart 11 copy is here (11.8.89" in g["message"]


def test_a_message_naming_no_version_is_judged_on_any_copy(tmp_path):
    d = doctor(tmp_path, "cudnn: [{version: 7.6.5, source: 'system:/usr/local/cuda'}]\n"
               + _errors("Error: Cannot load cudnn shared library. Cannot invoke method "
                         "cudnnGetVersion"))
    [f] = d.of("error-message", "errors")
    assert "Likely here: a cuDNN of that major is installed but not where the loader looks" \
        in f["message"] and "(a cudnn copy is here (7.6.5" in f["message"]
    assert "LD_LIBRARY_PATH" in f["fix"]


def test_two_messages_of_one_row_are_judged_once(tmp_path):
    d = doctor(tmp_path, "os: Ubuntu 18.04 (docker container)\n" + _errors(
        "NCCL WARN Call to posix_fallocate failed: No space left on device",
        "NCCL WARN Error while creating shared memory segment nccl-shm-recv-1 (size 9637888)"))
    [f] = d.of("error-message", "errors")
    assert f["evidence"]["messages"] == 2
    assert "(also: 'NCCL WARN Error while creating shared memory segment" in f["message"]
    assert "Likely here: /dev/shm is too small" in f["message"] and "--shm-size=1g" in f["fix"]


def test_a_soft_fact_makes_a_cause_likely_never_certain(tmp_path):
    """Windows alone does not prove a CPU-only xgboost (pip's Windows wheels have CUDA)."""
    d = doctor(tmp_path, "os: Windows 10\n"
               + _errors("XGBoost version not compiled with GPU support"))
    [f] = d.of("error-message", "errors")
    assert f["severity"] == "warning" and "Likely here: a CPU-only xgboost" in f["message"]
    assert "pip install xgboost" in f["fix"]


def test_a_message_that_states_its_cause_is_an_error_without_other_facts(tmp_path):
    d = doctor(tmp_path, _errors("ERROR: modpost: GPL-incompatible module nvidia.ko uses "
                                 "GPL-only symbol 'rcu_read_unlock_strict'"))
    [f] = d.of("error-message", "errors")
    assert f["severity"] == "error" and "the message says so" in f["message"]
    assert "535.183.08" in f["fix"]


def test_a_finding_cited_by_evidence_key_is_the_one_pointed_at(tmp_path):
    """The toolkit-vs-GPU warning (its evidence names the compute capability) explains an nvcc
    architecture error; the toolkit-vs-torch one (evidence torch_cuda) would not."""
    d = doctor(tmp_path, "gpus: [{name: NVIDIA GeForce RTX 4090}]\n"
               "cuda_runtimes: [{version: '11.3', source: 'nvcc:/usr/local/cuda/bin/nvcc'}]\n"
               + _errors("nvcc fatal   : Unsupported gpu architecture 'compute_89'"))
    [f] = d.of("error-message", "errors")
    assert f["severity"] == "info" and f["evidence"]["see"] == ["cuda-mismatch (cuda)"]


def test_cuinit_unknown_error_is_the_suspend_cause_where_the_driver_lists_gpus(tmp_path):
    """The message's CUDA_ERROR_UNKNOWN is what the cuInit rule reads (driver.cuinit)."""
    msg = "failed call to cuInit: CUDA_ERROR_UNKNOWN: unknown error"
    d = doctor(tmp_path, "os: Ubuntu 22.04\ndriver: {version: 535.113.01}\n"
               "gpus: [{name: NVIDIA GeForce RTX 3090}]\n" + _errors(msg))
    [f] = d.of("error-message", "errors")
    assert f["severity"] == "error"
    assert "given cuInit's CUDA_ERROR_UNKNOWN the message names" in f["message"]
    assert "nvidia_uvm" in f["fix"]
    assert d.of("cuda-init") == []  # the snapshot alone says nothing of cuInit
    # a stub libcuda the snapshot shows explains it: nothing is implied then
    stub = doctor(tmp_path, "os: Ubuntu 22.04\ndriver: {version: 535.113.01, libcuda: "
                  "/usr/local/cuda/lib64/stubs/libcuda.so}\ngpus: [{name: NVIDIA GeForce RTX "
                  "3090}]\n" + _errors(msg))
    [g] = stub.of("error-message", "errors")
    assert g["severity"] == "info" and g["evidence"]["see"] == ["libcuda-stub (driver)"]


def test_a_conditional_finding_is_confirmed_only_as_far_as_the_message_proves(tmp_path):
    """An OOM in WSL 2 fits the pinned-memory condition but does not prove it (a model may
    simply not fit): likely, a warning; NCCL's shm messages do prove theirs: an error."""
    d = doctor(tmp_path, "os: Ubuntu 22.04 (WSL2, Linux 5.15.90.1-microsoft-standard-WSL2)\n"
               "gpus: [{name: NVIDIA GeForce RTX 3050}]\ndriver: {version: 531.79}\n"
               "frameworks: {llama-cpp-python: {version: 0.1.50, cuda_build: true}}\n"
               + _errors("CUDA error 2 at ggml-cuda.cu:359: out of memory"))
    [f] = d.of("error-message", "errors")
    assert f["severity"] == "warning" and f["evidence"]["confirms"] == [
        "pinned-memory (llama-cpp-python)"]
    assert "the message fits the condition of [pinned-memory]" in f["message"]
    assert "GGML_CUDA_NO_PINNED=1" in f["fix"]
