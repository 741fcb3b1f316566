"""bitsandbytes: a native library for torch's CUDA (compat/addons.yaml bitsandbytes_cuda, from
each release's build matrix) and, before 0.40.1, its own search for libcudart."""

from __future__ import annotations

from pathlib import Path

import pytest

from dnnctl.compat.matrix import load_matrix
from dnnctl.compat.versions import Version, VersionRange
from tests.unit._doctor_helpers import doctor

# lllyasviel/stable-diffusion-webui-forge#2712: a cu128 torch on an RTX 50 GPU with a pinned
# bitsandbytes before 0.45.3 -> "Could not find the bitsandbytes CUDA binary at
# ...libbitsandbytes_cuda128.dll"; 0.45.3 fixes it
BLACKWELL = """
os: Windows
gpus: [{name: NVIDIA GeForce RTX 5090, compute_capability: "12.0"}]
frameworks:
  torch: {version: "%s"}
packages: {bitsandbytes: %s}
"""


def test_a_release_without_the_cuda128_library_is_an_error(tmp_path: Path) -> None:
    d = doctor(tmp_path, BLACKWELL % ("2.7.0+cu128", '"0.45.2"'))
    [f] = d.of("cuda-mismatch", "bitsandbytes")
    assert f["severity"] == "error" and d.data["verdict"] == "fail"
    assert "libbitsandbytes_cuda128" in f["message"] and "12.6" in f["message"]
    assert "compiled without GPU support" in f["message"]
    assert f["fix"] == "`pip install -U 'bitsandbytes>=0.45.3'`"
    assert "python-package.yml" in f["source"]


@pytest.mark.parametrize("bnb", ['"0.45.3"', '"0.46.0"', '"0.49.2"', '"0.50.1"'])
def test_releases_with_the_cuda128_library_pass(tmp_path: Path, bnb: str) -> None:
    d = doctor(tmp_path, BLACKWELL % ("2.7.0+cu128", bnb))
    assert "bitsandbytes" not in {f["component"] for f in d.findings if f["severity"] != "info"}


def test_version_unknown_names_the_floor(tmp_path: Path) -> None:
    d = doctor(tmp_path, BLACKWELL % ("2.7.0+cu128", "null"))
    [f] = d.of("cuda-mismatch", "bitsandbytes")
    assert f["severity"] == "warning" and "releases before 0.45.3" in f["message"]
    assert "0.45.3" in f["fix"]


def test_version_unknown_with_a_cuda_every_release_has_is_silent(tmp_path: Path) -> None:
    d = doctor(tmp_path, BLACKWELL.replace("RTX 5090", "RTX 3090").replace('"12.0"', '"8.6"')
               % ("2.1.2+cu121", "null"))
    assert not d.of("cuda-mismatch", "bitsandbytes")


def test_a_release_before_the_table_lacks_a_newer_cuda(tmp_path: Path) -> None:
    # 0.39.0 had no CUDA 12.4 library, so neither had 0.38.x
    d = doctor(tmp_path, BLACKWELL.replace("RTX 5090", "RTX 4090").replace('"12.0"', '"8.9"')
               % ("2.4.0+cu124", '"0.38.1"'))
    [f] = d.of("cuda-mismatch", "bitsandbytes")
    assert "predates 0.39.0" in f["message"] and "0.43.1" in f["fix"]


def test_041_carries_its_deploy_sh_libraries(tmp_path: Path) -> None:
    ada = BLACKWELL.replace("RTX 5090", "RTX 4090").replace('"12.0"', '"8.9"')
    [f] = doctor(tmp_path, ada % ("2.4.0+cu124", '"0.41.1"')).of("cuda-mismatch", "bitsandbytes")
    assert "12.2" in f["message"] and "0.43.1" in f["fix"]
    d = doctor(tmp_path, ada % ("2.0.1+cu118", '"0.41.1"'))
    assert not d.of("cuda-mismatch") and d.of("ok", "bitsandbytes")


def test_a_listed_bitsandbytes_is_never_silent(tmp_path: Path) -> None:
    d = doctor(tmp_path, BLACKWELL % ("2.7.0+cpu", '"0.44.0"'))
    [f] = d.of("not-judged", "bitsandbytes")
    assert "no CUDA is known" in f["message"]


def test_cuda_117_dropped_in_046_and_back_through_the_050_fallback(tmp_path: Path) -> None:
    ampere = BLACKWELL.replace("RTX 5090", "RTX 3090").replace('"12.0"', '"8.6"')
    d = doctor(tmp_path, ampere % ("2.0.1+cu117", '"0.46.0"'))
    [f] = d.of("cuda-mismatch", "bitsandbytes")
    assert "0.50.0" in f["fix"]
    assert not doctor(tmp_path, ampere % ("2.0.1+cu117", '"0.50.0"')).of("cuda-mismatch")


def test_a_cpu_torch_is_left_to_the_cpu_rules(tmp_path: Path) -> None:
    d = doctor(tmp_path, BLACKWELL % ("2.7.0+cpu", '"0.44.0"'))
    assert not d.of("cuda-mismatch", "bitsandbytes")


def test_rows_cover_each_release_once() -> None:
    rows = load_matrix().rows("bitsandbytes_cuda")
    for v in ("0.43.0", "0.44.1", "0.45.3", "0.47.0", "0.49.2", "0.50.1"):
        hits = [r for r in rows if VersionRange.parse(r["bitsandbytes"]).contains(Version.parse(v))]
        assert len(hits) == 1, v
    assert [r for r in rows if "12.8" in r["cuda"]][0]["bitsandbytes"].startswith(">=0.45.3")


# Thund3rPat/kohya_ss-linux#8: bitsandbytes of Feb 2023 in a conda env whose only CUDA runtime
# is pip's nvidia-cuda-runtime-cu11 (libcudart.so.11.0, not on LD_LIBRARY_PATH)
PIP_CUDART = """
os: Linux
cuda_runtimes:
  - {source: "pip:nvidia-cuda-runtime-cu11", path: "/e/site-packages/nvidia/cuda_runtime/lib/libcudart.so.11.0"%s}
packages: {bitsandbytes: %s}
"""


def test_old_release_with_only_pips_versioned_runtime(tmp_path: Path) -> None:
    d = doctor(tmp_path, PIP_CUDART % ("", '"0.37.0"'))
    [f] = d.of("libcudart-unreachable", "bitsandbytes")
    assert f["severity"] == "warning"
    lib = "/e/site-packages/nvidia/cuda_runtime/lib"
    assert "by the name libcudart.so" in f["message"] and lib in f["message"]
    assert "`pip install -U 'bitsandbytes>=0.40.1'`" in f["fix"]
    assert f"ln -s libcudart.so.11.0 {lib}/libcudart.so" in f["fix"]
    assert f"export LD_LIBRARY_PATH={lib}:$LD_LIBRARY_PATH" in f["fix"]


def test_038_accepts_the_versioned_name_on_the_path(tmp_path: Path) -> None:
    d = doctor(tmp_path, PIP_CUDART % ("", '"0.38.1"'))
    [f] = d.of("libcudart-unreachable")
    assert "ln -s" not in f["fix"] and "LD_LIBRARY_PATH" in f["fix"]


TOOLKIT_TOO = """
  - {version: "11.8", source: "system:/usr/local/cuda-11.8"}
"""


@pytest.mark.parametrize("extra,bnb", [("", '"0.41.1"'),  # finds the runtime through torch
                                       (TOOLKIT_TOO, "null")])  # a toolkit's copy is there
def test_no_warning_when_it_finds_a_runtime(tmp_path: Path, extra: str, bnb: str) -> None:
    text = PIP_CUDART % ("", bnb)
    text = text.replace("\npackages:", extra.rstrip("\n") + "\npackages:") if extra else text
    d = doctor(tmp_path, text)
    assert not d.of("libcudart-unreachable")
    if extra:
        assert len(d.data["env"]["cuda_runtimes"]) == 2
