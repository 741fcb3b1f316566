"""doctor reads installed distributions without importlib.metadata (fast start): what it reads
must equal what importlib.metadata says, for every distribution installed here and for the
awkward METADATA layouts (folded headers, blank-looking continuation lines)."""

from __future__ import annotations

import sys
from importlib.metadata import PathDistribution
from pathlib import Path

from dnnctl.doctor.distinfo import Dist, headers, read_version
from dnnctl.doctor.host import Host


def test_every_installed_distribution_reads_like_importlib_metadata() -> None:
    dists, _ = Host(site_paths=list(sys.path)).distributions(lambda name: True)
    assert len(dists) > 10  # pytest, numpy, ... are installed
    for name, d in dists.items():
        ref = PathDistribution(d.info_dir)
        assert d.version == ref.version, name
        assert d.requires() == list(ref.requires or []), name
        assert d.files() == [Path(str(f.locate())) for f in (ref.files or [])], name


def test_folded_and_blank_continuation_lines(tmp_path: Path) -> None:
    info = tmp_path / "pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: pkg\nLicense: line one\n        \n        line two\n"
        "Version: 1.0.post1\nRequires-Dist: nvidia-cudnn-cu12 ==9.1.0.70 ; "
        "platform_system == \"Linux\"\nRequires-Dist: filelock\n\nVersion: 9.9 (body)\n")
    (info / "RECORD").write_text('pkg/__init__.py,sha256=x,1\n"pkg/a,b.so",,\n')
    ref = PathDistribution(info)
    d = Dist("pkg", read_version(info) or "", tmp_path, info)
    assert d.version == ref.version == "1.0.post1"
    assert d.requires() == list(ref.requires or [])
    assert d.files() == [Path(str(f.locate())) for f in (ref.files or [])]
    assert headers("License: a\n  b\n")["license"] == ["a b"]


def test_missing_or_broken_metadata_is_no_version(tmp_path: Path) -> None:
    info = tmp_path / "gone-1.0.dist-info"
    info.mkdir()
    assert read_version(info) is None
    (info / "METADATA").write_bytes(b"\xff\xfe\x00garbage")
    assert read_version(info) is None
    assert Dist("gone", "1.0", tmp_path, info).files() == []
