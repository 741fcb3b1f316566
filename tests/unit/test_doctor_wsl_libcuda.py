"""In WSL 2 the driver's libcuda.so lives in /usr/lib/wsl/lib: a package that opens it by that
unversioned name (bitsandbytes before 0.40.1) needs the directory on LD_LIBRARY_PATH."""

from __future__ import annotations

from pathlib import Path

import pytest
from _doctor_helpers import doctor

WSL2 = 'os: "Ubuntu 22.04 (WSL 2)"\n'
EXPORT = "export LD_LIBRARY_PATH=/usr/lib/wsl/lib:$LD_LIBRARY_PATH"


@pytest.mark.parametrize("version", ["0.35.0", "0.40.0"])
def test_an_old_bitsandbytes_in_wsl2_warns_with_the_export(tmp_path: Path, version: str) -> None:
    d = doctor(tmp_path, WSL2 + f'packages: {{bitsandbytes: "{version}"}}\n')
    [f] = d.of("libcuda-unreachable", "bitsandbytes")
    assert f["severity"] == "warning" and "/usr/lib/wsl/lib" in f["message"]
    assert f"`{EXPORT}`" in f["fix"] and "'bitsandbytes>=0.40.1'" in f["fix"]
    assert EXPORT in d.text  # a command line of its own


def test_an_unknown_release_names_the_releases_it_applies_to(tmp_path: Path) -> None:
    # the release is unknown: what releases before 0.40.1 do is said, never assumed
    d = doctor(tmp_path, WSL2 + "packages: {bitsandbytes: null}\n")
    assert not d.of("libcuda-unreachable", "bitsandbytes")
    [f] = d.of("not-judged", "bitsandbytes")
    assert "releases before 0.40.1" in f["message"] and "not judged" in f["message"]


@pytest.mark.parametrize("snapshot", [
    WSL2 + 'packages: {bitsandbytes: "0.40.1"}\n',  # finds CUDA through torch
    'os: "Ubuntu 22.04"\npackages: {bitsandbytes: "0.35.0"}\n',  # not WSL
    WSL2 + 'driver: {present: false}\npackages: {bitsandbytes: "0.35.0"}\n',  # no-driver
])
def test_no_warning_where_it_does_not_apply(tmp_path: Path, snapshot: str) -> None:
    assert not doctor(tmp_path, snapshot).of("libcuda-unreachable")


def test_wsl1_is_judged_by_its_own_rule(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'os: "Windows; WSL 1"\npackages: {bitsandbytes: "0.35.0"}\n')
    assert d.of("no-driver", "driver") and not d.of("libcuda-unreachable")
