"""A cuDNN found first that is an older minor of the same major than another copy listed is
a warning naming the newer copy's directory (NVIDIA's cuDNN API compatibility rule: newer
minors only)."""

from __future__ import annotations

from _doctor_helpers import doctor

TWO_CUDNN = """cudnn:
  - {version: "7.3", loaded_first: true}
  - {version: "7.6.5", source: "system:/usr/local/cuda",
     path: /usr/local/cuda/lib64/libcudnn.so.7, loaded_first: false}
"""


def test_older_minor_found_first_names_the_newer_directory(tmp_path) -> None:
    d = doctor(tmp_path, "gpus: [{name: Tesla T4}]\n" + TWO_CUDNN)
    warn = d.of("library-copies", "cudnn")
    assert len(warn) == 1 and warn[0]["severity"] == "warning"
    assert "cuDNN 7.3" in warn[0]["message"] and "cuDNN 7.6.5" in warn[0]["message"]
    assert "export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH" in warn[0]["fix"]
    assert "export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH" in d.text
    assert "cudnn-765" in warn[0]["source"]
    assert d.data["verdict"] == "warn"


def test_newer_first_other_major_or_a_wheel_copy_is_not_flagged(tmp_path) -> None:
    newer_first = TWO_CUDNN.replace("loaded_first: true", "loaded_first: X").replace(
        "loaded_first: false", "loaded_first: true").replace("loaded_first: X",
                                                            "loaded_first: false")
    assert not doctor(tmp_path, newer_first).of("library-copies")
    other_major = TWO_CUDNN.replace('"7.6.5"', '"8.9.7"').replace(".so.7", ".so.8")
    assert not doctor(tmp_path, other_major).of("library-copies")
    same_minor = TWO_CUDNN.replace('"7.3"', '"7.6.4"')
    assert not doctor(tmp_path, same_minor).of("library-copies")
    wheel = TWO_CUDNN.replace('source: "system:/usr/local/cuda"', 'source: "pip:nvidia-cudnn-cu11"')
    assert not doctor(tmp_path, wheel).of("library-copies", "cudnn")


def test_newer_copy_without_a_path_gets_no_made_up_command(tmp_path) -> None:
    no_path = TWO_CUDNN.replace("path: /usr/local/cuda/lib64/libcudnn.so.7, ", "")
    warn = doctor(tmp_path, no_path).of("library-copies", "cudnn")
    assert warn and "export" not in warn[0]["fix"]


def test_a_framework_that_states_its_cudnn_is_left_to_the_framework_rules(tmp_path) -> None:
    d = doctor(tmp_path, TWO_CUDNN + "frameworks: {tensorflow: {cudnn: 7.6.5}}\n")
    assert not d.of("library-copies", "cudnn")
    assert d.of("cudnn-mismatch")
