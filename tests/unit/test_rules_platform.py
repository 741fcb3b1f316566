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
    # with no GPU in view it is an ok finding, which carries no fix
    assert "CPU-only" in bare[0].message and bare[0].code == "ok" and bare[0].fix is None
    mac = judge(EnvSnapshot(os="Darwin 23.1.0 arm64", gpus=RTX3060, frameworks={"torch": torch}),
                m)
    assert ("warning", "cuda-mismatch") in _of(mac, "torch")
    # on Linux (or an unstated OS) PyPI's wheel is the CUDA one; a known CUDA is not a guess
    for env in (EnvSnapshot(os=WSL, gpus=RTX3060, frameworks={"torch": torch}),
                EnvSnapshot(gpus=RTX3060, frameworks={"torch": torch}),
                EnvSnapshot(os="Windows", gpus=RTX3060, frameworks={"torch": {
                    "version": "2.3.1", "cuda": "12.1"}})):
        got = [x for x in _of(judge(env, m), "torch") if x != ("warning", "platform-unsupported")]
        assert got == [("info", "ok")], env.os


WSL1 = "Ubuntu 18.04.6 LTS; Linux 4.4.0-19041-Microsoft x86_64; WSL1"


def test_no_driver_in_wsl_never_suggests_a_linux_driver(m) -> None:
    for os_name, want in ((WSL, "wsl --update"), ("Ubuntu on WSL", "wsl -l -v")):
        env = EnvSnapshot(os=os_name, driver={"present": False})
        f = [x for x in judge(env, m) if x.code == "no-driver"]
        assert len(f) == 1 and want in f[0].fix and "NVIDIA driver for Windows" in f[0].fix
        assert "apt install" not in f[0].fix and "wsl-user-guide" in f[0].source
    # off WSL the Linux driver install stays the fix
    env = EnvSnapshot(os="Ubuntu 22.04; Linux 6.8.0-49-generic x86_64", driver={"present": False})
    assert "sudo apt install nvidia-driver-580" in judge(env, m)[0].fix


def test_wsl1_is_an_error_whatever_the_snapshot_says_of_the_driver(m) -> None:
    # the kernel says WSL 1 even where an older detection labelled it "WSL2"
    for os_name in (WSL1, WSL1.replace("WSL1", "WSL2"), "Ubuntu 18.04 on WSL 1"):
        for driver in ({"present": False}, None):
            f = [x for x in judge(EnvSnapshot(os=os_name, driver=driver), m)
                 if x.severity == "error"]
            assert [(x.code, x.component) for x in f] == [("no-driver", "driver")], os_name
            assert "WSL 1" in f[0].message and "wsl --set-version <distro> 2" in f[0].fix
            assert "microsoft/WSL#5554" in f[0].source
    # WSL 2 with its driver working is not touched
    env = EnvSnapshot(os=WSL, driver={"version": "576.02"}, gpus=RTX3060)
    assert not [x for x in judge(env, m) if x.severity == "error"]


def test_no_driver_in_a_container_leads_with_gpus_all(m) -> None:
    env = EnvSnapshot(os="Ubuntu 22.04; Linux 6.8.0 x86_64; container",
                      driver={"present": False})
    f = judge(env, m)[0]
    assert f.code == "no-driver" and "--gpus all" in f.fix
    assert "`sudo docker run --rm --runtime=nvidia --gpus all ubuntu nvidia-smi`" in f.fix
    assert "apt install" not in f.fix and "container-toolkit" in f.source


def test_jax_without_a_plugin_is_never_judged_as_if_one_were_there(m) -> None:
    jax = {"version": "0.5.3", "jaxlib": "0.5.3"}
    pkgs = {"jax": "0.5.3", "jaxlib": "0.5.3"}
    env = EnvSnapshot(os="Linux", driver={"version": "550.144.03"}, frameworks={"jax": jax},
                      packages=pkgs)
    f = [x for x in judge(env, m) if x.component == "jax"]
    assert [(x.severity, x.code) for x in f] == [("warning", "cuda-mismatch")]
    assert "CPU-only" in f[0].message and 'jax[cuda12]==0.5.3' in f[0].fix
    # a listed plugin is judged as before
    env.packages = {**pkgs, "jax-cuda12-plugin": "0.5.3"}
    env.frameworks = {"jax": {**jax, "plugin": "jax-cuda12-plugin"}}
    assert not [x for x in judge(env, m) if x.component == "jax" and x.severity != "info"]
    # nothing listed: unknown, not "no problem found" through the only plugin row
    env.packages, env.frameworks = {}, {"jax": jax}
    f = [x for x in judge(env, m) if x.component == "jax"]
    assert [(x.severity, x.code) for x in f] == [("warning", "unknown-version")]
    # a CUDA 13-capable driver gets the cuda13 plugin where the release has one
    env = EnvSnapshot(os="Linux", driver={"version": "580.95.05"}, frameworks={"jax": {
        "version": "0.8.0", "jaxlib": "0.8.0"}}, packages={"jax": "0.8.0", "jaxlib": "0.8.0"})
    f = [x for x in judge(env, m) if x.component == "jax"]
    assert 'jax[cuda13]==0.8.0' in f[0].fix


def test_framework_without_a_version_is_judged_on_its_build(m) -> None:
    t4 = [Gpu(name="Tesla T4")]
    env = EnvSnapshot(os="Linux", gpus=t4, frameworks={"torch": {"local_tag": "rocm6.0"}})
    f = [x for x in judge(env, m) if x.component == "torch"]
    assert [(x.severity, x.code) for x in f] == [("error", "cuda-mismatch")]
    assert "ROCm" in f[0].message and "modal-examples#681" in f[0].source
    env.frameworks = {"torch": {"cuda": "12.1"}}  # nothing decisive: said, not passed
    f = [x for x in judge(env, m) if x.component == "torch"]
    assert [(x.severity, x.code) for x in f] == [("info", "not-judged")]
    assert "not checked" in f[0].message
