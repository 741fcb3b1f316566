"""Hostile inputs to doctor --from, --matrix overlays and compat check: every one is a clear
error naming the file (or flag) with exit status 2, never an internal error or a hang."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dnnctl.cli.app import app
from dnnctl.compat.inputs import MAX_INPUT_BYTES, check_pattern

runner = CliRunner()
GOOD_ENV = "driver: {version: '580.159.04'}\ngpus: [{name: NVIDIA H200}]\n"


def doctor(*args: str):
    return runner.invoke(app, ["doctor", *args])


def assert_bad_input(result, name: str, words: str) -> None:
    text = (result.stderr or "") + result.stdout
    assert result.exit_code == 2, text
    assert "internal error" not in text
    flat = text.replace("\n", "")
    assert name in flat and words in flat, text


def _fifo(tmp_path: Path) -> Path:
    p = tmp_path / "env.fifo"
    os.mkfifo(p)
    return p


@pytest.mark.parametrize("make, words", [
    (lambda t: t, "a directory"),
    (_fifo, "FIFO"),
    (lambda t: Path("/dev/zero"), "character device"),
    (lambda t: t / "missing.yaml", "no such file"),
])
def test_non_regular_files_are_refused_without_reading(tmp_path: Path, make, words) -> None:
    path = make(tmp_path)
    started = time.monotonic()
    for args in (("--from", str(path)), ("--from", _good(tmp_path), "--matrix", str(path))):
        r = doctor(*args)
        assert_bad_input(r, str(path), words)
    assert time.monotonic() - started < 5  # a FIFO nobody writes to must not block


def _good(tmp_path: Path) -> str:
    p = tmp_path / "good.yaml"
    p.write_text(GOOD_ENV)
    return str(p)


def test_huge_file_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with open(big, "wb") as fh:
        fh.truncate(MAX_INPUT_BYTES + 1)  # sparse: costs no disk
    assert_bad_input(doctor("--from", str(big)), str(big), "too large")
    assert_bad_input(doctor("--from", _good(tmp_path), "--matrix", str(big)), str(big),
                     "too large")


def test_binary_file_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "bin.yaml"
    p.write_bytes(b"driver: {version: '580'}\n\xff\xfe\x00garbage")
    assert_bad_input(doctor("--from", str(p)), str(p), "not UTF-8")


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, "a:\n" + "".join(
    f"{' ' * (2 * i)}b{i}:\n" for i in range(1, 200)) + "x: 1\n"])
def test_deep_nesting_is_refused(tmp_path: Path, text: str) -> None:
    for opt in ("--from", "--matrix"):
        p = tmp_path / f"deep{opt}.yaml"
        p.write_text(("schema: dnnctl-matrix/1\ngpus: " if opt == "--matrix" else "gpus: ")
                     + text if text.startswith("[") else text)
        args = (opt, str(p)) if opt == "--from" else ("--from", _good(tmp_path), opt, str(p))
        assert_bad_input(doctor(*args), str(p), "nest")


def test_4300_digit_numbers(tmp_path: Path) -> None:
    huge = "9" * 4400
    cases = {
        "ver.yaml": f"driver: {{version: '{huge}'}}\n",
        "int.yaml": f"gpus: [{{name: H200, memory_mib: {huge}}}]\n",
        "cc.yaml": f"gpus: [{{compute_capability: '{huge}'}}]\n",
    }
    for name, text in cases.items():
        p = tmp_path / name
        p.write_text(text)
        r = doctor("--from", str(p))
        assert_bad_input(r, str(p), "9999")
    overlay = tmp_path / "m.yaml"
    overlay.write_text(f"schema: dnnctl-matrix/1\ncuda_majors:\n  - {{major: {huge}, "
                       "mvc_min_driver: '1', source: s, certainty: V}\n")
    assert_bad_input(doctor("--from", _good(tmp_path), "--matrix", str(overlay)),
                     str(overlay), "cannot be read")


@pytest.mark.parametrize("field, value", [
    ("driver", "{version: abc}"), ("driver", "{version: '', cuda: '13.0'}"),
    ("driver", "{cuda: x13}"), ("cuda_runtimes", "[{version: banana}]"),
    ("cudnn", "[{version: nine}]"), ("frameworks", "{torch: {version: latest}}"),
    ("frameworks", "{cupy: {version: '13.0', nvrtc: twelve}}"), ("packages", "{torch: abc}"),
])
def test_every_version_field_is_validated(tmp_path: Path, field: str, value: str) -> None:
    p = tmp_path / "env.yaml"
    p.write_text(f"{field}: {value}\n")
    assert_bad_input(doctor("--from", str(p)), str(p), "not a version")


def test_driver_abc_is_an_error_in_compat_check_too() -> None:
    r = runner.invoke(app, ["compat", "check", "--gpu", "H200", "--driver", "abc"])
    assert r.exit_code == 2 and "--driver" in (r.stderr or r.stdout)


@pytest.mark.parametrize("pattern, words", [
    ("'(a+)+$'", "repeat inside a repeat"), ("'(x|xx)*y'", "alternatives inside a repeat"),
    ("'(a)\\1'", "backreference"), ("5", "expected"), ("'['", "not a regular expression"),
    ("'" + "a" * 300 + "'", "longer than"),
])
def test_overlay_patterns_are_type_checked_and_safe(tmp_path: Path, pattern: str,
                                                     words: str) -> None:
    p = tmp_path / "gpus.yaml"
    p.write_text("schema: dnnctl-matrix/1\ngpus:\n  - {model: Evil, match: [" + pattern
                 + "], cc: '9.0', class: datacenter, source: s, certainty: V}\n")
    started = time.monotonic()
    r = doctor("--from", _good(tmp_path), "--matrix", str(p))
    assert_bad_input(r, str(p), words)
    assert time.monotonic() - started < 5


def test_long_gpu_name_against_overlay_pattern_is_fast(tmp_path: Path) -> None:
    p = tmp_path / "gpus.yaml"
    p.write_text("schema: dnnctl-matrix/1\ngpus:\n  - {model: Wide, match: ['a*b'], cc: '9.0', "
                 "class: datacenter, examples: [ab], source: s, certainty: V}\n")
    env = tmp_path / "env.yaml"
    env.write_text(f"gpus: [{{name: '{'a' * 1000}'}}]\n")
    started = time.monotonic()
    r = doctor("--from", str(env), "--matrix", str(p), "--json")
    assert r.exit_code in (0, 1) and json.loads(r.stdout)["verdict"] in ("warn", "fail")
    assert time.monotonic() - started < 5


def test_overlong_value_is_refused(tmp_path: Path) -> None:
    env = tmp_path / "env.yaml"
    env.write_text(f"gpus: [{{name: '{'a' * 100000}'}}]\n")
    assert_bad_input(doctor("--from", str(env)), str(env), "longer than")


def test_safe_patterns_pass() -> None:
    assert check_pattern(r"\bRTX 40[5-9]0( Ti| SUPER| D)*\b") is None
    assert check_pattern(r"^cupy(-cuda\d+x?|-rocm-[\d-]+)?$") is None
