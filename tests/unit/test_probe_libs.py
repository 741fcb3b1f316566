"""cuBLAS / NCCL copies found on a canned filesystem, the loader order, and the verdict."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import probe_fakes

from dnnctl.compat.matrix import load_matrix
from dnnctl.doctor.model import EnvSnapshot, Gpu
from dnnctl.doctor.probe_libs import probe_libraries
from dnnctl.doctor.rules import judge

_fakes = probe_fakes


def _host(tmp_path: Path):
    fakes = _fakes()
    files = {"/usr/local/cuda-12.1/lib64/libcublas.so.12.1.3.1": None,
             "/usr/local/cuda-12.1/lib64/libcublas.so.12": fakes.Link("libcublas.so.12.1.3.1"),
             "/usr/lib/x86_64-linux-gnu/libnccl.so.2.18.1": None,
             "/usr/lib/x86_64-linux-gnu/libnccl.so.2": fakes.Link("libnccl.so.2.18.1")}
    host = fakes.make_host(tmp_path, files=files, environ={
        "PATH": "/usr/bin", "LD_LIBRARY_PATH": "/usr/local/cuda-12.1/lib64"})
    site = tmp_path / "site"
    fakes.make_dist(site, "nvidia-cublas-cu12", "12.4.5.8",
                    {"nvidia/cublas/lib/libcublas.so.12": None})
    fakes.make_dist(site, "nvidia-nccl-cu12", "2.21.5", {"nvidia/nccl/lib/libnccl.so.2": None})
    return host


def test_copies_versions_and_order(tmp_path: Path) -> None:
    host = _host(tmp_path)
    dists, _ = host.distributions(lambda n: n.startswith("nvidia-"))
    ld = {"libnccl.so.2": ["/usr/lib/x86_64-linux-gnu/libnccl.so.2"]}
    libs = probe_libraries(host, dists, ld)
    cublas = [(c.version, c.source, c.loaded_first) for c in libs["cublas"]]
    assert cublas == [("12.1.3.1", "env:LD_LIBRARY_PATH", True),
                      ("12.4.5.8", "pip:nvidia-cublas-cu12", False)]
    nccl = [(c.version, c.source, c.loaded_first) for c in libs["nccl"]]
    assert nccl == [("2.21.5", "pip:nvidia-nccl-cu12", True),
                    ("2.18.1", "system:ldconfig", False)]
    env = EnvSnapshot(driver={"version": "570.124.06"}, gpus=[Gpu(name="NVIDIA H100 80GB HBM3")],
                      libraries=libs, frameworks={"torch": {"version": "2.5.1+cu124"}})
    shadowed = [f for f in judge(env, load_matrix()) if f.code == "library-shadowed"]
    assert [(f.component, f.severity) for f in shadowed] == [("cublas", "error")]
    assert "/usr/local/cuda-12.1/lib64" in (shadowed[0].fix or "")


def test_nvjitlink_copies_and_the_toolkit_one_first(tmp_path: Path) -> None:
    fakes = _fakes()
    files = {"/usr/local/cuda-12.1/lib64/libnvJitLink.so.12.1.105": None,
             "/usr/local/cuda-12.1/lib64/libnvJitLink.so.12":
                 fakes.Link("libnvJitLink.so.12.1.105")}
    host = fakes.make_host(tmp_path, files=files, environ={
        "PATH": "/usr/bin", "LD_LIBRARY_PATH": "/usr/local/cuda-12.1/lib64"})
    fakes.make_dist(tmp_path / "site", "nvidia-nvjitlink-cu12", "12.9.41",
                    {"nvidia/nvjitlink/lib/libnvJitLink.so.12": None})
    dists, _ = host.distributions(lambda n: n.startswith("nvidia-"))
    libs = probe_libraries(host, dists, {})
    assert [(c.version, c.source, c.loaded_first) for c in libs["nvjitlink"]] == [
        ("12.1.105", "env:LD_LIBRARY_PATH", True), ("12.9.41", "pip:nvidia-nvjitlink-cu12", False)]
    env = EnvSnapshot(driver={"version": "570.124.06"}, gpus=[Gpu(name="NVIDIA H100 80GB HBM3")],
                      libraries=libs, packages={"nvidia-cusparse-cu12": "12.5.9.5"})
    found = [(f.component, f.severity, f.code) for f in judge(env, load_matrix())
             if f.component == "nvjitlink"]
    assert found == [("nvjitlink", "error", "library-shadowed")]
