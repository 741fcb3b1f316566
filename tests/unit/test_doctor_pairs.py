"""Add-on versions that must pair (jax's CUDA plugin and jaxlib; apex's build and torch's CUDA
minor; a TensorRT engine and the runtime), and add-on GPU minimums per version (bitsandbytes)."""

from __future__ import annotations

from pathlib import Path

from tests.unit._doctor_helpers import doctor

JAX = """
frameworks:
  jax: {version: "%s"}
packages: {jax: "%s", jaxlib: "%s", jax-cuda12-plugin: "%s", jax-cuda12-pjrt: "%s"}
"""


def test_jax_plugin_of_another_version_than_jaxlib(tmp_path: Path) -> None:
    d = doctor(tmp_path, JAX % ("0.9.0.1", "0.9.0.1", "0.9.0.1", "0.9.2", "0.9.2"))
    [f] = d.of("build-mismatch", "jax")
    assert f["severity"] == "error" and "will not be used" in f["message"]
    assert f["evidence"] == {"plugin": "0.9.2", "jaxlib": "0.9.0.1"}
    assert "plugin_support.py" in f["source"]
    commands = d.text.split("commands (one per line):")[1]
    assert "pip install 'jax-cuda12-plugin==0.9.0.1' 'jax-cuda12-pjrt==0.9.0.1'" in commands
    assert d.data["verdict"] == "fail"


def test_jax_plugin_of_jaxlibs_version_is_no_finding(tmp_path: Path) -> None:
    d = doctor(tmp_path, JAX % ("0.4.30", "0.4.30", "0.4.30", "0.4.30", "0.4.30"))
    assert not d.of("build-mismatch")
    # a suffix after the dotted numbers is not compared (the check's own regex)
    d = doctor(tmp_path, JAX % ("0.4.30", "0.4.30", "0.4.30", "0.4.30.post1", "0.4.30"))
    assert not d.of("build-mismatch")


BNB = """
gpus: [{name: %s}]
packages: {bitsandbytes: "%s"}
"""


def test_bitsandbytes_before_0_37_has_no_int8_matmul_below_sm75(tmp_path: Path) -> None:
    d = doctor(tmp_path, BNB % ("Tesla P40", "0.36.0.post2"))
    [f] = d.of("arch-unsupported", "bitsandbytes")
    assert f["severity"] == "error" and "7.5" in f["message"] and "0.37.0" in f["source"]
    assert "pip install -U 'bitsandbytes>=0.37.0'" in d.text.split("commands (one per line):")[1]
    assert not doctor(tmp_path, BNB % ("Tesla P40", "0.37.0")).of("arch-unsupported")
    assert not doctor(tmp_path, BNB % ("Tesla T4", "0.36.0")).of("arch-unsupported")


def test_bitsandbytes_pip_binaries_from_0_39_have_no_kepler_code(tmp_path: Path) -> None:
    d = doctor(tmp_path, BNB % ("Tesla K80", "0.45.0"))
    [f] = d.of("arch-unsupported", "bitsandbytes")
    assert "Kepler" in f["message"] and "from source" in f["fix"]


APEX = """
cuda_runtimes:
  - {version: "%s", source: "system:/usr/local/cuda"}
frameworks:
  torch: {version: "2.1.2+cu121"}
packages: {torch: "2.1.2+cu121"%s}
"""


def test_apex_needs_torchs_cuda_minor_to_build(tmp_path: Path) -> None:
    d = doctor(tmp_path, APEX % ("12.2", ", apex: null"))
    [f] = d.of("cuda-mismatch", "apex")
    assert f["severity"] == "warning" and "same major.minor" in f["message"]
    assert f["fix"].startswith("install the CUDA 12.1 toolkit") and "apex#323" in f["source"]
    # without apex the minor difference is torch's warning only
    d = doctor(tmp_path, APEX % ("12.2", ""))
    assert not d.of("cuda-mismatch", "apex")
    assert [f["severity"] for f in d.of("cuda-mismatch", "cuda")] == ["info"]
    assert not doctor(tmp_path, APEX % ("12.1", ", apex: null")).of("cuda-mismatch")


TRT = """
frameworks:
  tensorrt: {version: "%s", engines_built_with: ["%s"]%s}
"""


def test_tensorrt_engine_built_by_another_version(tmp_path: Path) -> None:
    d = doctor(tmp_path, TRT % ("8.4.1.5", "8.5.2.2", ""))
    [f] = d.of("build-mismatch", "tensorrt")
    assert f["severity"] == "error" and f["evidence"] == {"engine_tensorrt": "8.5.2.2",
                                                          "tensorrt": "8.4.1.5"}
    assert f["fix"].startswith("rebuild the engine on this machine with TensorRT 8.4.1.5")
    assert not doctor(tmp_path, TRT % ("8.4.1.5", "8.4.1.5", "")).of("build-mismatch")


def test_version_compatible_engines_run_on_newer_runtimes(tmp_path: Path) -> None:
    vc = ", version_compatible: true"
    assert not doctor(tmp_path, TRT % ("8.6.1", "8.6.0", vc)).of("build-mismatch")
    assert not doctor(tmp_path, TRT % ("10.3.0", "8.6.1", vc)).of("build-mismatch")
    assert doctor(tmp_path, TRT % ("8.6.0", "8.6.1", vc)).of("build-mismatch")  # older runtime
    assert doctor(tmp_path, TRT % ("11.4.1", "8.6.1", vc)).of("build-mismatch")
