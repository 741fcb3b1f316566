"""doctor --deep's live checks on a real GPU host: torch in a child process loads cuDNN,
runs each SDPA backend on a tiny bf16 call and one op on every visible GPU. Marked gpu;
skipped without torch or without a CUDA device."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dnnctl.cli.app import app
from dnnctl.compat.matrix import load_matrix
from dnnctl.doctor.detect import detect
from dnnctl.doctor.rules import judge

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)


@pytest.fixture(scope="module")
def env():
    return detect(deep=True)


def _live(env, key: str):
    """env.live[key], or a failure saying why the live check has no such answer."""
    live = env.live
    assert live, f"no live check ran; notes: {env.notes}"
    assert key in live, f"live check has no {key!r}: {live}; notes: {env.notes}"
    return live[key]


def test_live_ran_on_every_gpu(env) -> None:
    live = env.live
    assert live and not live.get("error"), (live, env.notes)
    launch = _live(env, "launch")
    assert sorted(launch) == [str(i) for i in range(torch.cuda.device_count())]
    assert set(launch.values()) == {"ok"}, launch


def test_live_cudnn_is_what_torch_loads(env) -> None:
    v = torch.backends.cudnn.version()
    assert _live(env, "cudnn") == f"{v // 10000}.{v // 100 % 100}.{v % 100}"
    assert "libcudnn" in env.live.get("cudnn_library", ""), env.live


def test_sdpa_backends_answer(env) -> None:
    sdpa = _live(env, "sdpa")
    assert set(sdpa) == {"flash", "efficient", "cudnn"}
    if torch.cuda.get_device_capability(0) >= (8, 0):  # bf16 flash / mem-efficient exist
        assert sdpa["flash"] == "ok" and sdpa["efficient"] == "ok", sdpa
    for result in sdpa.values():
        assert result == "ok" or result.startswith(("unsupported", "RuntimeError")), result


def test_no_live_errors_on_a_healthy_server(env) -> None:
    bad = [f for f in judge(env, load_matrix())
           if f.code.startswith("live") and f.severity == "error"]
    assert not bad, [(f.code, f.message) for f in bad]


def test_cli_deep_json_carries_live() -> None:
    r = CliRunner().invoke(app, ["doctor", "--deep", "--json"])
    data = json.loads(r.stdout)
    live = data["env"].get("live") or {}
    assert live.get("launch"), (live, data["env"].get("notes"))
