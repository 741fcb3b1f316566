"""`dnnctl compat` through typer's CliRunner: exit codes, JSON, errors at the edge."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dnnctl.cli.app import app

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, ["compat", *args])


def test_check_fail_pass_warn_exit_codes() -> None:
    r = run("check", "--gpu", "B200", "--driver", "550.54.15", "--torch", "2.2.0+cu121")
    assert r.exit_code == 1
    assert "arch-unsupported" in r.stdout and "driver-too-old" in r.stdout
    assert "570.26" in r.stdout and "verdict: FAIL" in r.stdout
    r = run("check", "--gpu", "H200", "--driver", "580.159.04", "--torch", "2.11.0+cu130")
    assert r.exit_code == 0 and "verdict: PASS" in r.stdout
    warn = ("check", "--gpu", "V100", "--driver", "570.172.08", "--torch", "2.8.0+cu128")
    assert run(*warn).exit_code == 0
    assert run(*warn, "--strict").exit_code == 1


def test_check_json_is_the_doctor_schema() -> None:
    r = run("check", "--gpu", "RTX 5090", "--torch", "2.5.1+cu121", "--json")
    data = json.loads(r.stdout)
    assert data["schema"] == "dnnctl-doctor/1" and data["verdict"] == "fail"
    codes = [f["code"] for f in data["findings"]]
    assert "arch-unsupported" in codes
    f = data["findings"][codes.index("arch-unsupported")]
    assert set(f) == {"code", "severity", "component", "message", "fix", "evidence", "source"}
    assert "cu126" not in f["fix"] and "download.pytorch.org/whl/cu1" in f["fix"]
    assert data["env"]["gpus"][0]["compute_capability"] == "12.0"


def test_check_bad_usage_exits_2_and_json_errors() -> None:
    r = run("check", "--driver", "abc")
    assert r.exit_code == 2 and "--driver 'abc'" in r.stderr
    r = run("check", "--driver", "abc", "--json")
    assert r.exit_code == 2 and json.loads(r.stdout)["error"]["code"] == "usage"
    assert run("check").exit_code == 2  # nothing to check
    assert run("check", "--jax", "0.6.2+rocm").exit_code == 2


def test_check_with_overlay_and_bad_overlay(tmp_path: Path) -> None:
    extra = tmp_path / "extra.yaml"
    extra.write_text(
        "schema: dnnctl-matrix/1\ntorch:\n"
        "  - {torch: \"2.2\", variant: cu121, cuda: \"12.1\", cudnn: \"8.9.2.26\", "
        "status: stable, arch_list: [sm_90, compute_90], source: in-house, certainty: V}\n")
    args = ("check", "--gpu", "B200", "--driver", "580.65.06", "--torch", "2.2.0+cu121")
    r = run(*args, "--matrix", str(extra), "--json")
    codes = {f["code"] for f in json.loads(r.stdout)["findings"]}
    assert "arch-ptx-jit" in codes and "arch-unsupported" not in codes
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: dnnctl-matrix/1\ntorch:\n  - {torch: \"2.2\", colour: red}\n")
    r = run(*args, "--matrix", str(bad))
    assert r.exit_code == 2 and f"{bad}:3" in r.stderr and "colour" in r.stderr


def test_suggest_b200_and_v100() -> None:
    r = run("suggest", "--gpu", "B200", "--json")
    data = json.loads(r.stdout)
    assert r.exit_code == 0 and data["compute_capability"] == "10.0"
    torch = [c for c in data["combinations"] if c["framework"] == "torch"]
    assert torch and all(c["variant"] in ("cu128", "cu129", "cu130", "cu132") for c in torch)
    assert all(c["install"].startswith("pip install") for c in data["combinations"])
    r = run("suggest", "--gpu", "V100", "--framework", "torch")
    assert r.exit_code == 0 and "dropped sm_70" in r.stdout and "cu126" in r.stdout
    assert run("suggest", "--gpu", "Z9000").exit_code == 2
    assert run("suggest", "--gpu", "B200", "--framework", "mxnet").exit_code == 2


def test_show_tables_and_filters() -> None:
    r = run("show", "gpus", "--filter", "cc=12.1", "--json")
    data = json.loads(r.stdout)
    assert [row["model"] for row in data["rows"]] == ["GB10"]
    assert all(row["source"] for row in data["rows"])
    r = run("show", "torch", "-f", "variant=cu130", "-f", "torch=2.11", "--json")
    rows = json.loads(r.stdout)["rows"]
    assert len(rows) == 1 and rows[0]["cudnn"] == "9.17.1.4"
    r = run("show", "cuda", "-f", "13.0")
    assert r.exit_code == 0 and "580.65.06" in r.stdout
    for table in ("gpus", "archs", "cuda", "cudnn", "torch", "tensorflow", "jax", "cupy"):
        assert run("show", table, "--json").exit_code == 0, table
    assert run("show", "widgets").exit_code == 2
