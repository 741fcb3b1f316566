"""A TensorFlow with a local version tag is a custom build: judged by its own CUDA / cuDNN,
never by the official release's row; what it does not give is not judged."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor


def test_nv_build_is_not_judged_by_the_release_row(tmp_path: Path) -> None:
    d = doctor(tmp_path, "os: Windows\ngpus: [{compute_capability: '6.1'}]\n"
               "cudnn: [{version: 7.3.1, source: system}]\nframeworks:\n"
               "  tensorflow: {version: 1.13.1+nv, cuda: '10.1', cudnn: 7.3.1}\n")
    assert not d.of("unknown-version", "tensorflow")
    found = d.of("not-judged", "tensorflow")
    assert any("custom build" in f["message"] and "+nv" in f["message"] for f in found)
    assert any("sm_61" in f["message"] and "get_build_info" in f["fix"] for f in found)
    assert all("tensorflow.org/install/source" in f["source"] for f in found)


def test_nv_build_with_nothing_given_names_how_to_read_it(tmp_path: Path) -> None:
    d = doctor(tmp_path, "driver: {present: true, version: '525.85.12'}\n"
               "frameworks:\n  tensorflow: {version: 1.15.5+nv22.12}\n")
    [f] = d.of("not-judged", "tensorflow")
    assert "get_build_info" in f["fix"] and d.codes("tensorflow") == set()


def test_nv_build_own_cuda_is_judged_against_the_driver(tmp_path: Path) -> None:
    d = doctor(tmp_path, "driver: {present: true, version: '450.51.05'}\n"
               "frameworks:\n  tensorflow: {version: 2.11.0+nv23.01, cuda: '12.0'}\n")
    assert "driver-too-old" in d.codes("tensorflow")


def test_a_plain_release_still_uses_its_row(tmp_path: Path) -> None:
    d = doctor(tmp_path, "driver: {present: true, version: '450.51.05'}\n"
               "frameworks:\n  tensorflow: {version: 2.15.0}\n")
    assert "driver-too-old" in d.codes("tensorflow")
