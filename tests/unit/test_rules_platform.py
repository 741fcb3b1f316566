"""What the operating system decides: no TensorFlow GPU on native Windows after 2.10, PyPI's
torch is CPU-only on Windows and macOS, and a CPU-only build is never judged for GPU code."""

from __future__ import annotations

import pytest

from dnnctl.compat.matrix import load_matrix
from dnnctl.doctor.model import EnvSnapshot, Gpu
from dnnctl.doctor.rules import judge

RTX3060 = [Gpu(name="NVIDIA GeForce RTX 3060")]
WSL = "Ubuntu 22.04.3 LTS; Linux 5.15.153.1-microsoft-standard-WSL2 x86_64; WSL2"


@pytest.fixture(scope="module")
def m():
    return load_matrix()


def _of(findings, component):
    return [(f.severity, f.code) for f in findings if f.component == component]


def test_tensorflow_after_210_has_no_gpu_on_native_windows(m) -> None:
    for os_name in ("Windows 10", "Windows-11-10.0.26200-SP0", "Windows 10 AMD64"):
        env = EnvSnapshot(os=os_name, gpus=RTX3060, frameworks={"tensorflow": {
            "version": "2.16.1"}})
        f = [x for x in judge(env, m) if x.component == "tensorflow"]
        assert [(x.severity, x.code) for x in f] == [("error", "cuda-mismatch")], os_name
        assert "native Windows" in f[0].message and "WSL2" in f[0].fix
        assert 'tensorflow==2.10.*' in f[0].fix and "CUDA 11.2" in f[0].fix
        assert "v2.11.1" in f[0].source
    # 2.10 still had it, and WSL2 is Linux (the GPU works there)
    for os_name, version in (("Windows 10", "2.10.1"), (WSL, "2.16.1")):
        env = EnvSnapshot(os=os_name, gpus=RTX3060, frameworks={"tensorflow": {
            "version": version}})
        assert ("error", "cuda-mismatch") not in _of(judge(env, m), "tensorflow"), os_name


def test_cpu_only_tensorflow_is_said_so_not_judged_for_gpu_code(m) -> None:
    env = EnvSnapshot(os="Ubuntu 22.04; Linux 5.15 x86_64", gpus=[Gpu(name="NVIDIA H100 PCIe")],
                      frameworks={"tensorflow": {"version": "2.15.1", "cuda_build": False,
                                                 "package": "tensorflow-cpu"}})
    f = [x for x in judge(env, m) if x.component == "tensorflow"]
    # not "reaches H100 only by JIT-compiling PTX": a CPU build has no GPU code at all
    assert [(x.severity, x.code) for x in f] == [("warning", "cuda-mismatch")]
    assert "CPU-only" in f[0].message and "tensorflow[and-cuda]==2.15.*" in f[0].fix
    env.gpus = []
    f = [x for x in judge(env, m) if x.component == "tensorflow"]
    assert [(x.severity, x.code) for x in f] == [("info", "ok")] and "CPU-only" in f[0].message


def test_pypi_torch_without_a_tag_is_cpu_only_off_linux(m) -> None:
    torch = {"version": "2.3.1", "installer": "pip"}
    win = judge(EnvSnapshot(os="Windows", gpus=RTX3060, frameworks={"torch": torch}), m)
    f = [x for x in win if x.component == "torch"]
    assert [(x.severity, x.code) for x in f] == [("warning", "cuda-mismatch")]
    assert "CPU-only" in f[0].message and "--index-url https://download.pytorch.org/whl/cu" \
        in f[0].fix and "docs.astral.sh/uv" in f[0].source
    bare = [x for x in judge(EnvSnapshot(os="Windows", frameworks={"torch": torch}), m)
            if x.component == "torch"]
    assert "CPU-only" in bare[0].message and "whl/cu121" in bare[0].fix  # 2.3's CUDA wheel
    mac = judge(EnvSnapshot(os="Darwin 23.1.0 arm64", gpus=RTX3060, frameworks={"torch": torch}),
                m)
    assert ("warning", "cuda-mismatch") in _of(mac, "torch")
    # on Linux (or an unstated OS) PyPI's wheel is the CUDA one; a known CUDA is not a guess
    for env in (EnvSnapshot(os=WSL, gpus=RTX3060, frameworks={"torch": torch}),
                EnvSnapshot(gpus=RTX3060, frameworks={"torch": torch}),
                EnvSnapshot(os="Windows", gpus=RTX3060, frameworks={"torch": {
                    "version": "2.3.1", "cuda": "12.1"}})):
        assert _of(judge(env, m), "torch") == [("info", "ok")], env.os
