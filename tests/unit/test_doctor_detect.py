"""``detect()`` end to end: the H200 server replayed, and this machine for real."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import sys
from pathlib import Path

import pytest

from dnnctl.doctor.detect import detect, ldconfig_cache, os_name
from dnnctl.doctor.envfile import load_env, save_env
from dnnctl.doctor.host import CmdResult, Host


def _load_fakes():
    path = Path(__file__).resolve().parents[1] / "data" / "probes" / "fakes.py"
    if "dnnctl_probe_fakes" not in sys.modules:
        spec = importlib.util.spec_from_file_location("dnnctl_probe_fakes", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    return sys.modules["dnnctl_probe_fakes"]


fakes = _load_fakes()


def test_h200_server_stack(tmp_path):
    host, runner, _ = fakes.h200_host(tmp_path)
    env = detect(host=host)
    assert env.driver["present"] is True and env.driver["version"] == "580.159.04"
    assert env.driver["cuda"] == "13.0" and env.driver["gpu_count"] == 1
    assert [(g.name, g.compute_capability) for g in env.gpus] == [("NVIDIA H200", "9.0")]
    runtimes = {c.source: c.version for c in env.cuda_runtimes}
    assert runtimes == {"pip:nvidia-cuda-runtime": "13.0.96",
                        "system:/usr/local/cuda-13.0": "13.0.96", "pip:cupy-cuda13x": "13"}
    first = [c for c in env.cudnn if c.loaded_first]
    assert [(c.source, c.version) for c in first] == [("pip:nvidia-cudnn-cu13", "9.19.0.56")]
    torch = env.frameworks["torch"]
    assert (torch["version"], torch["cuda"], torch["cudnn"]) == \
        ("2.11.0+cu130", "13.0", "9.19.0.56")
    assert env.frameworks["cupy"]["package"] == "cupy-cuda13x"
    assert env.frameworks["cupy"]["version"] == "14.2.0"
    assert env.os.startswith("Ubuntu 24.04.3 LTS; Linux ") and env.os.endswith("; container")
    assert len(env.notes) == 1 and "/lib/x86_64-linux-gnu/libcudnn.so.9" in env.notes[0]
    assert not any("-c" in c and "import torch" in " ".join(c) for c in runner.calls)


def test_snapshot_round_trip(tmp_path):
    host, _, _ = fakes.h200_host(tmp_path)
    env = detect(host=host, deep=True)
    path = save_env(env, tmp_path / "env.yaml")
    assert load_env(path) == env
    assert load_env(path).to_dict() == env.to_dict()


def test_runner_and_timeout_arguments(tmp_path):
    host, runner, _ = fakes.h200_host(tmp_path)
    seen = []

    def slow(argv, timeout):
        seen.append(timeout)
        return runner(argv, timeout)

    env = detect(slow, timeout=1.5, host=host)
    assert env.driver["version"] == "580.159.04" and set(seen) == {1.5}


def test_ldconfig_missing_or_failing(tmp_path):
    host = fakes.make_host(tmp_path)
    assert ldconfig_cache(host) == ({}, "ldconfig not found: libraries in the system cache "
                                        "were not listed")
    fakes.make_root(host.root, {"/sbin/ldconfig": None})
    host.runner = fakes.FakeRunner(commands={"ldconfig": CmdResult(1, "", "cannot open")})
    libs, note = ldconfig_cache(host)
    assert libs == {} and "exit status 1" in note


def test_os_markers(tmp_path):
    host = fakes.make_host(tmp_path, files={
        "/etc/os-release": 'PRETTY_NAME="Ubuntu 22.04.4 LTS"\n',
        "/proc/sys/kernel/osrelease": "5.15.153.1-microsoft-standard-WSL2\n",
        "/run/.containerenv": None})
    assert os_name(host).startswith("Ubuntu 22.04.4 LTS; Linux 5.15.153.1-microsoft")
    assert os_name(host).endswith("; WSL2; container")


@pytest.mark.parametrize("kernel, marker", [
    ("4.4.0-19041-Microsoft", "WSL1"),  # microsoft/WSL#5554: this kernel means WSL 1
    ("4.19.67-microsoft-standard", "WSL2"),  # an early WSL 2 kernel, no "WSL2" suffix yet
    ("5.10.16.3-microsoft-standard-WSL2", "WSL2"),
])
def test_os_marks_wsl1_apart_from_wsl2(tmp_path, kernel, marker):
    host = fakes.make_host(tmp_path, files={
        "/etc/os-release": 'PRETTY_NAME="Ubuntu 18.04.6 LTS"\n',
        "/proc/sys/kernel/osrelease": kernel + "\n"})
    assert os_name(host).endswith(f"{kernel} {platform.machine()}; {marker}")


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia/version") or
                    os.path.exists("/dev/nvidia0"), reason="this machine has an NVIDIA driver")
def test_this_machine_without_a_driver():
    env = detect(host=Host())
    assert env.driver["present"] is False and env.gpus == []
    assert env.to_dict()["gpus"] == []  # detected: an empty list, not "unknown"
    assert "insufficient" not in json.dumps(env.to_dict()).lower()
    assert env.python and env.os


def test_a_detected_jax_cuda12_install_is_judged_by_its_runtime(tmp_path):
    """jax-cuda12-plugin tells detection only the major ("12"): the pip CUDA runtime next to
    it is what is judged, never "12" as 12.0 against ">=12.1" (a false cuda-mismatch)."""
    from dnnctl.compat.matrix import load_matrix
    from dnnctl.doctor.model import Gpu
    from dnnctl.doctor.rules import judge
    site = tmp_path / "site"
    for name, version in (("jax", "0.6.0"), ("jaxlib", "0.6.0"), ("jax-cuda12-plugin", "0.6.0"),
                          ("jax-cuda12-pjrt", "0.6.0"), ("nvidia-cudnn-cu12", "9.10.2.21"),
                          ("nvidia-cuda-runtime-cu12", "12.9.79")):
        fakes.make_dist(site, name, version)
    env = detect(host=fakes.make_host(tmp_path, site=site))
    assert env.frameworks["jax"]["cuda"] == "12"  # the major only, as the plugin's name says
    assert [c.version for c in env.cuda_runtimes] == ["12.9.79"]
    env.driver, env.gpus = {"version": "575.57.08"}, [Gpu(name="NVIDIA H100 80GB HBM3")]
    jax = [f for f in judge(env, load_matrix()) if f.component in ("jax", "cudnn")]
    assert [(f.severity, f.code) for f in jax] == [("info", "ok")], jax
