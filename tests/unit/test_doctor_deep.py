"""``doctor --deep``: framework answers merged into the snapshot; failures become notes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from dnnctl.doctor.deep import ask, run_deep
from dnnctl.doctor.host import CmdResult, Host, run_command
from dnnctl.doctor.model import Component, EnvSnapshot


def _load_fakes():
    path = Path(__file__).resolve().parents[1] / "data" / "probes" / "fakes.py"
    if "dnnctl_probe_fakes" not in sys.modules:
        spec = importlib.util.spec_from_file_location("dnnctl_probe_fakes", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    return sys.modules["dnnctl_probe_fakes"]


fakes = _load_fakes()


def test_cupy_without_a_driver_is_not_told_to_upgrade_it():
    env = EnvSnapshot(driver={"present": False},
                      frameworks={"cupy": {"version": "13.3.0", "package": "cupy-cuda12x"}})
    runner = fakes.FakeRunner(deep={"cupy": fakes.canned("cupy-deep-nodriver.txt")})
    run_deep(Host(runner=runner, python="python3"), env)
    cupy = env.frameworks["cupy"]
    assert (cupy["runtime"], cupy["local_runtime"], cupy["source"]) == ("12.6", "12.4", "deep")
    text = "\n".join(env.notes)
    assert "insufficient" not in text.lower()
    assert "--deep cupy: driver: cannot reach a GPU: no NVIDIA driver is loaded" in env.notes
    assert any("libnvrtc.so.12" in n for n in env.notes)  # other errors are kept as they are
    assert env.cuda_runtimes == [Component(version="12.6", source="pip:cupy-cuda12x")]


def test_insufficient_driver_is_kept_when_a_driver_is_present():
    env = EnvSnapshot(driver={"present": True, "version": "470.256.02"},
                      frameworks={"cupy": {"version": "13.3.0", "package": "cupy-cuda12x"}})
    runner = fakes.FakeRunner(deep={"cupy": fakes.canned("cupy-deep-nodriver.txt")})
    run_deep(Host(runner=runner, python="python3"), env)
    assert any("driver version is insufficient" in n for n in env.notes)


def test_torch_loading_a_shadowing_cudnn(tmp_path):
    system = fakes.make_root(tmp_path, {"/lib/libcudnn.so.8.5.0": None})
    loaded = str(system / "lib/libcudnn.so.8.5.0")
    bundled = str(fakes.make_root(tmp_path, {"/site/nvidia/cudnn/lib/libcudnn.so.8": None})
                  / "site/nvidia/cudnn/lib/libcudnn.so.8")
    env = EnvSnapshot(driver={"present": True}, frameworks={"torch": {
        "version": "2.1.2+cu121", "cuda": "12.1", "cudnn": "8.9.2.26"}}, cudnn=[
        Component("8.9.2.26", "pip:nvidia-cudnn-cu12", bundled, True),
        Component("8.5.0", "env:LD_LIBRARY_PATH", loaded, False)])
    out = fakes.canned("torch-deep-shadowed.txt").replace(
        "/usr/lib/x86_64-linux-gnu/libcudnn.so.8.5.0", loaded)
    run_deep(Host(runner=fakes.FakeRunner(deep={"torch": out}), python="python3"), env)
    torch = env.frameworks["torch"]
    assert torch["arch_list"][-1] == "sm_90" and torch["cudnn_compiled"] == "8.9.2"
    assert torch["cudnn"] == "8.9.2.26"  # the pinned wheel stays what torch needs
    assert torch["cudnn_loaded"] == loaded and torch["cuda_available"] is False
    assert [c.loaded_first for c in env.cudnn] == [False, True]  # what it really mapped
    assert any("cuDNN version incompatibility" in n for n in env.notes)


def test_h200_deep(tmp_path):
    from dnnctl.doctor.detect import detect

    host, _, _ = fakes.h200_host(tmp_path)
    env = detect(host=host, deep=True)
    torch = env.frameworks["torch"]
    assert torch["source"] == "deep" and torch["cudnn_runtime"] == "9.19.0"
    assert torch["arch_list"] == ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    assert torch["capability"] == "9.0" and torch["cuda_available"] is True
    cupy = env.frameworks["cupy"]
    assert (cupy["runtime"], cupy["local_runtime"], cupy["driver"], cupy["nvrtc"]) == \
        ("13.2", "13.0", "13.0", "13.0")
    assert {c.source: c.version for c in env.cuda_runtimes}["pip:cupy-cuda13x"] == "13.2"
    pip_cudnn = next(c for c in env.cudnn if c.source == "pip:nvidia-cudnn-cu13")
    assert pip_cudnn.loaded_first is True


@pytest.mark.parametrize(("result", "expected"), [
    (CmdResult(None, "", "", "timed out after 90 s"), "probe failed: --deep torch: timed out after 90 s"),
    (CmdResult(-11, "", "Segmentation fault\n"), "probe failed: --deep torch: exited with status -11"),
    (CmdResult(0, "DNNCTL_JSON {not json", ""), "--deep torch: exited with status 0"),
    (None, "probe failed: --deep torch: cannot run python3"),
])
def test_failures_become_notes(result, expected):
    env = EnvSnapshot(frameworks={"torch": {"version": "2.4.0"}})
    run_deep(Host(runner=fakes.FakeRunner(deep={"torch": result}), python="python3"), env)
    assert len(env.notes) == 1 and env.notes[0].startswith(expected)
    assert env.frameworks["torch"] == {"version": "2.4.0"}  # nothing invented


def test_metadata_and_import_disagree():
    env = EnvSnapshot(frameworks={"jax": {"version": "0.4.30"}})
    runner = fakes.FakeRunner(deep={"jax": 'DNNCTL_JSON {"version": "0.4.35", "jaxlib": '
                                           '"0.4.35", "cudnn_build_version": 90300, '
                                           '"cuda_runtime_build_version": 12060}'})
    run_deep(Host(runner=runner, python="python3"), env)
    jax = env.frameworks["jax"]
    assert (jax["version"], jax["cudnn"], jax["cuda"]) == ("0.4.35", "9.3.0", "12.6")
    assert any("says 0.4.30 but the imported module reports 0.4.35" in n for n in env.notes)


def test_only_installed_frameworks_are_asked():
    runner = fakes.FakeRunner()
    run_deep(Host(runner=runner, python="python3"), EnvSnapshot())
    assert runner.calls == []


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_real_subprocess_without_torch():
    data, failure = ask(Host(runner=run_command, python=sys.executable), "torch", timeout=60)
    assert failure is None
    assert "ModuleNotFoundError" in data["errors"]["import"]
