"""Versions compare numerically; compute capabilities and targets follow CUDA's rules."""

from __future__ import annotations

import pytest

from dnnctl.compat.versions import (
    CC,
    Target,
    TorchVersion,
    Version,
    VersionRange,
    cmp_versions,
    cuda_from_tag,
    cudnn_from_int,
    parse_arch_list,
    parse_cudnn,
    tag_from_cuda,
)
from dnnctl.errors import UsageError


@pytest.mark.parametrize("newer, older", [
    ("570.124.06", "570.26"), ("580.65.06", "575.57.08"), ("12.10", "12.9"),
    ("9.10.2.21", "9.9.0.52"), ("2.10.0", "2.9.1"), ("13.0.2", "13.0"),
])
def test_numeric_order(newer: str, older: str) -> None:
    assert Version.parse(newer) > Version.parse(older)
    assert cmp_versions(newer, older) == 1 and cmp_versions(older, newer) == -1


def test_string_compare_would_be_wrong_and_ours_is_not() -> None:
    assert "570.124.06" < "570.26"  # lexical: wrong
    assert Version.parse("570.124.06") > Version.parse("570.26")


def test_trailing_zeros_and_text_kept() -> None:
    assert Version.parse("12.8") == Version.parse("12.8.0")
    assert str(Version.parse("595.45.04")) == "595.45.04"  # leading zeros survive display
    assert Version.parse("2.2.0+cu121") == Version.parse("2.2")
    assert Version.maybe("garbage") is None and Version.maybe(None) is None
    with pytest.raises(UsageError):
        Version.parse("abc")


@pytest.mark.parametrize("spec, inside, outside", [
    (">=9.11, <9.17", ["9.11.0", "9.16.1.4"], ["9.10.2.21", "9.17.0"]),
    ("==2.7.*", ["2.7.0", "2.7.1"], ["2.8.0", "2.70"]),
    (">=12.1, <13", ["12.1", "12.9.1"], ["12.0.1", "13.0"]),
    ("12.8", ["12.8.0"], ["12.8.1"]),
])
def test_ranges(spec: str, inside: list[str], outside: list[str]) -> None:
    r = VersionRange.parse(spec)
    assert all(r.contains(v) for v in inside)
    assert not any(r.contains(v) for v in outside)


def test_torch_versions_and_tags() -> None:
    tv = TorchVersion.parse("2.2.0+cu121")
    assert tv.line == "2.2" and tv.local == "cu121" and tv.cuda == Version.parse("12.1")
    assert TorchVersion.parse("2.9.0").local is None
    assert TorchVersion.parse("2.8.0.dev20250301+cu128").is_dev
    assert cuda_from_tag("cu130") == Version.parse("13.0") and cuda_from_tag("cpu") is None
    assert tag_from_cuda("11.8") == "cu118"


def test_cudnn_integer_encodings() -> None:
    assert str(cudnn_from_int(8907)) == "8.9.7"      # v8: M*1000 + m*100 + p
    assert str(cudnn_from_int(90100)) == "9.1.0"     # v9: M*10000 + m*100 + p
    assert str(cudnn_from_int(92600)) == "9.26.0"
    assert parse_cudnn("90100") == Version.parse("9.1.0")
    assert parse_cudnn("9.10.2.21") == Version.parse("9.10.2.21")
    assert parse_cudnn(None) is None


def test_cc_parsing() -> None:
    assert CC.parse("sm_90") == CC(9, 0) == CC.parse("9.0") == CC.parse("90")
    assert CC.parse("sm_120") == CC(12, 0) and CC.parse("12.1") > CC.parse("12.0")
    assert CC.parse("sm_100a") == CC(10, 0)
    with pytest.raises(UsageError):
        CC.parse("B200")


@pytest.mark.parametrize("target, gpu, runs", [
    ("sm_86", "8.9", True),      # same major, higher minor: binary compatible
    ("sm_80", "8.6", True),
    ("sm_86", "8.0", False),     # never backwards
    ("sm_90", "10.0", False),    # nothing crosses 9.x -> 10.x
    ("sm_100", "10.3", True),    # B300 runs sm_100 cubins
    ("sm_100", "11.0", False),   # Thor is another major
    ("sm_120", "12.1", True),    # GB10 runs sm_120 cubins
    ("compute_90", "10.0", True),  # PTX JIT-compiles forward
    ("compute_90", "8.9", False),
    ("compute_37", "12.0", True),
    ("sm_90a", "9.0", True),     # arch-specific: exact CC only
    ("sm_100a", "10.3", False),
    ("compute_90a", "10.0", False),
    ("sm_100f", "10.3", True),   # family: same major
    ("sm_100f", "12.0", False),
])
def test_target_rules(target: str, gpu: str, runs: bool) -> None:
    assert Target.parse(target).runs_on(CC.parse(gpu)) is runs


def test_arch_list_formats() -> None:
    got = [str(t) for t in parse_arch_list("7.5;8.0;9.0a;12.0+PTX")]
    assert got == ["sm_75", "sm_80", "sm_90a", "sm_120", "compute_120"]
    assert [str(t) for t in parse_arch_list(["sm_80", "compute_90"])] == ["sm_80", "compute_90"]


@pytest.mark.parametrize("rng, version, admitted", [
    (">=12.1, <13", "12", True),  # jax-cuda12-plugin: "some 12.x", never 12.0
    (">=12.1, <13", "12.0", False),  # a real 12.0 is below the bound
    (">=11.8, <12", "11", True), (">=11.8, <12", "12", False), (">=12.1, <13", "13", False),
    (">=11.2, <12", "11", True), ("==12.8.*", "12", True), ("<12.0", "12", False),
    ("<=12.0", "12", True), (">12.9", "12", True), (">=13.0, <14", "12", False),
])
def test_a_major_only_version_is_judged_by_its_major(rng: str, version: str,
                                                     admitted: bool) -> None:
    v = Version.parse(version)
    assert v.major_only == ("." not in version)
    assert VersionRange.parse(rng).admits(v) is admitted
    assert VersionRange.parse(rng).contains(Version.parse("12.0")) is (
        VersionRange.parse(rng).admits(Version.parse("12.0")))
