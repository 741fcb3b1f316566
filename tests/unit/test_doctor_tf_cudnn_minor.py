"""TensorFlow's cuDNN check by generation: before 1.8 the loaded cuDNN must have the build's
major.minor ("compatibility version"); from 1.8 a newer minor of the same major loads. Without
the release, a newer minor is a warning naming both rules."""

from __future__ import annotations

from _doctor_helpers import doctor

LOADED_731 = "cudnn: [{version: 7.3.1, source: 'system:/usr/local/cuda', loaded_first: true}]\n"


def test_old_tensorflow_rejects_a_newer_cudnn_minor(tmp_path) -> None:
    d = doctor(tmp_path, LOADED_731 + "frameworks: {tensorflow: {version: 1.7.0, cudnn: 7.0.5}}\n")
    bad = [f for f in d.of("cudnn-mismatch") + d.of("cudnn-shadowed")
           if "same major.minor" in f["message"]]
    assert bad and bad[0]["severity"] == "error"
    assert "compatibility version 7300" in bad[0]["message"]
    assert "cuDNN 7.0" in bad[0]["fix"] and "1.8 or newer" in bad[0]["fix"]
    assert "cudnn_version.cc" in bad[0]["source"]
    assert d.code == 1


def test_tensorflow_1_8_and_later_accept_a_newer_minor(tmp_path) -> None:
    d = doctor(tmp_path, LOADED_731 + "frameworks: {tensorflow: {version: 1.12.0, cudnn: 7.0.5}}\n")
    assert not [f for f in d.findings if "same major.minor" in f["message"]]
    assert not [f for f in d.findings if f["component"] == "cudnn" and f["severity"] == "error"]


def test_unknown_release_names_both_rules(tmp_path) -> None:
    d = doctor(tmp_path, "cudnn: [{version: 7.3.1, loaded_first: true}]\n"
               "frameworks: {tensorflow: {cudnn: 7.0.3}}\n")
    warn = [f for f in d.findings if "TensorFlow 1.8 and later accept it" in f["message"]]
    assert warn and warn[0]["severity"] == "warning"
    assert "before 1.8 requires the same major.minor" in warn[0]["message"]
    assert "name the TensorFlow version" in warn[0]["fix"]
    assert d.data["verdict"] == "warn"


def test_same_minor_passes_for_any_release(tmp_path) -> None:
    for version in ("1.6.0", "1.14.0"):
        d = doctor(tmp_path, "cudnn: [{version: 7.0.5, loaded_first: true}]\n"
                   f"frameworks: {{tensorflow: {{version: {version}, cudnn: 7.0.3}}}}\n")
        assert not [f for f in d.findings if "major.minor" in f["message"]], version


def test_older_minor_is_an_error_whatever_the_release(tmp_path) -> None:
    d = doctor(tmp_path, "cudnn: [{version: 7.0.5, loaded_first: true}]\n"
               "frameworks: {tensorflow: {cudnn: 7.4.1}}\n")
    bad = [f for f in d.findings if f["severity"] == "error" and f["component"] == "cudnn"]
    assert bad and "minor be at least as high" in bad[0]["message"]
