"""A build's own cuDNN against the copy that loads, whether or not the matrix has a row for
the framework version: the framework checks it itself at start (same major, minor at least
the compiled one), so the doctor needs no release table for it."""

from __future__ import annotations

from pathlib import Path

from tests.unit._doctor_helpers import doctor

# torch built with cuDNN 7.5.1; the system 7.0.3 loads first (pytorch/pytorch#20844: 1.1.0,
# which has rows now; 0.4.1 here keeps the no-rows path under test)
TORCH_OLD = """
driver: {version: "384.130"}
gpus: [{index: 0, name: GeForce GTX 1080}]
cuda_runtimes: [{version: "9.0.176", source: "conda:cudatoolkit"}]
cudnn:
  - {version: "%s", source: "system:/usr/local/cuda-9.0", path: /usr/local/cuda-9.0/lib64/libcudnn.so.7, loaded_first: true}
frameworks:
  torch: {version: "0.4.1", cuda: "9.0.176", cudnn: "7.5.1"}
"""


def test_torch_without_rows_older_system_cudnn_is_an_error(tmp_path: Path) -> None:
    d = doctor(tmp_path, TORCH_OLD % "7.0.3")
    assert d.data["verdict"] == "fail"
    [f] = d.of("cudnn-shadowed")
    assert f["severity"] == "error"
    assert f["evidence"]["cudnn_compiled"] == "7.5.1"
    assert f["evidence"]["cudnn_loaded"] == "7.0.3"
    assert "install cuDNN 7.5 or newer of major 7" in f["fix"]
    assert "/usr/local/cuda-9.0/lib64" in f["fix"]
    assert "PyTorch was" in f["source"]
    assert "was built against cuDNN 7.5.1" in d.text
    # what was and was not checked is said once, on the torch line
    assert "cuDNN 7.5.1 against the copy that loads" in d.text


def test_torch_without_rows_newer_system_cudnn_is_fine(tmp_path: Path) -> None:
    d = doctor(tmp_path, TORCH_OLD % "7.6.5")
    assert not {"cudnn-shadowed", "cudnn-mismatch"} & d.codes()
    assert d.of("cudnn-shadowed")[0]["severity"] == "info"  # compatible, not the tested copy
    assert d.data["verdict"] != "fail"


# TensorFlow, version unknown, built with cuDNN 8.1.0; 8.0.4 loads (google-research/deeplab2#66)
TF_UNKNOWN = """
cudnn:
  - {version: "%s", source: "unknown", loaded_first: true}
  - {version: "8.1.0", source: "somewhere"}
frameworks:
  tensorflow: {cudnn: "8.1.0"}
"""


def test_tensorflow_version_unknown_older_loaded_cudnn(tmp_path: Path) -> None:
    d = doctor(tmp_path, TF_UNKNOWN % "8.0.4")
    [f] = d.of("cudnn-mismatch")
    assert f["severity"] == "error" and f["component"] == "cudnn"
    assert "tensorflow (version unknown) was built against cuDNN 8.1.0" in f["message"]
    assert "install cuDNN 8.1 or newer of major 8" in f["fix"]
    assert "matching major version" in f["source"]
    assert d.of("not-judged", "tensorflow")


def test_tensorflow_version_unknown_same_minor_passes_the_check(tmp_path: Path) -> None:
    d = doctor(tmp_path, TF_UNKNOWN % "8.1.1")
    assert "cudnn-mismatch" not in d.codes() and "cudnn-shadowed" not in d.codes()
    assert d.data["verdict"] == "warn"  # no-gpu only


def test_major_mismatch_without_rows(tmp_path: Path) -> None:
    d = doctor(tmp_path, TF_UNKNOWN.replace('"8.1.0"}', '"7.6.5"}') % "8.0.4")
    [f] = d.of("cudnn-mismatch")
    assert "needs cuDNN 7.x" in f["message"]


def test_no_cudnn_listed_is_not_claimed_as_checked(tmp_path: Path) -> None:
    d = doctor(tmp_path, "frameworks:\n  tensorflow: {cudnn: \"8.1.0\"}\n")
    assert "cudnn-mismatch" not in d.codes()
    assert "against the copy that loads" not in d.text


# jaxlib +cuda11.cudnn86 with a system cuDNN 8.4.1 (marin-community/levanter#103); jax 0.4.6
# has no plugin row in the matrix
JAX_OLD = """
cuda_runtimes: [{version: "11.7", source: "system:/usr/local/cuda"}]
cudnn: [{version: "%s", source: "system", loaded_first: true}]
frameworks:
  jax: {version: "0.4.6", jaxlib: "0.4.6+cuda11.cudnn86"}
"""


def test_jax_without_a_row_checks_the_tag_cudnn(tmp_path: Path) -> None:
    d = doctor(tmp_path, JAX_OLD % "8.4.1")
    assert {"cudnn-mismatch", "unknown-version"} <= d.codes()
    [f] = d.of("cudnn-mismatch")
    assert f["evidence"]["cudnn_compiled"] == "8.6" and f["evidence"]["cudnn_loaded"] == "8.4.1"
    assert "jax-ml/jax#15268" in f["source"]


def test_jax_without_a_row_newer_cudnn_is_fine(tmp_path: Path) -> None:
    d = doctor(tmp_path, JAX_OLD % "8.9.2")
    assert "cudnn-mismatch" not in d.codes()
    assert d.codes() == {"no-gpu", "unknown-version"}


# a jaxlib built with cuDNN 8.1.0 (no matrix row for it) and the one cuDNN copy listed,
# with no copy marked as the one that loads first (jax-ml/jax#6517)
JAX_ONE_COPY = """
cuda_runtimes: [{version: "11.2"}]
cudnn: [%s]
frameworks:
  jax: {jaxlib: "0.1.65+cuda112", cuda: "11.2", cudnn: "8.1.0"}
packages: {jaxlib: "0.1.65+cuda112"}
"""


def test_the_only_copy_listed_is_the_one_judged(tmp_path: Path) -> None:
    d = doctor(tmp_path, JAX_ONE_COPY % '{version: "8.0.5"}')
    bad = d.of("cudnn-mismatch")
    assert bad and bad[0]["severity"] == "error" and "8.1.0" in bad[0]["message"]
    assert "8.0.5" in bad[0]["message"] and d.code == 1
    assert not doctor(tmp_path, JAX_ONE_COPY % '{version: "8.1.1"}').of("cudnn-mismatch")


def test_two_copies_of_the_major_and_none_marked_are_not_guessed(tmp_path: Path) -> None:
    d = doctor(tmp_path, JAX_ONE_COPY % '{version: "8.0.5"}, {version: "8.2.1"}')
    assert not [f for f in d.of("cudnn-mismatch") if f["severity"] == "error"]
