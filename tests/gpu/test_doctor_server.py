"""doctor on a real GPU server: what detect() finds must agree with nvidia-smi, /proc, CuPy and
torch asked directly. Runs under tests/gpu/ (skipped without a usable GPU)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dnnctl.cli.app import app
from dnnctl.doctor import parse
from dnnctl.doctor.detect import detect


@pytest.fixture(scope="module")
def env():
    return detect()


@pytest.fixture(scope="module")
def deep_env():
    return detect(deep=True)


def test_driver_and_gpus_match_nvidia_smi(env):
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not on PATH")
    out = subprocess.run([smi, "--query-gpu=index,name,compute_cap,memory.total,"
                          "driver_version,uuid", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=60).stdout
    rows = parse.nvidia_smi_query(out)
    assert rows, out
    assert env.driver["present"] is True and env.driver["source"] == "nvml"
    assert env.driver["version"] == rows[0]["driver"]
    assert env.driver["gpu_count"] == len(rows)
    assert [(g.index, g.name, g.compute_capability, g.memory_mib, g.uuid) for g in env.gpus] == \
        [(r["index"], r["name"], r["compute_capability"], r["memory_mib"], r["uuid"])
         for r in rows]


def test_kernel_module_and_library_agree(env):
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        pytest.skip("no /proc/driver/nvidia/version here (WSL?)")
    assert env.driver["kernel_module"] == parse.proc_driver_version(text)
    assert not env.driver.get("mismatch")
    assert env.driver.get("library") in (None, env.driver["kernel_module"])


def test_driver_cuda_and_capability_match_cupy(env):
    import cupy

    assert env.driver["cuda"] == parse.cuda_int_version(cupy.cuda.runtime.driverGetVersion())
    cc = cupy.cuda.Device(0).compute_capability  # "90"
    assert f"{cc[:-1]}.{cc[-1]}" in {g.compute_capability for g in env.gpus}


def test_cupy_asked_deeply_matches_cupy(deep_env):
    import cupy

    info = deep_env.frameworks["cupy"]
    assert info.get("source") == "deep", (info, deep_env.notes)  # the cupy child answered
    assert info["version"] == cupy.__version__
    assert info.get("runtime") == parse.cuda_int_version(cupy.cuda.runtime.runtimeGetVersion())
    assert info["driver"] == deep_env.driver["cuda"]
    assert info["package"] in info["packages"]


def _torch_facts() -> dict:
    code = ("import json, torch; v = torch.backends.cudnn.version(); "
            "maps = [l.split()[-1] for l in open('/proc/self/maps') if '/libcudnn.so' in l]; "
            "print(json.dumps({'v': torch.__version__, 'cuda': torch.version.cuda, 'cudnn': v, "
            "'arch': torch.cuda.get_arch_list(), 'maps': sorted(set(maps))}))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    if res.returncode != 0:
        pytest.skip(f"torch does not import here: {res.stderr.strip()[-300:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_torch_metadata_and_deep_match_torch(env, deep_env):
    if "torch" not in env.frameworks:
        pytest.skip("torch is not installed in this environment")
    facts = _torch_facts()
    plain, deep = env.frameworks["torch"], deep_env.frameworks["torch"]
    assert deep.get("source") == "deep", (deep, deep_env.notes)  # the torch child answered
    assert plain["version"] == deep["version"] == facts["v"]  # local tag included
    assert plain["cuda"] == deep["cuda"] == facts["cuda"]
    assert deep.get("arch_list") == facts["arch"], (deep, deep_env.notes)
    runtime = parse.cudnn_int_version(facts["cudnn"])
    assert deep.get("cudnn_runtime") == runtime, (deep, deep_env.notes)
    if "cudnn_package" in plain:  # the pinned nvidia-cudnn wheel is the one that loads
        assert plain["cudnn"].startswith(runtime + ".") or plain["cudnn"] == runtime
    major = runtime.split(".")[0]
    first = [c for c in deep_env.cudnn if c.loaded_first and
             (c.version or "").split(".")[0] == major]
    assert len(first) == 1, deep_env.cudnn
    assert os.path.realpath(first[0].path) in {os.path.realpath(p) for p in facts["maps"]}
    plain_first = [c for c in env.cudnn if c.loaded_first and
                   (c.version or "").split(".")[0] == major]
    assert [c.path for c in plain_first] == [first[0].path]  # the loader model was right


def test_doctor_deep_json_passes_here():
    r = CliRunner().invoke(app, ["doctor", "--deep", "--json"])
    data = json.loads(r.stdout)
    problems = [f for f in data["findings"] if f["severity"] != "info"]
    assert r.exit_code == 0 and data["verdict"] == "pass", json.dumps(problems, indent=1)
    assert "insufficient" not in json.dumps(data["env"]).lower()
