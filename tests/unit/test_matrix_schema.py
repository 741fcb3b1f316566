"""Schema and consistency over all bundled data: every row parses, cites a source, and no
two rows contradict each other."""

from __future__ import annotations

import re

import pytest

from dnnctl.compat.matrix import load_matrix
from dnnctl.compat.schema import TABLES, row_key
from dnnctl.compat.suggest import cubin_status
from dnnctl.compat.versions import CC, Target, Version, VersionRange, parse_arch_list


@pytest.fixture(scope="module")
def m():
    return load_matrix()


def test_every_row_has_source_and_certainty(m) -> None:
    n = 0
    for rows in m.tables.values():
        for row in rows:
            n += 1
            assert row["source"].strip(), row.where
            assert row["certainty"] in ("V", "S", "?"), row.where
            assert row.line and row.file.startswith("compat/"), row.where
    assert n >= 180


def test_keys_are_unique(m) -> None:
    for table in TABLES:
        keys = [row_key(table, r) for r in m.rows(table)]
        assert len(keys) == len(set(keys)), table


def test_cuda_coverage_and_monotonic_drivers(m) -> None:
    versions = [Version.parse(r["version"]) for r in m.rows("cuda_releases")]
    for want in ("11.0", "11.8", "12.0", "12.4", "12.8", "12.9", "13.0", "13.1", "13.2"):
        assert Version.parse(want) in versions
    known = sorted((Version.parse(r["version"]), Version.parse(r["driver_linux"]))
                   for r in m.rows("cuda_releases") if r.get("driver_linux"))
    drivers = [d for _, d in known]
    assert drivers == sorted(drivers), "a newer CUDA must not need an older driver"
    for row in m.rows("cuda_releases"):
        for upd, drv in (row.get("updates") or {}).items():
            assert Version.parse(upd).trunc(2) == Version.parse(row["version"])
            assert Version.parse(drv) >= Version.parse(row["driver_linux"]), row.where
    majors = {r["major"] for r in m.rows("cuda_majors")}
    assert {v.major for v in versions} <= majors


def test_mvc_floor_is_the_major_ga_driver(m) -> None:
    for major in m.rows("cuda_majors"):
        if major.get("mvc") is False:  # before CUDA 11: no MVC floor, each release its own
            assert "mvc_min_driver" not in major
            continue
        ga = m.cuda_release(Version((major["major"], 0)))
        assert Version.parse(major["mvc_min_driver"]) >= Version.parse(ga["driver_linux"])


def test_cuda_targets_drop_and_add_architectures(m) -> None:
    def targets(v: str) -> set[str]:
        return set(m.cuda_release(Version.parse(v))["targets"])
    assert "3.7" in targets("11.8") and "3.7" not in targets("12.0")      # Kepler dropped
    assert "7.0" in targets("12.9") and "7.0" not in targets("13.0")      # Volta dropped
    assert {"5.0", "6.1"} & targets("13.0") == set()                       # Maxwell, Pascal
    assert {"10.0", "12.0"} <= targets("12.8") and "10.0" not in targets("12.6")
    assert {"10.3", "12.1"} <= targets("12.9") and "11.0" in targets("13.0")
    assert "7.5" in targets("13.0")                                         # Turing kept
    assert "10.0f" in m.cuda_release(Version.parse("12.9"))["family"]


def test_architectures_agree_with_cuda_targets(m) -> None:
    for arch in m.rows("architectures"):
        cc = arch["cc"]
        first = m.cuda_release(Version.parse(arch["min_cuda"]))
        if first is not None:
            assert cc in first["targets"] or any(cc == a for a in first.get("renamed", {}).values()) \
                or cc in (first.get("renamed") or {}).values(), arch.where
        if arch.get("last_cuda"):
            last = Version.parse(arch["last_cuda"])
            for rel in m.rows("cuda_releases"):
                v = Version.parse(rel["version"])
                if v > last:
                    assert cc not in rel["targets"], (arch.where, rel.where)
                elif v >= Version.parse(arch["min_cuda"]) and v.major >= 11:
                    assert cc in rel["targets"], (arch.where, rel.where)


def test_gpus_cover_kepler_to_blackwell_and_resolve_uniquely(m) -> None:
    gpus = m.rows("gpus")
    assert len(gpus) >= 50
    families = {m.arch(CC.parse(g["cc"]))["family"] for g in gpus}
    assert families >= {"kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada",
                        "hopper", "blackwell"}
    for name in ("Jetson AGX Orin", "Jetson Thor", "GB10", "B300", "RTX PRO 6000 Blackwell"):
        assert any(g["model"] == name for g in gpus), name
    for g in gpus:
        assert m.arch(CC.parse(g["cc"])) is not None, g.where
        for example in g["examples"]:
            assert m.gpu(example) is g, (example, g["model"], m.gpu(example)["model"])


def test_cudnn_rows_do_not_overlap(m) -> None:
    rows = m.rows("cudnn")
    probes = [Version.parse(f"{a}.{b}") for a in (8, 9) for b in range(0, 28)]
    for probe in probes:
        for major in (11, 12, 13):
            hits = [r for r in rows if r["cuda_major"] == major
                    and VersionRange.parse(r["versions"]).contains(probe)]
            assert len(hits) <= 1, (probe, [h.where for h in hits])


def test_torch_rows_consistent_with_cuda_and_cudnn(m) -> None:
    lines = {Version.parse(r["torch"]) for r in m.rows("torch")}
    assert Version.parse("1.13") in lines and Version.parse("2.14") in lines
    for row in m.rows("torch"):
        cuda = Version.parse(row["cuda"])
        assert row["variant"] == f"cu{cuda.major}{cuda.minor}", row.where
        rel = m.cuda_release(cuda)
        assert rel is not None, row.where
        targets = set(rel["targets"]) | set(rel.get("arch_specific") or [])
        for key in ("arch_list", "arch_list_aarch64"):
            for t in parse_arch_list(list(row.get(key) or [])):
                assert str(t.cc) in targets, (row.where, str(t), "CUDA cannot emit it")
        if "cudnn" not in row:  # not published yet (2.15): doctor says so instead of judging
            continue
        if cuda.major < 11:  # cudnn.yaml starts with CUDA 11: doctor says unknown-version
            continue
        cudnn = Version.parse(row["cudnn"])
        assert m.cudnn_rows(cudnn, cuda.major), (row.where, "bundled cuDNN has no row")
    for line in lines:  # at most one PyPI default per line
        assert sum(1 for r in m.torch_rows(str(line)) if r.get("pypi_default")) <= 1


def test_conflicting_sources_are_marked(m) -> None:
    row = m.torch_row("2.8", "cu128")
    assert "sm_70" in row["arch_uncertain"] and len(row["conflicts"]) >= 2
    assert cubin_status(CC.parse("7.0"), row, None) is None


def test_jax_and_tensorflow_and_cupy(m) -> None:
    for row in m.rows("jax"):
        for t in parse_arch_list(row["arch_list"]):
            assert isinstance(t, Target)
        assert "{version}" in row["install"] or "cuda" in row["install"]
    assert {r["plugin"] for r in m.rows("jax")} == {11, 12, 13}
    tf = [Version.parse(r["tensorflow"]) for r in m.rows("tensorflow")]
    assert Version.parse("2.18") in tf and Version.parse("2.12") in tf
    packages = {r["package"] for r in m.rows("cupy")}
    assert {"cupy-cuda11x", "cupy-cuda12x", "cupy-cuda13x"} <= packages
    for c in m.rows("package_conflicts"):
        assert re.fullmatch(c["pattern"], "cupy-cuda12x") or c["name"] != "cupy"
