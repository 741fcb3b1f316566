"""The live torch checks of ``doctor --deep``: the child's answer merged into the snapshot,
findings with codes, the live section round-tripping through a saved snapshot, and the
check script itself compiling (it runs for real in tests/gpu/test_doctor_live.py)."""

from __future__ import annotations

import json

from dnnctl.compat.matrix import load_matrix
from dnnctl.doctor.deep import MARK, SCRIPTS, run_deep
from dnnctl.doctor.envfile import load_env, save_env
from dnnctl.doctor.host import CmdResult, Host
from dnnctl.doctor.model import EnvSnapshot, Gpu
from dnnctl.doctor.rules import judge


def _runner(answer: dict):
    def run(argv, timeout):
        assert argv[1] == "-c" and argv[2] == SCRIPTS["torch"]
        return CmdResult(0, MARK + json.dumps(answer) + "\n", "")
    return run


def _env() -> EnvSnapshot:
    return EnvSnapshot(driver={"present": True, "version": "580.95.05"},
                       gpus=[Gpu(0, "NVIDIA H200", "9.0"), Gpu(1, "NVIDIA H200", "9.0")],
                       frameworks={"torch": {"version": "2.14.0+cu130"}})


def test_live_answers_become_findings(tmp_path) -> None:
    env = _env()
    answer = {"version": "2.14.0+cu130", "cuda": "13.0", "cuda_available": True,
              "device_count": 2, "cudnn_compiled": [9, 24, 0],
              "live": {"torch": "2.14.0+cu130", "cudnn": 91900,
                       "cudnn_library": "/usr/lib/x86_64-linux-gnu/libcudnn.so.9",
                       "launch": {"0": "ok", "1": "RuntimeError: CUDA error: an illegal "
                                  "memory access was encountered"},
                       "sdpa": {"flash": "ok", "efficient": "ok",
                                "cudnn": "RuntimeError: cuDNN Frontend error: No valid "
                                "execution plans built."}}}
    run_deep(Host(runner=_runner(answer), python="python3"), env)
    assert env.live["cudnn"] == "9.19.0" and env.live["launch"]["0"] == "ok"
    found = {(f.code, f.severity) for f in judge(env, load_matrix())}
    assert {("live-cudnn", "error"), ("live-launch", "error"),
            ("live-sdpa", "warning")} <= found
    path = save_env(env, tmp_path / "env.yaml")
    again = load_env(path)
    assert again.live == env.live  # a saved snapshot is judged the same elsewhere
    assert {(f.code, f.severity) for f in judge(again, load_matrix())} == found


def test_healthy_live_check_is_one_ok() -> None:
    env = _env()
    env.live = {"torch": "2.14.0+cu130", "cudnn": "9.24.0", "launch": {"0": "ok", "1": "ok"},
                "sdpa": {"flash": "ok", "efficient": "ok", "cudnn": "ok"}}
    live = [f for f in judge(env, load_matrix()) if f.code.startswith("live") or
            (f.code == "ok" and f.message.startswith("live"))]
    assert [(f.code, f.severity) for f in live] == [("ok", "info")]


def test_live_failure_itself_is_a_warning() -> None:
    env = _env()
    env.live = {"error": "SDPA: ImportError: cannot import name 'sdpa_kernel'"}
    f = [x for x in judge(env, load_matrix()) if x.code == "live-failed"]
    assert f and f[0].severity == "warning"


def test_check_script_compiles() -> None:
    compile(SCRIPTS["torch"], "<torch live check>", "exec")
