"""Rules from the twenty-first set of real reports: a cuDNN copy known only by its major is
not judged against a build's minor, and a version check reads only cuDNN's versions."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor

CT2 = ("packages: {ctranslate2: \"4.5.0\"}\nframeworks: {torch: {version: \"2.5.1\"}}\n"
       "cudnn: [{version: \"9\", path: /venv/lib/python3.11/site-packages/nvidia/cudnn/lib}]\n")


def test_a_major_only_cudnn_is_not_called_too_old(tmp_path: Path) -> None:
    d = doctor(tmp_path, CT2)
    assert not [f for f in d.findings if f["code"] in ("cudnn-mismatch", "cudnn-shadowed")
                and f["severity"] == "error"]


def test_the_loader_not_finding_it_is_the_likely_cause(tmp_path: Path) -> None:
    d = doctor(tmp_path, CT2 + 'errors: ["Unable to load any of {libcudnn_cnn.so.9.1.0, '
               'libcudnn_cnn.so.9.1, libcudnn_cnn.so.9, libcudnn_cnn.so}"]\n')
    [f] = d.of("error-message")
    assert "not where the loader looks" in f["message"] and "LD_LIBRARY_PATH" in f["fix"]


def test_jax_outdated_cudnn_is_recognized(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'errors: ["Outdated cuDNN installation found."]\n')
    [f] = d.of("error-message")
    assert f["evidence"]["error_row"] == "jax-outdated-library"
