"""The toolkit's stub libcuda found before the driver's: CUDA cannot start (error 34)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _doctor_helpers import doctor

from dnnctl.doctor.rules_stub import stub_dir

STUB = "/scratch/u/opt/cuda-12.1/lib64/stubs/libcuda.so"


def test_stub_on_the_search_path_is_an_error_with_the_path_fix(tmp_path: Path) -> None:
    d = doctor(tmp_path, f"os: Linux\ndriver: {{present: true, libcuda: {STUB}}}\n"
               "cuda_runtimes: [{version: '12.1', source: 'system:/scratch/u/opt/cuda-12.1'}]\n"
               "packages: {numba: null}\n")
    [f] = d.of("libcuda-stub", "driver")
    assert f["severity"] == "error" and d.data["verdict"] == "fail"
    assert "CUDA_ERROR_STUB_LIBRARY (34)" in f["message"] and STUB in f["message"]
    assert "/scratch/u/opt/cuda-12.1/lib64/stubs off the library search path" in f["fix"]
    assert "LD_LIBRARY_PATH" in f["fix"] and "ld.so.conf.d" in f["fix"]
    assert "numba/numba#8985" in f["source"] and "group__CUDA__TYPES" in f["source"]
    assert "[V; compat/libraries.yaml" in f["source"]
    assert not d.of("no-gpu")


@pytest.mark.parametrize("path, stub", [
    (STUB, True),
    ("/usr/local/cuda-11.8/targets/x86_64-linux/lib/stubs/libcuda.so", True),
    ("/opt/conda/envs/x/lib/stubs/libcuda.so.1", True),
    ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", False),
    ("/usr/lib/wsl/lib/libcuda.so.1", False),
    ("/opt/stubs/lib/libcuda.so.1", False),          # a stubs folder higher up is not one
    ("/usr/local/cuda/lib64/stubs/libnvidia-ml.so", False),
])
def test_only_a_libcuda_inside_a_stubs_directory_is_the_stub(tmp_path: Path, path: str,
                                                              stub: bool) -> None:
    d = doctor(tmp_path, f"os: Linux\ndriver: {{version: '550.54.15', libcuda: '{path}'}}\n")
    found = d.of("libcuda-stub")
    assert bool(found) == stub
    if stub:
        assert stub_dir(path) in found[0]["fix"] and "libraries.yaml" in found[0]["source"]


def test_the_driver_s_own_libcuda_is_not_flagged(tmp_path: Path) -> None:
    d = doctor(tmp_path, "os: Linux\ndriver: {version: '550.54.15', "
               "libcuda: /usr/lib/x86_64-linux-gnu/libcuda.so.1}\n"
               "gpus: [{name: NVIDIA L4}]\n")
    assert not d.of("libcuda-stub") and d.data["verdict"] == "pass"


def test_no_driver_is_the_cause_where_there_is_none(tmp_path: Path) -> None:
    d = doctor(tmp_path, f"os: Linux\ndriver: {{present: false, libcuda: {STUB}}}\n")
    assert d.of("no-driver") and not d.of("libcuda-stub")
