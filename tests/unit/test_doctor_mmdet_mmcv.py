"""MMDetection against the mmcv beside it: the range `import mmdet` asserts."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor

from dnnctl.doctor.rules_mmdet import admits


def test_mmcv_outside_this_releases_range_is_an_error_with_both_fixes(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'frameworks:\n  torch: {version: "1.7.0+cu110"}\n'
               'packages: {mmdet: "2.7.0", mmcv-full: "1.3.9", torch: "1.7.0+cu110"}\n')
    [f] = d.of("build-mismatch", "mmdet")
    assert f["severity"] == "error" and d.data["verdict"] == "fail"
    assert "MMCV==1.3.9 is used but incompatible. Please install mmcv>=1.1.5, <=1.3." \
        in f["message"]
    commands = d.text.split("commands (one per line):")[1]
    assert 'pip install "mmdet==2.19.1"' in commands  # the newest that accepts 1.3.9
    # mmdet 2.x's two-part maximum "1.3" admits no 1.3.x: the pip range says so
    assert 'python -m mim install "mmcv-full>=1.1.5,<1.3"' in commands
    assert "https://download.openmmlab.com/mmcv/dist/cu110/torch1.7.0/index.html" in f["fix"]
    assert "compat/pins.yaml" in f["source"] and "mmdetection#5803" in f["source"]


def test_mmdet_of_unknown_version_is_not_judged_naming_the_releases(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'packages: {mmcv-full: "1.3.9", mmdet: null}\n')  # mmdetection#5803
    [f] = d.of("not-judged", "mmdet")
    assert "mmcv-full 1.3.9 is accepted by mmdet 2.11.0..2.19.1" in f["message"]
    assert d.data["verdict"] != "fail"


def test_mmcv_in_range_passes(tmp_path: Path) -> None:
    for mmdet, pkg, mmcv in (("2.28.2", "mmcv-full", "1.7.1"), ("2.7.0", "mmcv-full", "1.2.7"),
                             ("3.3.0", "mmcv", "2.1.0"), ("3.0.0", "mmcv", "2.0.0rc4")):
        d = doctor(tmp_path, f'packages: {{mmdet: "{mmdet}", {pkg}: "{mmcv}"}}\n')
        assert not d.of("build-mismatch"), (mmdet, mmcv)


def test_the_releases_own_comparisons() -> None:
    two = {"mmcv_min": "1.1.5", "mmcv_max": "1.3", "upper": "<="}
    assert admits(two, "1.2.7") and not admits(two, "1.3.0") and not admits(two, "1.1.4")
    inclusive = {"mmcv_min": "1.3.17", "mmcv_max": "1.8.0", "upper": "<="}
    assert admits(inclusive, "1.8.0") and not admits(inclusive, "1.8.1")
    three = {"mmcv_min": "2.0.0rc4", "mmcv_max": "2.2.0", "upper": "<"}
    assert admits(three, "2.0.0rc4") and admits(three, "2.0.0") and admits(three, "2.1.0")
    assert not admits(three, "2.0.0rc3") and not admits(three, "2.2.0")


def test_mmdet_3_with_mmcv_2_2_is_an_error(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'packages: {mmdet: "3.3.0", mmcv: "2.2.0"}\n')
    [f] = d.of("build-mismatch", "mmdet")
    assert "mmcv>=2.0.0rc4, <2.2.0" in f["message"]
    assert '`python -m mim install "mmcv>=2.0.0rc4,<2.2.0"`' in f["fix"]
    assert "index" not in f["fix"]  # torch unknown: no index named
