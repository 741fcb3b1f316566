"""User overlays add and override rows; malformed ones fail with file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from dnnctl.compat.matrix import ENV_VAR, load_matrix
from dnnctl.errors import InputFileError

INHOUSE = """\
schema: dnnctl-matrix/1
torch:
  - {torch: "2.5", variant: cu128, cuda: "12.8", cudnn: "9.7.1.26", status: stable,
     arch_list: [sm_80, sm_90, sm_100, sm_120], source: "in-house build, CI job 1234", certainty: V}
gpus:
  - {model: Tesla V100, match: ['\\bV100S?\\b'], cc: "7.0", class: workstation,
     examples: ["Tesla V100-SXM2-16GB"], source: "site override", certainty: V}
"""


def write(tmp_path: Path, text: str, name: str = "extra.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_overlay_adds_and_overrides(tmp_path: Path) -> None:
    base = load_matrix()
    assert base.torch_row("2.5", "cu128") is None
    assert base.gpu("Tesla V100-SXM2-16GB")["class"] == "datacenter"
    m = load_matrix([write(tmp_path, INHOUSE)])
    row = m.torch_row("2.5", "cu128")
    assert row is not None and "sm_120" in row["arch_list"] and row.line == 3
    assert m.gpu("Tesla V100-SXM2-16GB")["class"] == "workstation"   # replaced, not added
    assert len(m.rows("gpus")) == len(base.rows("gpus"))
    assert str(tmp_path / "extra.yaml") in m.files


def test_env_var_overlays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = write(tmp_path, INHOUSE, "a.yaml")
    b = write(tmp_path, INHOUSE.replace("in-house build, CI job 1234", "second file"), "b.yaml")
    monkeypatch.setenv(ENV_VAR, f"{a}{__import__('os').pathsep}{b}")
    m = load_matrix()
    assert m.torch_row("2.5", "cu128")["source"] == "second file"   # later files win


@pytest.mark.parametrize("text, line, words", [
    ("schema: dnnctl-matrix/1\ntorch:\n  - {torch: \"2.5\", variant: cu128\n", 4, "YAML"),
    ("schema: dnnctl-matrix/1\ngpus:\n  - {model: X, match: ['X'], cc: \"9.0\", class: datacenter,\n"
     "     examples: [X], certainty: V}\n", 3, "source"),
    ("schema: dnnctl-matrix/1\ncuda_majors:\n  - {major: 12, mvc_min_driver: 525.60, source: s, "
     "certainty: V}\n", 3, "quote versions"),
    ("schema: dnnctl-matrix/1\ngpus:\n  - {model: X, match: ['('], cc: \"9.0\", class: datacenter,\n"
     "     examples: [X], source: s, certainty: V}\n", 3, "match"),
    ("schema: dnnctl-matrix/1\nwidgets:\n  - {a: 1}\n", 2, "unknown table"),
    ("schema: dnnctl-matrix/1\ncupy:\n  - {package: p, cupy: \">=1\", cuda: \">=12\", install: i,\n"
     "     source: s, certainty: X}\n", 3, "certainty"),
    ("schema: dnnctl-matrix/1\ncupy:\n  - {package: p, cupy: \">=1\", cuda: \">=12\", install: i, "
     "colour: red, source: s, certainty: V}\n", 3, "unknown field 'colour'"),
    ("schema: dnnctl-matrix/1\ncupy:\n  - {package: p, cupy: \">=1\", cuda: \">=12\", install: i, "
     "source: s, certainty: V}\n  - {package: p, cupy: \">=2\", cuda: \">=12\", install: i, "
     "source: s, certainty: V}\n", 4, "duplicate row"),
    ("torch: []\n", 1, "schema"),
])
def test_malformed_overlay_names_file_and_line(tmp_path: Path, text: str, line: int,
                                               words: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InputFileError) as info:
        load_matrix([path])
    err = info.value
    assert err.path == str(path) and err.line == line, str(err)
    assert words in str(err)
    assert err.exit_code == 2


def test_missing_overlay_file(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="cannot read"):
        load_matrix([tmp_path / "nope.yaml"])
