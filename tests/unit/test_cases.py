"""Real-world cases (tests/cases/*.yaml, each citing its public issue) judged three ways:
judge() on the dnnctl-env/1 snapshot, `dnnctl compat check` with the same facts as flags,
and `dnnctl doctor --from` on the snapshot file. Each must give the expected verdict and
exactly the expected error/warning codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from dnnctl.cli.app import app
from dnnctl.compat.matrix import load_matrix
from dnnctl.doctor.envfile import parse_env
from dnnctl.doctor.model import Finding, verdict
from dnnctl.doctor.rules import judge

CASES = sorted((Path(__file__).resolve().parents[1] / "cases").glob("*.yaml"))


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert data["url"].startswith("https://"), path.name
    assert data["title"] and data["expect"]["verdict"] in ("pass", "warn", "fail")
    return data


def _snapshot_text(case: dict[str, Any]) -> str:
    return yaml.safe_dump({"schema": "dnnctl-env/1", **case["env"]}, sort_keys=False)


def _check(case: dict[str, Any], got_verdict: str, findings: list[dict[str, Any]],
           how: str) -> None:
    exp = case["expect"]
    codes = sorted({f["code"] for f in findings if f["severity"] in ("error", "warning")})
    shown = [(f["severity"], f["code"], f["message"][:120]) for f in findings]
    assert got_verdict == exp["verdict"], f"{how}: verdict {got_verdict}; findings {shown}"
    assert codes == sorted(set(exp["codes"])), f"{how}: codes {codes}; findings {shown}"
    infos = {f["code"] for f in findings if f["severity"] == "info"}
    assert set(exp.get("info", [])) <= infos, f"{how}: info {sorted(infos)}"
    fixes = " | ".join(f["fix"] or "" for f in findings if f["severity"] != "info")
    for text in exp.get("fix_contains", []):
        assert text in fixes, f"{how}: fix lacks {text!r}: {fixes}"
    for text in exp.get("fix_excludes", []):
        assert text not in fixes, f"{how}: fix must not suggest {text!r}: {fixes}"
    for f in findings:
        if f["code"] != "ok" and f["severity"] != "info":
            assert f["message"], how


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 45
    urls = {_load(p)["url"] for p in CASES}
    assert len(urls) >= 40  # distinct public sources


@pytest.fixture(scope="module")
def matrix():
    return load_matrix()


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case_judge(path: Path, matrix) -> None:
    case = _load(path)
    env = parse_env(_snapshot_text(case), path)
    findings: list[Finding] = judge(env, matrix)
    _check(case, verdict(findings), [f.to_dict() for f in findings], "judge()")
    for f in findings:  # every problem cites the matrix fact it rests on (or says unknown)
        if f.severity == "error" and f.code not in ("no-driver", "no-gpu", "driver-mismatch",
                                                     "cudnn-shadowed", "cudnn-mismatch"):
            assert f.source, (f.code, f.message)


CHECKABLE = [p for p in CASES if "check" in _load(p)]


@pytest.mark.parametrize("path", CHECKABLE, ids=[p.stem for p in CHECKABLE])
def test_case_compat_check(path: Path) -> None:
    case = _load(path)
    args = ["compat", "check", "--json"]
    for key, value in case["check"].items():
        for v in value if isinstance(value, list) else [value]:
            args += [f"--{key}", str(v)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == (1 if case["expect"]["verdict"] == "fail" else 0), result.output
    data = json.loads(result.stdout)
    assert data["schema"] == "dnnctl-doctor/1"
    if "check_codes" in case["expect"]:  # a flag cannot say where a planned cuDNN comes from
        case = {**case, "expect": {**case["expect"], "codes": case["expect"]["check_codes"]}}
    _check(case, data["verdict"], data["findings"], "compat check")


def _doctor_cli_ready() -> bool:
    from dnnctl.cli import doctor
    return hasattr(doctor, "doctor")


@pytest.mark.skipif(not _doctor_cli_ready(), reason="`dnnctl doctor` is not there yet")
@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case_doctor_from(path: Path, tmp_path: Path) -> None:
    case = _load(path)
    snap = tmp_path / "env.yaml"
    snap.write_text(_snapshot_text(case))
    result = CliRunner().invoke(app, ["doctor", "--from", str(snap), "--json"])
    assert result.exit_code == (1 if case["expect"]["verdict"] == "fail" else 0), result.output
    data = json.loads(result.stdout)
    _check(case, data["verdict"], data["findings"], "doctor --from")
