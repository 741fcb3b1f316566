"""``dnnctl doctor`` through typer's CliRunner: exit codes, JSON, --from/--save, errors."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dnnctl.cli.app import app
from dnnctl.doctor.envfile import load_env, save_env


def _load_fakes():
    path = Path(__file__).resolve().parents[1] / "data" / "probes" / "fakes.py"
    if "dnnctl_probe_fakes" not in sys.modules:
        spec = importlib.util.spec_from_file_location("dnnctl_probe_fakes", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    return sys.modules["dnnctl_probe_fakes"]


fakes = _load_fakes()
runner = CliRunner()


def doctor(*args: str):
    return runner.invoke(app, ["doctor", *map(str, args)], env={"COLUMNS": "200"})


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.fixture
def h200_snapshot(tmp_path) -> Path:
    from dnnctl.doctor.detect import detect

    host, _, _ = fakes.h200_host(tmp_path / "server")
    return save_env(detect(host=host, deep=True), tmp_path / "h200.yaml")


def test_h200_passes(h200_snapshot):
    r = doctor("--from", h200_snapshot)
    assert r.exit_code == 0, r.output
    assert "verdict: PASS" in r.output
    for text in ("580.159.04", "NVIDIA H200 sm_90 (9.0)", "2.11.0+cu130", "9.19.0.56",
                 "cupy-cuda13x 14.2.0", "← loaded first"):
        assert text in r.output


def test_h200_json(h200_snapshot):
    r = doctor("--from", h200_snapshot, "--json")
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    assert data["schema"] == "dnnctl-doctor/1" and data["verdict"] == "pass"
    assert data["env"]["gpus"][0]["name"] == "NVIDIA H200"
    assert data["env"]["frameworks"]["torch"]["version"] == "2.11.0+cu130"
    assert all(set(f) == {"code", "severity", "component", "message", "fix", "evidence",
                          "source"} for f in data["findings"])


def test_b200_with_torch_2_2_fails_with_the_fix(tmp_path):
    p = write(tmp_path, "plan.yaml", "gpus: [{name: NVIDIA B200}]\n"
              "driver: {present: true, version: 570.124.06}\n"
              "frameworks: {torch: {version: 2.2.0+cu121}}\n")
    r = doctor("--from", p)
    assert r.exit_code == 1
    assert "✗" in r.output and "[arch-unsupported]" in r.output and "fix:" in r.output
    data = json.loads(doctor("--from", p, "--json").stdout)
    assert data["verdict"] == "fail"
    assert "arch-unsupported" in {f["code"] for f in data["findings"]}


def test_an_empty_list_reads_none_found_not_unknown(tmp_path):
    """``cudnn: []`` (looked, found none) prints as "none found"; an absent list prints
    nothing for the component, as unknown."""
    p = write(tmp_path, "e.yaml", "gpus: [{name: H100, compute_capability: '9.0'}]\n"
              "cudnn: []\nframeworks: {jax: {version: 0.4.30, cuda: '12'}}\n")
    line = next(x for x in doctor("--from", p).output.splitlines() if " cudnn " in x)
    assert "none found" in line and "unknown" not in line
    q = write(tmp_path, "f.yaml", "gpus: [{name: H100, compute_capability: '9.0'}]\n")
    assert "none found" not in doctor("--from", q).output


def test_missing_driver(tmp_path):
    r = doctor("--from", write(tmp_path, "e.yaml", "driver: {present: false}\n"), "--json")
    assert r.exit_code == 1
    assert [f["code"] for f in json.loads(r.stdout)["findings"]] == ["no-driver"]


def test_warnings_pass_unless_strict(tmp_path):
    p = write(tmp_path, "e.yaml", "gpus: [{name: Mystery Accelerator 9000}]\n")
    r = doctor("--from", p)
    assert r.exit_code == 0 and "verdict: WARN" in r.output and "⚠" in r.output
    assert doctor("--from", p, "--strict").exit_code == 1


def test_two_cupy_wheels(tmp_path):
    p = write(tmp_path, "e.yaml", "frameworks:\n  cupy: {package: cupy-cuda12x, version: "
              "13.3.0, packages: [cupy-cuda11x, cupy-cuda12x]}\n")
    data = json.loads(doctor("--from", p, "--json").stdout)
    assert "duplicate-package" in {f["code"] for f in data["findings"]}


def test_save_writes_the_snapshot(tmp_path):
    src = write(tmp_path, "in.yaml", "gpus: [{name: NVIDIA H100 80GB HBM3}]\n")
    out = tmp_path / "out.yaml"
    r = doctor("--from", src, "--save", out)
    assert "snapshot saved to" in r.output
    assert load_env(out) == load_env(src)


@pytest.mark.parametrize(("text", "where"), [
    ("gpus:\n  - {name: B200\n", ":3"),  # YAML syntax error, with its line
    ("gpus:\n  - {index: one}\n", ":2 (gpus[0].index)"),
    ("schema: dnnctl-plan/1\n", ":1 (schema)"),
])
def test_bad_snapshot_exits_2_with_file_and_line(tmp_path, text, where):
    p = write(tmp_path, "bad.yaml", text)
    r = doctor("--from", p)
    assert r.exit_code == 2
    assert f"{p}{where}" in r.stderr and "Traceback" not in r.output
    j = doctor("--from", p, "--json")
    assert j.exit_code == 2
    err = json.loads(j.stdout)["error"]
    assert err["code"] == "bad-file" and err["message"].startswith(f"{p}{where}")


def test_unreadable_inputs_exit_2(tmp_path):
    assert doctor("--from", tmp_path / "missing.yaml").exit_code == 2
    r = doctor("--from", tmp_path)  # a directory
    assert r.exit_code == 2 and "cannot read" in r.stderr


def test_deep_cannot_judge_a_file(tmp_path):
    r = doctor("--from", write(tmp_path, "e.yaml", "gpus: [B200]\n"), "--deep", "--json")
    assert r.exit_code == 2
    assert json.loads(r.stdout)["error"]["code"] == "usage"


def test_bad_matrix_overlay_exits_2(tmp_path):
    snap = write(tmp_path, "e.yaml", "gpus: [B200]\n")
    r = doctor("--from", snap, "--matrix", write(tmp_path, "extra.yaml", "rows: [\n"))
    assert r.exit_code == 2 and str(tmp_path / "extra.yaml") in r.stderr


def test_unknown_option_is_usage():
    assert doctor("--bogus").exit_code == 2


def test_save_to_unwritable_place(tmp_path):
    snap = write(tmp_path, "e.yaml", "gpus: [B200]\n")
    r = doctor("--from", snap, "--save", tmp_path / "no" / "dir" / "env.yaml")
    assert r.exit_code == 2 and "cannot write" in r.stderr


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia/version") or
                    os.path.exists("/dev/nvidia0"), reason="this machine has an NVIDIA driver")
def test_this_machine_reports_the_missing_driver(tmp_path):
    r = doctor("--json", "--save", tmp_path / "here.yaml")
    assert r.exit_code == 1
    data = json.loads(r.stdout)
    assert data["verdict"] == "fail"
    assert "no-driver" in {f["code"] for f in data["findings"]}
    assert data["env"]["driver"]["present"] is False and data["env"]["gpus"] == []
    assert load_env(tmp_path / "here.yaml").driver["present"] is False
    human = doctor()
    assert human.exit_code == 1 and "not found" in human.output
