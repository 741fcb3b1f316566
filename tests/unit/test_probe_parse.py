"""The pure parsers behind doctor's probes, fed real tool outputs and garbage."""

from __future__ import annotations

from pathlib import Path

import pytest

from dnnctl.doctor import parse

DATA = Path(__file__).resolve().parents[1] / "data"


def canned(name: str) -> str:
    return (DATA / name).read_text(errors="replace")


@pytest.mark.parametrize(("name", "expected"), [
    ("h200-server/proc-driver-nvidia-version.txt", "580.159.04"),  # open kernel module
    ("probes/proc-version-550.txt", "550.90.07"),
    ("probes/proc-version-470.txt", "470.256.02"),
    ("probes/proc-version-open-aarch64.txt", "570.124.06"),
    ("probes/proc-version-garbage.txt", None),
])
def test_proc_driver_version(name, expected):
    assert parse.proc_driver_version(canned(name)) == expected


def test_sys_module_version():
    assert parse.sys_module_version(canned("h200-server/sys-module-nvidia-version.txt")) == \
        "580.159.04"
    assert parse.sys_module_version("not a version\n") is None
    assert parse.sys_module_version("") is None


@pytest.mark.parametrize(("name", "expected"), [
    ("h200-server/nvcc-version.txt", "13.0.88"),
    ("probes/nvcc-12.4.txt", "12.4.131"),
    ("probes/nvcc-11.2.txt", "11.2.67"),
    ("probes/nvcc-garbage.txt", None),
])
def test_nvcc_version(name, expected):
    assert parse.nvcc_version(canned(name)) == expected


def test_nvcc_release_only():
    assert parse.nvcc_version("Cuda compilation tools, release 10.1") == "10.1"


def test_version_files():
    assert parse.cuda_version_json(canned("probes/version-12.4.json")) == "12.4.1"
    assert parse.cuda_version_json(canned("probes/version-truncated.json")) is None
    assert parse.cuda_version_json('["not", "a", "dict"]') is None
    assert parse.cuda_version_json('{"cuda_cudart": {"version": "11.8.89"}}') == "11.8.89"
    assert parse.cuda_version_txt(canned("probes/version-10.2.txt")) == "10.2.89"
    assert parse.cuda_version_txt("garbage") is None


def test_ldconfig_h200():
    libs = parse.ldconfig_libs(canned("h200-server/ldconfig-p.txt"))
    assert libs["libcuda.so.1"] == ["/usr/local/nvidia/lib64/libcuda.so.1", "/lib/libcuda.so.1"]
    assert libs["libcudnn.so.9"] == ["/lib/x86_64-linux-gnu/libcudnn.so.9"]
    assert libs["libcudart.so.13"] == [
        "/usr/local/cuda/targets/x86_64-linux/lib/libcudart.so.13"]


def test_ldconfig_drops_32bit_and_garbage():
    libs = parse.ldconfig_libs(canned("probes/ldconfig-cudnn8-system.txt"))
    assert libs["libcuda.so.1"] == ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"]  # i386 dropped
    assert libs["libcudnn.so.8"] == ["/usr/lib/x86_64-linux-gnu/libcudnn.so.8"]
    assert not any("garbage" in k for k in libs)
    assert parse.ldconfig_libs("") == {}
    assert parse.ldconfig_libs("ldconfig: Can't open cache file /etc/ld.so.cache") == {}


@pytest.mark.parametrize(("value", "expected"), [
    (91900, "9.19.0"), (90100, "9.1.0"), (92600, "9.26.0"), (8907, "8.9.7"), (8500, "8.5.0"),
    (7605, "7.6.5"), ("91900", "9.19.0"), (0, None), (-1, None), ("x", None), (None, None),
])
def test_cudnn_int_version(value, expected):
    assert parse.cudnn_int_version(value) == expected


@pytest.mark.parametrize(("value", "expected"), [
    (13000, "13.0"), (12080, "12.8"), (11020, "11.2"), (13020, "13.2"), (0, None),
    (None, None), ("garbage", None),
])
def test_cuda_int_version(value, expected):
    assert parse.cuda_int_version(value) == expected


def test_version_tuple_is_numeric():
    assert parse.version_tuple("570.124.06") > parse.version_tuple("570.26")
    assert parse.version_tuple("2.2.0+cu121") == (2, 2, 0)
    assert parse.version_tuple("unknown") is None


@pytest.mark.parametrize(("tag", "cuda"), [
    ("cu121", "12.1"), ("cu130", "13.0"), ("cu118", "11.8"), ("cu92", "9.2"), ("cpu", None),
    ("rocm6.2", None), (None, None),
])
def test_cuda_from_tag(tag, cuda):
    assert parse.cuda_from_tag(tag) == cuda


def test_local_tag():
    assert parse.local_tag("2.11.0+cu130") == "cu130"
    assert parse.local_tag("2.11.0") is None


def test_soname_version():
    assert parse.soname_version("libcuda.so.580.159.04", "libcuda") == "580.159.04"
    assert parse.soname_version("libcudnn.so.8.9.7", "libcudnn") == "8.9.7"
    assert parse.soname_version("libcudnn.so.9", "libcudnn") == "9"
    assert parse.soname_version("libcudnn_ops.so.9", "libcudnn") is None


def test_torch_version_py_is_parsed_not_executed():
    fields = parse.py_assignments(canned("h200-server/python-meta.txt").split(
        "== torch/version.py\n")[1].split("\ntorch/lib:")[0])
    assert fields["__version__"] == "2.11.0+cu130"
    assert fields["cuda"] == "13.0"  # an annotated assignment
    assert fields["hip"] is None
    assert parse.py_assignments(canned("probes/torch-version-2.5.1-cpu.py.txt"))["cuda"] is None
    hostile = parse.py_assignments(canned("probes/torch-version-hostile.py.txt"))
    assert "__version__" not in hostile and "cuda" not in hostile
    assert parse.py_assignments("def broken(:\n") == {}


def test_tf_build_info():
    linux = parse.tf_build_info(canned("probes/tf-build-info-2.15.py.txt"))
    assert linux["cuda_version"] == "12.2" and linux["cudnn_version"] == "8"
    assert linux["cuda_compute_capabilities"][-1] == "compute_90"
    win = parse.tf_build_info(canned("probes/tf-build-info-win-2.10.py.txt"))
    assert parse.tf_version_field(win["cuda_version"]) == "11.2"
    assert parse.tf_version_field(win["cudnn_version"]) == "8"
    assert parse.tf_build_info(canned("probes/tf-build-info-cpu.py.txt"))["is_cuda_build"] is \
        False
    assert parse.tf_build_info("build_info = open('/etc/passwd').read()") == {}


def test_requirement_pins():
    reqs = ['nvidia-cudnn-cu13==9.19.0.56; platform_system == "Linux"',
            'cuda-toolkit[cublas,cudart]==13.0.2; platform_system == "Linux"',
            "triton==3.6.0", "filelock", "sympy>=1.13.3", 'pyyaml==6; extra == "pyyaml"']
    assert parse.requirement_pins(reqs) == {"nvidia-cudnn-cu13": "9.19.0.56",
                                            "cuda-toolkit": "13.0.2", "triton": "3.6.0"}


def test_nvidia_smi_query():
    rows = parse.nvidia_smi_query(canned("probes/nvidia-smi-query-8xh100.csv"))
    assert len(rows) == 8
    assert rows[0] == {"index": 0, "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
                       "memory_mib": 81559, "driver": "550.54.15",
                       "uuid": "GPU-5e4ab4d6-1b0c-6a51-ca14-ae5e1e1d8a16"}
    assert rows[7]["memory_mib"] is None  # "[N/A]"
    assert parse.nvidia_smi_query(canned("probes/nvidia-smi-failed.txt")) == []
    # with compute_mode asked for too: a seventh column, kept as nvidia-smi prints it
    seven = parse.nvidia_smi_query("0, Tesla V100-SXM2-16GB, 7.0, 16160 MiB, 535.183.01, "
                                   "GPU-1a2b, Exclusive_Process\n")
    assert seven[0]["compute_mode"] == "Exclusive_Process" and seven[0]["uuid"] == "GPU-1a2b"


def test_proc_gpu_information():
    assert parse.proc_gpu_information(canned("probes/proc-gpu-information-a100.txt")) == \
        {"name": "NVIDIA A100-SXM4-80GB", "minor": 0}


def test_cudnn_header():
    assert parse.cudnn_header_version(canned("probes/cudnn_version-8.9.7.h")) == "8.9.7"
    assert parse.cudnn_header_version("#define CUDNN_MAJOR 9\n") is None


def test_os_release():
    assert parse.os_release_name('NAME="Ubuntu"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\n') == \
        "Ubuntu 22.04.4 LTS"
    assert parse.os_release_name("PRETTY_NAME=\n") is None
    assert parse.canonical_name("Nvidia_CUDNN.cu12") == "nvidia-cudnn-cu12"
