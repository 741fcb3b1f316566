"""compat/kernel_modules.yaml and compat/toolchain.yaml: the tables load, and their ranges
answer as the sources say."""

from __future__ import annotations

import pytest

from dnnctl.compat.matrix import load_matrix
from dnnctl.compat.versions import CC, Version, VersionRange


@pytest.fixture(scope="module")
def m():
    return load_matrix()


def test_flavors(m) -> None:
    assert CC.parse(m.kernel_flavor("open")["min_cc"]) == CC(7, 5)
    prop = m.kernel_flavor("proprietary")
    assert CC.parse(prop["below_cc"]) == CC(10, 0) and prop["runfile"] == \
        "--kernel-module-type=proprietary"
    assert "{branch}" in prop["install_dnf_module"]


@pytest.mark.parametrize(("cuda", "gcc_max"), [
    ("10.2", 8), ("10.2.89", 8), ("11.0.3", 9), ("11.3.1", 10), ("11.4.1", 11), ("11.8", 11),
    ("12.1", 12), ("12.4", 13), ("12.6.3", 13), ("12.8", 14), ("13.0", 15), ("13.3", 15),
    ("13.4.1", 16)])
def test_gcc_ceiling_per_release(m, cuda, gcc_max) -> None:
    rows = m.nvcc_host_rows(Version.parse(cuda))
    assert [r["gcc_max"] for r in rows] == [gcc_max]


def test_a_bare_minor_spans_its_updates_and_rows_do_not_overlap(m) -> None:
    assert len(m.nvcc_host_rows(Version.parse("11.4"))) == 2  # 11.4.0 and 11.4.1+
    assert m.nvcc_host_rows(Version.parse("12.7")) == []  # never released
    ranges = [VersionRange.parse(r["cuda"]) for r in m.rows("nvcc_host_compilers")]
    for probe in ("8.0", "9.1", "10.0.130", "11.4.0", "11.4.2", "12.2.2", "12.9.1", "13.2"):
        assert sum(r.contains(Version.parse(probe)) for r in ranges) == 1, probe
