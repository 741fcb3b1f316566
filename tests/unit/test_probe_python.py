"""Frameworks and packages from real *.dist-info folders, never importing the frameworks."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from dnnctl.doctor.host import Host
from dnnctl.doctor.probe_python import jaxlib_tag, probe_python, relevant


def _load_fakes():
    path = Path(__file__).resolve().parents[1] / "data" / "probes" / "fakes.py"
    if "dnnctl_probe_fakes" not in sys.modules:
        spec = importlib.util.spec_from_file_location("dnnctl_probe_fakes", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    return sys.modules["dnnctl_probe_fakes"]


fakes = _load_fakes()


def probe(*sites: Path):
    return probe_python(Host(site_paths=[str(s) for s in sites]))


def test_h200_site_packages(tmp_path):
    fakes.h200_site(tmp_path)
    frameworks, packages, dists, notes = probe(tmp_path)
    torch = frameworks["torch"]
    assert torch == {"version": "2.11.0+cu130", "source": "metadata",
                     "path": str(tmp_path / "torch"), "installer": "pip", "local_tag": "cu130",
                     "cuda": "13.0", "cudnn": "9.19.0.56", "cudnn_package": "nvidia-cudnn-cu13"}
    assert packages["torch"] == "2.11.0"  # what pip's metadata says (no local tag there)
    assert frameworks["cupy"] == {"version": "14.2.0", "package": "cupy-cuda13x",
                                  "packages": ["cupy-cuda13x"], "source": "metadata",
                                  "cuda": "13"}
    assert frameworks["jax"] == {"source": "metadata", "version": "0.11.2", "jaxlib": "0.11.2",
                                 "plugin": "jax-cuda13-plugin", "plugin_version": "0.11.2",
                                 "cuda": "13"}
    assert "tensorflow" not in frameworks
    assert packages["nvidia-cudnn-cu13"] == "9.19.0.56"
    assert packages["nvidia-cuda-runtime"] == "13.0.96"
    assert packages["cuda-toolkit"] == "13.0.2" and packages["triton"] == "3.6.0"
    for unrelated in ("botorch", "gpytorch", "jaxtyping", "torch-geometric", "torchmetrics"):
        assert unrelated not in packages
    assert notes == []


def test_torch_with_tag_in_metadata_and_cpu_build(tmp_path):
    fakes.make_dist(tmp_path / "a", "torch", "2.2.0+cu121", {
        "torch/version.py": fakes.canned("torch-version-2.2.0-cu121.py.txt")})
    fakes.make_dist(tmp_path / "b", "torch", "2.5.1+cpu", {
        "torch/version.py": fakes.canned("torch-version-2.5.1-cpu.py.txt")})
    a = probe(tmp_path / "a")[0]["torch"]
    assert (a["version"], a["local_tag"], a["cuda"]) == ("2.2.0+cu121", "cu121", "12.1")
    b = probe(tmp_path / "b")[0]["torch"]
    assert b["cuda_build"] is False and "cuda" not in b and b["local_tag"] == "cpu"


def test_hostile_or_missing_version_py(tmp_path):
    fakes.make_dist(tmp_path / "a", "torch", "2.3.1", {
        "torch/version.py": fakes.canned("torch-version-hostile.py.txt")})
    a = probe(tmp_path / "a")[0]["torch"]
    assert a["version"] == "2.3.1" and "cuda" not in a and "local_tag" not in a
    fakes.make_dist(tmp_path / "b", "torch", "2.3.1+cu118", {})
    b = probe(tmp_path / "b")[0]["torch"]
    assert b["cuda"] == "11.8"  # from the local tag when version.py is missing


def test_tensorflow_builds(tmp_path):
    fakes.make_dist(tmp_path / "a", "tensorflow", "2.15.1", {
        "tensorflow/python/platform/build_info.py": fakes.canned("tf-build-info-2.15.py.txt")})
    a = probe(tmp_path / "a")[0]["tensorflow"]
    assert (a["version"], a["cuda"], a["cudnn"]) == ("2.15.1", "12.2", "8")
    assert a["arch_list"] == ["sm_50", "sm_60", "sm_70", "sm_80", "compute_90"]
    fakes.make_dist(tmp_path / "b", "tensorflow-gpu", "2.10.0", {
        "tensorflow/python/platform/build_info.py":
            fakes.canned("tf-build-info-win-2.10.py.txt")})
    fakes.make_dist(tmp_path / "b", "tensorflow", "2.10.0", {})
    b = probe(tmp_path / "b")[0]["tensorflow"]
    assert b["packages"] == ["tensorflow", "tensorflow-gpu"]
    fakes.make_dist(tmp_path / "c", "tensorflow-cpu", "2.16.1", {
        "tensorflow/python/platform/build_info.py": fakes.canned("tf-build-info-cpu.py.txt")})
    c = probe(tmp_path / "c")[0]["tensorflow"]
    assert c["cuda_build"] is False and "cuda" not in c


def test_two_cupy_wheels_are_both_reported(tmp_path):
    old = fakes.make_dist(tmp_path, "cupy-cuda11x", "12.3.0", {"cupy/__init__.py": None})
    new = fakes.make_dist(tmp_path, "cupy-cuda12x", "13.3.0", {
        "cupy/.data/_wheel.json": '{"cuda": "12.x", "packaging": "pip"}'})
    os.utime(old, (1_700_000_000, 1_700_000_000))
    os.utime(new, (1_800_000_000, 1_800_000_000))
    cupy = probe(tmp_path)[0]["cupy"]
    assert cupy["packages"] == ["cupy-cuda11x", "cupy-cuda12x"]
    assert (cupy["package"], cupy["version"], cupy["cuda"]) == ("cupy-cuda12x", "13.3.0", "12")


def test_old_cupy_and_old_jaxlib_names(tmp_path):
    fakes.make_dist(tmp_path, "cupy-cuda110", "9.6.0", {})
    fakes.make_dist(tmp_path, "jaxlib", "0.4.23+cuda12.cudnn89", {})
    frameworks = probe(tmp_path)[0]
    assert frameworks["cupy"]["cuda"] == "11.0"
    assert frameworks["jax"] == {"source": "metadata", "jaxlib": "0.4.23+cuda12.cudnn89",
                                 "cuda": "12", "cudnn": "8.9"}


def test_first_install_on_the_path_wins(tmp_path):
    fakes.make_dist(tmp_path / "user", "torch", "2.1.0", {})
    fakes.make_dist(tmp_path / "venv", "torch", "2.4.1", {})
    frameworks, packages, _, notes = probe(tmp_path / "user", tmp_path / "venv", tmp_path / "user")
    assert packages["torch"] == "2.1.0"
    assert len(notes) == 1 and "torch is installed twice: 2.1.0" in notes[0]


def test_broken_metadata_is_skipped(tmp_path):
    info = tmp_path / "torch-9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("garbage without headers")
    assert probe(tmp_path, tmp_path / "missing")[0] == {}


def test_relevant_filter():
    assert relevant("nvidia-cudnn-cu12") and relevant("jax-cuda12-pjrt")
    assert relevant("cupy-cuda13x") and relevant("tensorflow-cpu")
    assert not relevant("torchmetrics") and not relevant("tensorflow-estimator")


def test_jaxlib_tags_name_the_build():
    # jaxlib wheel tags (jax_cuda_releases.html): +cuda112 is CUDA 11.2; +cuda11 only the
    # major; cudnn86 / cudnn805 the cuDNN the build was compiled with (8.6, 8.0.5)
    assert jaxlib_tag("0.1.65+cuda112") == ("11.2", None)
    assert jaxlib_tag("0.1.52+cuda92") == ("9.2", None)
    assert jaxlib_tag("0.4.13+cuda11.cudnn86") == ("11", "8.6")
    assert jaxlib_tag("0.3.10+cuda11.cudnn805") == ("11", "8.0.5")
    assert jaxlib_tag("0.4.30") == (None, None)
