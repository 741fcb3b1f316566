"""jax against the jaxlib beside it (jax's own import check), and jax's CUDA plugin against
its PJRT wheel."""

from __future__ import annotations

import json
from pathlib import Path

from _doctor_helpers import doctor
from typer.testing import CliRunner

from dnnctl.cli.app import app
from dnnctl.compat.matrix import load_matrix
from dnnctl.compat.versions import Version, VersionRange

# a jax-cuda12-plugin of jaxlib's version keeps these jax builds off the CPU-only finding
PAIR = """
frameworks:
  jax: {version: "%s", jaxlib: "%s"}
packages: {jax: "%s", jaxlib: "%s", jax-cuda12-plugin: "%s", jax-cuda12-pjrt: "%s"}
"""


def _pair(tmp_path: Path, jax: str, jaxlib: str):
    plugin = jaxlib.split("+")[0]
    return doctor(tmp_path, PAIR % (jax, jaxlib, jax, jaxlib, plugin, plugin))


def test_jaxlib_newer_than_jax_fails_with_the_jax_of_jaxlibs_version(tmp_path: Path) -> None:
    # jax-ml/jax#17638 as its snapshot says it (no plugin: the CPU-only note's install line is
    # longer than 80 columns, so the report is read as JSON here)
    snap = tmp_path / "env.yaml"
    snap.write_text('schema: dnnctl-env/1\nframeworks:\n  jax: {version: "0.4.6", jaxlib: '
                    '"0.4.14"}\npackages: {jax: "0.4.6", jaxlib: "0.4.14"}\n')
    result = CliRunner().invoke(app, ["doctor", "--from", str(snap), "--json"])
    data = json.loads(result.stdout)
    [f] = [f for f in data["findings"] if f["code"] == "build-mismatch"]
    assert f["component"] == "jax" and f["severity"] == "error" and data["verdict"] == "fail"
    assert "is newer than and incompatible with jax version 0.4.6" in f["message"]
    assert f["evidence"] == {"jax": "0.4.6", "jaxlib": "0.4.14", "jaxlib_minimum": "0.4.4"}
    assert f["fix"] == ('`pip install "jax==0.4.14"` (the jax of jaxlib\'s version), or a '
                        'jaxlib that jax 0.4.6 accepts: `pip install "jaxlib>=0.4.4,<=0.4.6"`')
    assert "compat/pins.yaml" in f["source"] and "check_jaxlib_version" in f["source"]
    d = _pair(tmp_path, "0.4.26", "0.4.30")  # the human report, with a plugin
    commands = d.text.split("commands (one per line):")[1]
    assert 'pip install "jax==0.4.30"' in commands
    assert 'pip install "jaxlib>=0.4.20,<=0.4.26"' in commands


def test_jaxlib_older_than_the_releases_minimum_fails(tmp_path: Path) -> None:
    d = _pair(tmp_path, "0.4.25", "0.4.19")
    [f] = d.of("build-mismatch", "jax")
    assert "older than jax 0.4.25 accepts (jaxlib >= 0.4.20)" in f["message"]
    assert f["fix"] == ('a jaxlib that jax 0.4.25 accepts: `pip install "jaxlib>=0.4.20,<=0.4.25"`'
                        ' (and the jax-cuda*-plugin and -pjrt of that version), or '
                        '`pip install "jax==0.4.19"` (the jax of jaxlib\'s version)')
    # a CUDA jaxlib keeps its build only from jax's CUDA index: the jax side first
    f = _pair(tmp_path, "0.4.25", "0.4.19+cuda12.cudnn89").of("build-mismatch", "jax")[0]
    assert f["fix"].startswith('`pip install "jax==0.4.19"`')
    assert "(jaxlib>=0.4.20,<=0.4.25, from https://storage.googleapis.com/" in f["fix"]


def test_jaxlib_in_range_passes_and_the_local_tag_is_not_compared(tmp_path: Path) -> None:
    for jax, jaxlib in (("0.4.25", "0.4.20"), ("0.4.25", "0.4.25"), ("0.4.6", "0.4.4"),
                        ("0.3.25", "0.3.25+cuda11.cudnn82"), ("0.9.0.1", "0.9.0.1")):
        assert not _pair(tmp_path, jax, jaxlib).of("build-mismatch"), (jax, jaxlib)


def test_before_0_3_0_a_newer_jaxlib_was_accepted(tmp_path: Path) -> None:
    # jax 0.2.x checked only the minimum; the newer-than check came with 0.3.0
    assert not _pair(tmp_path, "0.2.28", "0.3.0").of("build-mismatch")
    assert _pair(tmp_path, "0.3.0", "0.3.2").of("build-mismatch", "jax")
    assert _pair(tmp_path, "0.2.28", "0.1.73").of("build-mismatch", "jax")  # below 0.1.74


def test_a_jax_newer_than_the_table_keeps_the_newer_than_check(tmp_path: Path) -> None:
    assert _pair(tmp_path, "0.12.0", "0.12.1").of("build-mismatch", "jax")
    assert not _pair(tmp_path, "0.12.0", "0.11.0").of("build-mismatch")  # minimum unknown


def test_a_plugin_follows_the_jaxlib_fix(tmp_path: Path) -> None:
    f = _pair(tmp_path, "0.4.31", "0.4.27").of("build-mismatch", "jax")[0]
    assert "(and the jax-cuda*-plugin and -pjrt of that version)" in f["fix"]


def test_one_side_unknown_is_not_judged(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'packages: {jax: "0.4.6", jaxlib: null}\n')
    assert not d.of("build-mismatch")


def test_jaxlib_minimum_rows_cover_every_release_once_in_order() -> None:
    """The rows tile 0.1.40-0.11.0 without gaps or overlaps, and a minimum never exceeds its
    jax release nor goes down."""
    rows = sorted(load_matrix().rows("jaxlib_minimum"),
                  key=lambda r: VersionRange.parse(r["jax"]).lowest())
    for a, b in zip(rows, rows[1:]):
        assert VersionRange.parse(a["jax"]).upper() == VersionRange.parse(b["jax"]).lowest()
        assert Version.parse(a["jaxlib"]) <= Version.parse(b["jaxlib"])
    for r in rows:
        assert Version.parse(r["jaxlib"]) <= VersionRange.parse(r["jax"]).lowest(), r.where
        assert r["rejects_newer"] == (VersionRange.parse(r["jax"]).lowest()
                                      >= Version.parse("0.3.0")), r.where


def test_pjrt_of_another_version_than_the_plugin_warns(tmp_path: Path) -> None:
    snap = ('packages: {jax: "0.6.0", jaxlib: "0.6.0", jax-cuda12-plugin: "0.6.0", '
            'jax-cuda12-pjrt: "%s"}\n')
    d = doctor(tmp_path, snap % "0.5.3")
    [f] = d.of("build-mismatch", "jax")
    assert f["severity"] == "warning" and "jax-cuda12-pjrt==0.6.0" in f["message"]
    assert f["fix"] == "`pip install 'jax-cuda12-pjrt==0.6.0'`"
    assert "plugin_setup.py" in f["source"]
    assert not doctor(tmp_path, snap % "0.6.0").of("build-mismatch")
