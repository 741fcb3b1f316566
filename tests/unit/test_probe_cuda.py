"""CUDA runtime and cuDNN probes: pip wheels, toolkits, ld cache, conda, loader order."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from dnnctl.doctor.detect import ldconfig_cache
from dnnctl.doctor.host import Host, run_command
from dnnctl.doctor.probe_cuda import pip_cuda_runtimes, probe_cudnn, system_cuda_runtimes


def _load_fakes():
    path = Path(__file__).resolve().parents[1] / "data" / "probes" / "fakes.py"
    if "dnnctl_probe_fakes" not in sys.modules:
        spec = importlib.util.spec_from_file_location("dnnctl_probe_fakes", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    return sys.modules["dnnctl_probe_fakes"]


fakes = _load_fakes()


def dists_of(host: Host):
    from dnnctl.doctor.probe_python import relevant

    return host.distributions(relevant)[0]


def by_source(components):
    return {c.source: c for c in components}


def test_h200_runtimes(tmp_path):
    host, runner, _ = fakes.h200_host(tmp_path)
    ld = ldconfig_cache(host)[0]
    rts = pip_cuda_runtimes(dists_of(host)) + system_cuda_runtimes(host, ld)
    assert [(c.version, c.source) for c in rts] == [
        ("13.0.96", "pip:nvidia-cuda-runtime"), ("13.0.96", "system:/usr/local/cuda-13.0")]
    assert rts[0].path.endswith("site-packages/nvidia/cu13/lib")
    assert not runner.ran("nvcc")  # /usr/local/cuda/bin/nvcc belongs to the listed toolkit


def test_toolkits_ldconfig_nvcc_and_conda(tmp_path):
    files = {
        "/usr/local/cuda-12.4/version.json": fakes.canned("version-12.4.json"),
        "/usr/local/cuda-12.4/bin/nvcc": None,
        "/usr/local/cuda": fakes.Link("cuda-12.4"),
        "/usr/local/cuda-10.2/version.txt": fakes.canned("version-10.2.txt"),
        "/usr/lib/x86_64-linux-gnu/libcudart.so.11.5.117": None,
        "/usr/lib/x86_64-linux-gnu/libcudart.so.11.0": fakes.Link("libcudart.so.11.5.117"),
        "/usr/bin/nvcc": None,
        "/opt/conda/envs/ml/conda-meta/cuda-cudart-12.1.105-0.json": "{}",
        "/opt/conda/envs/ml/conda-meta/python-3.11.9-h955ad1f_0.json": "{}",
    }
    runner = fakes.FakeRunner(commands={"nvcc": fakes.canned("nvcc-11.2.txt")})
    host = fakes.make_host(tmp_path, files=files, runner=runner, environ={
        "PATH": "/usr/bin", "CONDA_PREFIX": "/opt/conda/envs/ml"})
    host.path("/usr/bin/nvcc").chmod(0o755)
    ld = {"libcudart.so.11.0": ["/usr/lib/x86_64-linux-gnu/libcudart.so.11.0"],
          "libcudart.so.12": ["/usr/local/cuda-12.4/targets/x86_64-linux/lib/libcudart.so.12"]}
    got = by_source(system_cuda_runtimes(host, ld))
    assert got["system:/usr/local/cuda-12.4"].version == "12.4.1"
    assert got["system:/usr/local/cuda-10.2"].version == "10.2.89"
    assert got["system:ldconfig"].version == "11.5.117"
    assert got["nvcc:/usr/bin/nvcc"].version == "11.2.67"  # a distro nvcc, not the toolkit's
    assert got["conda:/opt/conda/envs/ml"].version == "12.1.105"
    assert len(got) == 5  # /usr/local/cuda collapsed onto cuda-12.4


def test_toolkit_version_from_dist_info_and_dir_name(tmp_path):
    files = {"/usr/local/cuda-13.0/lib/libcudart.so.13": None,
             "/usr/local/cuda-13.0/dist-info/nvidia_cuda_runtime-13.0.96.dist-info/METADATA": "",
             "/usr/local/cuda-11.8/bin/README": None}
    got = by_source(system_cuda_runtimes(fakes.make_host(tmp_path, files=files), {}))
    assert got["system:/usr/local/cuda-13.0"].version == "13.0.96"
    assert got["system:/usr/local/cuda-11.8"].version == "11.8"


def test_pip_cu12_layout(tmp_path):
    site = tmp_path / "site"
    fakes.make_dist(site, "nvidia-cuda-runtime-cu12", "12.1.105",
                    {"nvidia/cuda_runtime/lib/libcudart.so.12": None})
    host = fakes.make_host(tmp_path, site=site)
    (rt,) = pip_cuda_runtimes(dists_of(host))
    assert (rt.version, rt.source) == ("12.1.105", "pip:nvidia-cuda-runtime-cu12")
    assert rt.path == str(site / "nvidia/cuda_runtime/lib")


def test_h200_cudnn(tmp_path):
    host, _, _ = fakes.h200_host(tmp_path)
    copies, notes = probe_cudnn(host, dists_of(host), ldconfig_cache(host)[0])
    got = by_source(copies)
    pip = got["pip:nvidia-cudnn-cu13"]
    assert pip.version == "9.19.0.56" and pip.loaded_first is True
    assert pip.path.endswith("site-packages/nvidia/cudnn/lib/libcudnn.so.9")
    system = got["system:ldconfig"]
    assert system.path == "/lib/x86_64-linux-gnu/libcudnn.so.9"
    assert system.version is None and system.loaded_first is False
    assert any("libz.so.1" in n and "version unknown" in n for n in notes)


def _shadow_host(tmp_path, cudnn_answers):
    site = tmp_path / "site"
    fakes.make_dist(site, "nvidia-cudnn-cu12", "8.9.2.26",
                    {"nvidia/cudnn/lib/libcudnn.so.8": None,
                     "nvidia/cudnn/lib/libcudnn_ops_infer.so.8": None})
    files = {"/opt/cudnn-8.5/lib/libcudnn.so.8.5.0": None,
             "/opt/cudnn-8.5/lib/libcudnn.so.8": fakes.Link("libcudnn.so.8.5.0"),
             "/usr/lib/x86_64-linux-gnu/libcudnn.so.8.9.7": None,
             "/usr/lib/x86_64-linux-gnu/libcudnn.so.8": fakes.Link("libcudnn.so.8.9.7")}
    runner = fakes.FakeRunner(cudnn=cudnn_answers)
    return fakes.make_host(tmp_path, files=files, site=site, runner=runner,
                           environ={"LD_LIBRARY_PATH": "/opt/cudnn-8.5/lib:/nonexistent"})


LD8 = {"libcudnn.so.8": ["/usr/lib/x86_64-linux-gnu/libcudnn.so.8"]}


def test_ld_library_path_copy_shadows_the_bundled_one(tmp_path):
    host = _shadow_host(tmp_path, {"/opt/cudnn-8.5/lib/libcudnn.so.8.5.0": 8500,
                                   "nvidia/cudnn/lib/libcudnn.so.8": 8902,
                                   "/usr/lib/x86_64-linux-gnu/libcudnn.so.8.9.7": 8907})
    copies, notes = probe_cudnn(host, dists_of(host), LD8)
    assert [(c.source, c.version, c.loaded_first) for c in copies] == [
        ("env:LD_LIBRARY_PATH", "8.5.0", True),
        ("pip:nvidia-cudnn-cu12", "8.9.2.26", False),
        ("system:ldconfig", "8.9.7", False)]
    assert notes == []


def test_helper_crash_costs_only_that_library(tmp_path):
    host = _shadow_host(tmp_path, {"/opt/cudnn-8.5/lib/libcudnn.so.8.5.0": "crash",
                                   "nvidia/cudnn/lib/libcudnn.so.8": 8902,
                                   "/usr/lib/x86_64-linux-gnu/libcudnn.so.8.9.7": "hang"})
    copies, notes = probe_cudnn(host, dists_of(host), LD8)
    got = by_source(copies)
    assert got["env:LD_LIBRARY_PATH"].version == "8.5.0"  # from the real file name
    assert got["pip:nvidia-cudnn-cu12"].version == "8.9.2.26"  # asked in a second helper
    assert got["system:ldconfig"].version == "8.9.7"
    assert any("exit status -11" in n for n in notes)
    assert any("timed out" in n for n in notes)
    assert len(host.runner.calls) == 2  # [all three] crashed on the first, then [the rest]


def test_package_and_library_disagree(tmp_path):
    host = _shadow_host(tmp_path, {"nvidia/cudnn/lib/libcudnn.so.8": 8700})
    copies, notes = probe_cudnn(host, dists_of(host), {})
    assert by_source(copies)["pip:nvidia-cudnn-cu12"].version == "8.7.0"
    assert any("says 8.9.2.26 but the library reports 8.7.0" in n for n in notes)


def test_header_fallback_and_torch_bundled_copy(tmp_path):
    site = tmp_path / "site"
    fakes.make_dist(site, "torch", "1.13.1+cu117",
                    {"torch/version.py": "__version__ = '1.13.1+cu117'\ncuda = '11.7'\n",
                     "torch/lib/libcudnn.so.8": None})
    files = {"/usr/lib/x86_64-linux-gnu/libcudnn.so.8": None,
             "/usr/include/cudnn_version.h": fakes.canned("cudnn_version-8.9.7.h")}
    host = fakes.make_host(tmp_path, files=files, site=site, runner=fakes.FakeRunner(
        cudnn={"torch/lib/libcudnn.so.8": 8500}))
    copies, notes = probe_cudnn(host, dists_of(host), LD8)
    got = by_source(copies)
    assert got["torch:bundled"].version == "8.5.0" and got["torch:bundled"].loaded_first
    assert got["system:ldconfig"].version == "8.9.7"  # from /usr/include/cudnn_version.h
    assert len(notes) == 1 and "8.9.7" in notes[0]


def test_no_cudnn_means_no_helper(tmp_path):
    host = fakes.make_host(tmp_path)
    assert probe_cudnn(host, {}, {}) == ([], [])
    assert host.runner.calls == []


def test_real_helper_asks_real_libraries(tmp_path):
    """The subprocess helper, for real: one library answers, one aborts mid-way."""
    site = tmp_path / "site"
    fakes.make_dist(site, "nvidia-cudnn-cu13", "9.19.0.56", {})  # no RECORD entry: globbed
    good = fakes.compile_lib(site / "nvidia/cudnn/lib/libcudnn.so.9",
                             fakes.FAKE_LIBCUDNN.format(version=91900))
    if good is None:
        pytest.skip("no C compiler to build stand-in libraries")
    fakes.compile_lib(tmp_path / "root/opt/bad/libcudnn.so.9", fakes.CRASHING_LIBCUDNN)
    host = fakes.make_host(tmp_path, site=site, runner=run_command,
                           environ={"LD_LIBRARY_PATH": "/opt/bad"})
    host.python = sys.executable
    copies, notes = probe_cudnn(host, dists_of(host), {})
    got = by_source(copies)
    assert got["env:LD_LIBRARY_PATH"].version is None
    assert got["env:LD_LIBRARY_PATH"].loaded_first is True
    assert any("crashed" in n for n in notes)
    assert got["pip:nvidia-cudnn-cu13"].version == "9.19.0.56"  # the library said 91900
    assert got["pip:nvidia-cudnn-cu13"].loaded_first is False  # the broken one shadows it
