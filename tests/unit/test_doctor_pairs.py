"""Add-on versions that must pair: jax's CUDA plugin and jaxlib."""

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
