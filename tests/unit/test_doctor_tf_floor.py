"""TensorFlow's official binaries' lowest compute capability per release (tensorflow_floors),
judged whether or not the release has a CUDA / cuDNN row."""

from __future__ import annotations

import pytest
from _doctor_helpers import doctor

from dnnctl.compat.matrix import load_matrix
from dnnctl.compat.versions import release_key
from dnnctl.errors import UsageError

KEPLER30 = "gpus: [{name: GeForce GTX 660 Ti, compute_capability: '3.0'}]\n"
K40 = "gpus: [{name: Tesla K40c, compute_capability: '3.5'}]\n"
LINUX = "os: 'Ubuntu 16.04.4 LTS; Linux 4.13.0-36-generic x86_64'\n"


def _tf(version: str, package: str = "tensorflow-gpu") -> str:
    return (f"frameworks: {{tensorflow: {{version: '{version}', package: {package}}}}}\n"
            f"packages: {{{package}: '{version}'}}\n")


def test_release_keys_tell_release_candidates_apart() -> None:
    assert release_key("0.12.0rc0") < release_key("0.12.0rc1") < release_key("0.12.0") \
        == release_key("0.12") < release_key("0.12.1") < release_key("1.0")
    assert release_key("2.4.1+nv") == release_key("2.4.1")
    with pytest.raises(UsageError):
        release_key("1.0x1")


def test_every_floor_row_is_a_bounded_release_range() -> None:
    for row in load_matrix().rows("tensorflow_floors"):
        assert not row.get("before") or release_key(row["first"]) < release_key(row["before"])


def test_windows_0_12_0rc0_has_no_code_for_compute_capability_3_0(tmp_path):
    """audit14 case 06 (tensorflow/tensorflow#6125): no CUDA row for 0.12, still judged."""
    d = doctor(tmp_path, "os: Windows 10\n" + KEPLER30 + _tf("0.12.0rc0"))
    [f] = d.of("arch-unsupported", "tensorflow")
    assert f["severity"] == "error" and d.code == 1
    assert "official Windows binaries start at compute capability 3.5 (built for 3.5, 5.2)" \
        in f["message"] and "minimum required Cuda capability is 3.5" in f["message"]
    assert '`pip install "tensorflow-gpu==0.12.*"`' in f["fix"]
    assert 'TF_CUDA_COMPUTE_CAPABILITIES="3.0"' in f["fix"]
    assert "tensorflow/tensorflow#6125" in f["source"] and "#6083" in f["source"]
    assert not d.of("unknown-version", "tensorflow")  # the GPU is ruled out anyway


def test_the_next_release_candidate_runs_on_3_0_on_windows(tmp_path):
    d = doctor(tmp_path, "os: Windows 10\n" + KEPLER30 + _tf("0.12.0rc1"))
    assert not d.of("arch-unsupported", "tensorflow")
    assert d.of("unknown-version", "tensorflow")  # no tested configuration: still said


def test_the_windows_floor_is_not_applied_where_the_os_is_unknown(tmp_path):
    d = doctor(tmp_path, KEPLER30 + _tf("0.12.0rc0"))
    assert not d.of("arch-unsupported", "tensorflow")


def test_tf_1_x_binaries_start_at_3_5_beside_their_cuda_row(tmp_path):
    """tensorflow/tensorflow#17445: a Quadro K2000M (3.0) ignored by the Ubuntu binary."""
    d = doctor(tmp_path, LINUX + "driver: {version: '390.48'}\n"
               "gpus: [{name: Quadro K2000M, compute_capability: '3.0'}]\n" + _tf("1.8.0"))
    [f] = d.of("arch-unsupported", "tensorflow")
    assert "its official binaries start at compute capability 3.5" in f["message"]
    assert 'TF_CUDA_COMPUTE_CAPABILITIES="3.0"' in f["fix"] and "#17445" in f["source"]
    assert not any("arch list" in u["message"] for u in d.of("unknown-version", "tensorflow"))


def test_a_gpu_at_the_floor_is_not_ruled_out(tmp_path):
    d = doctor(tmp_path, LINUX + "driver: {version: '390.48'}\n" + K40 + _tf("1.8.0"))
    assert not d.of("arch-unsupported", "tensorflow")
    # above the floor, which code the binaries carry is still unknown: said, not passed
    assert any("arch list" in u["message"] for u in d.of("unknown-version", "tensorflow"))


def test_tf_2_3_on_compute_capability_3_0_is_ruled_out_too(tmp_path):
    d = doctor(tmp_path, LINUX + "driver: {version: '450.80.02'}\n" + KEPLER30
               + _tf("2.3.1", "tensorflow"))
    assert d.of("arch-unsupported", "tensorflow")


def test_an_uncertain_floor_is_not_judged_as_a_failure(tmp_path):
    """tensorflow/tensorflow#22594 (1.11.0 on Windows wants 3.7?) is a report, not a fact."""
    d = doctor(tmp_path, "os: Windows 10\n"
               "gpus: [{name: GeForce GTX 780 Ti, compute_capability: '3.5'}]\n" + _tf("1.11.0"))
    assert not d.of("arch-unsupported", "tensorflow")
    assert any("a report says they need compute capability 3.7" in u["message"]
               and "#22594" in u["source"] for u in d.of("unknown-version", "tensorflow"))


@pytest.mark.parametrize("snapshot", [
    LINUX + KEPLER30 + _tf("1.5.0"),  # no source gives Linux 1.5's floor: not judged by it
    # a build that reports its own architectures is judged by them, not by the floor
    LINUX + KEPLER30 + "frameworks: {tensorflow: {version: '1.8.0', arch_list: [sm_30]}}\n",
    "os: Windows 10\n" + KEPLER30 + _tf("0.12.0rc0", "tensorflow-cpu"),  # a CPU build
])
def test_no_floor_where_none_applies(tmp_path, snapshot):
    assert not doctor(tmp_path, snapshot).of("arch-unsupported", "tensorflow")
