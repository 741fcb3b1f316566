"""Compiled torch CUDA extensions found in site-packages without importing them: the archs
read from their ELF's .nv_fatbin section, and whether pip built them here."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from dnnctl.compat.matrix import load_matrix
from dnnctl.doctor import fatbin
from dnnctl.doctor.detect import detect
from dnnctl.doctor.distinfo import Dist
from dnnctl.doctor.envfile import load_env, save_env
from dnnctl.doctor.fatbin import read_library
from dnnctl.doctor.host import Host
from dnnctl.doctor.probe_extensions import built_from_source, probe_extensions
from dnnctl.doctor.rules import judge
from tests.unit._doctor_helpers import doctor, probe_fakes
from tests.unit._fatbin_helpers import (
    CUBIN,
    PTX,
    ZSTD,
    container,
    elf,
    entry,
    standard_fatbin,
    write,
)

fakes = probe_fakes()
SO = "cpython-311-x86_64-linux-gnu.so"
ARCHS = ["sm_70", "sm_80", "compute_80"]


def install(site: Path, name: str, version: str, libs: dict[str, bytes], *,
            direct_url: dict | None = None, wheel_tag: str | None = None) -> Path:
    """A dist-info folder (METADATA, RECORD listing ``libs``, direct_url.json, WHEEL)."""
    info = fakes.make_dist(site, name, version, {rel: None for rel in libs})
    for rel, data in libs.items():
        write(site / rel, data)
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))
    if wheel_tag:
        (info / "WHEEL").write_text(f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\n"
                                    f"Tag: {wheel_tag}\n")
    return info


def probe(site: Path, **kw) -> tuple[dict, list[str]]:
    return probe_extensions(Host(site_paths=[str(site)], **kw))


def test_fatbin_header_gives_cubins_and_ptx(tmp_path):
    lib = read_library(write(tmp_path / "a.so", elf(fatbin=standard_fatbin())))
    assert lib.targets == ("sm_70", "sm_80", "compute_80") and lib.error is None
    assert "libc10_cuda.so" in lib.needed
    # sm_100+ entries carry longer headers (their own size field says); zstd payloads
    big = container(entry(CUBIN, 100, b"x" * 13, flags=ZSTD, header=112),
                    entry(PTX, 120, b"ptx", header=80))
    assert read_library(write(tmp_path / "b.so", elf(fatbin=big))).targets == \
        ("sm_100", "compute_120")
    # the brief's spelling of the section name is read too
    assert read_library(write(tmp_path / "c.so", elf(fatbin=standard_fatbin(),
                                                     section=".nv.fatbin"))).targets


NVCC_CASES = [  # nvcc flags -> the targets its fatbin holds
    (["-gencode", "arch=compute_80,code=sm_80",
      "-gencode", "arch=compute_90,code=[sm_90,compute_90]"], ("sm_80", "sm_90", "compute_90")),
    (["-arch=sm_86"], ("sm_86", "compute_86")),
    (["-gencode", "arch=compute_75,code=compute_75"], ("compute_75",)),
    (["-gencode", "arch=compute_80,code=sm_80", "-Xfatbin=-compress-all"], ("sm_80",)),
]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs CUDA's nvcc")
@pytest.mark.parametrize("flags,targets", NVCC_CASES)
def test_a_real_nvcc_built_library_reads_as_built(tmp_path, flags, targets):
    """The reader against nvcc's own output (checked with nvcc 13.0, compressed too)."""
    src = tmp_path / "k.cu"
    src.write_text("__global__ void k(float *x) { x[threadIdx.x] *= 2; }\n"
                   "extern \"C\" void run(float *x) { k<<<1, 32>>>(x); }\n")
    out = tmp_path / "libk.so"
    done = subprocess.run(["nvcc", "-shared", "-Xcompiler", "-fPIC", *flags, str(src),
                           "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lib = read_library(out)
    assert lib.has_fatbin and lib.error is None
    assert lib.targets == targets


def test_source_built_detectron2_in_a_site_folder(tmp_path):
    site = tmp_path / "site"
    install(site, "detectron2", "0.6", {f"detectron2/_C.{SO}": elf(fatbin=standard_fatbin()),
                                        f"detectron2/_helper.{SO}": elf(("libc.so.6",))},
            direct_url={"url": "file:///src/detectron2", "dir_info": {}})
    exts, notes = probe(site)
    assert exts == {"detectron2": {"version": "0.6", "arch_list": ARCHS,
                                   "built_from_source": True,
                                   "path": str(site / f"detectron2/_C.{SO}")}}
    assert notes == []


def test_editable_and_develop_installs_are_found_in_their_source(tmp_path):
    src = tmp_path / "checkout"
    write(src / "detectron2" / f"_C.{SO}", elf(fatbin=standard_fatbin()))
    write(src / "build" / "temp" / f"_C.{SO}", b"not looked at")
    site = tmp_path / "site"
    install(site, "detectron2", "0.6", {}, direct_url={
        "url": src.as_uri(), "dir_info": {"editable": True}})
    exts, _ = probe(site)
    assert exts["detectron2"]["path"] == str(src / "detectron2" / f"_C.{SO}")
    assert exts["detectron2"]["arch_list"] == ARCHS
    # apex by `setup.py install`: an .egg-info, its extensions top-level modules
    egg = tmp_path / "egg"
    (egg / "apex-0.1-py3.11.egg-info").mkdir(parents=True)
    (egg / "apex-0.1-py3.11.egg-info" / "PKG-INFO").write_text("Name: apex\nVersion: 0.1\n")
    (egg / "apex-0.1-py3.11.egg-info" / "top_level.txt").write_text("amp_C\napex\n")
    write(egg / f"amp_C.{SO}", elf(fatbin=standard_fatbin()))
    exts, _ = probe(egg)
    assert exts["apex"] == {"version": "0.1", "arch_list": ARCHS, "built_from_source": True,
                            "path": str(egg / f"amp_C.{SO}")}


def test_every_library_must_carry_an_arch(tmp_path):
    site = tmp_path / "site"
    install(site, "mmcv-full", "1.7.2", {f"mmcv/_ext.{SO}": elf(fatbin=standard_fatbin()),
                                         f"mmcv/_ops.{SO}": elf(fatbin=container(
                                             entry(CUBIN, 80), entry(PTX, 80)))})
    # the first library alone would say sm_70 too: a V100 would miss the second's kernels
    assert probe(site)[0]["mmcv-full"]["arch_list"] == ["sm_80", "compute_80"]


@pytest.mark.parametrize("data, why", [
    (elf(fatbin=standard_fatbin()[:-40]), "truncated container"),
    (elf(fatbin=b"\x01\x02\x03\x04" * 8), "not a fatbin"),
    (elf(fatbin=container(entry(CUBIN, 80, header=16))), "entry header too short"),
    (elf(), "links torch's CUDA libraries but has no .nv_fatbin"),
])
def test_unreadable_gpu_code_is_an_unknown_arch_list(tmp_path, data, why):
    site = tmp_path / "site"
    install(site, "torch-scatter", "2.1.2", {f"torch_scatter/_scatter_cuda.{SO}": data},
            wheel_tag="cp311-cp311-linux_x86_64")
    exts, notes = probe(site)
    assert exts == {"torch-scatter": {"version": "2.1.2", "built_from_source": True,
                                      "path": str(site / f"torch_scatter/_scatter_cuda.{SO}")}
                    }, why
    assert notes == []


def test_huge_or_broken_files_never_crash(tmp_path, monkeypatch):
    path = write(tmp_path / "big.so", elf(fatbin=standard_fatbin()))
    huge = read_library(path, max_size=100)
    assert huge.targets is None and "not read" in huge.error and huge.needed
    for junk in (b"", b"\x7fELF", b"\x7fELF\x02\x01" + b"\xff" * 200, b"MZ" + b"\0" * 100,
                 elf()[:70], elf(fatbin=standard_fatbin())[:-100]):
        lib = read_library(write(tmp_path / "junk.so", junk))
        assert lib.targets is None and lib.error
    assert read_library(tmp_path / "missing.so").error.startswith("unreadable")
    # a huge library of a package: listed, its arch list unknown
    monkeypatch.setattr(fatbin, "MAX_LIBRARY", 100)
    site = tmp_path / "site"
    install(site, "flash-attn", "2.7.4", {f"flash_attn_2_cuda.{SO}": path.read_bytes()},
            wheel_tag="cp311-cp311-linux_x86_64")
    assert probe(site)[0]["flash-attn"] == {"version": "2.7.4", "built_from_source": True,
                                            "path": str(site / f"flash_attn_2_cuda.{SO}")}


def test_what_is_not_a_torch_cuda_extension(tmp_path):
    site = tmp_path / "site"
    # GPU code without torch (a CUDA library of its own), a CPU-only torch extension, torch
    # itself, and a torchvision wheel from PyPI (judged with torch)
    install(site, "llama-cpp-python", "0.3.9", {
        f"llama_cpp/lib/libggml-cuda.{SO}": elf(("libcudart.so.12",), standard_fatbin())})
    install(site, "torch-cpu-ext", "1.0", {f"cpu_ext/_C.{SO}": elf(("libc10.so", "libtorch.so"))})
    install(site, "torch", "2.5.1", {f"torch/lib/libtorch_cuda.{SO}": elf(
        ("libc10_cuda.so",), standard_fatbin())})
    wheel = {f"torchvision/_C.{SO}": elf(fatbin=standard_fatbin())}
    install(site, "torchvision", "0.20.1", wheel, wheel_tag="cp311-cp311-manylinux1_x86_64")
    assert probe(site) == ({}, [])
    # a torchvision built from its source release is listed
    other = tmp_path / "other"
    install(other, "torchvision", "0.20.1", wheel, wheel_tag="cp311-cp311-linux_aarch64")
    assert probe(other)[0]["torchvision"]["built_from_source"] is True


@pytest.mark.parametrize("version, direct_url, tag, installer, expected", [
    ("0.6", {"url": "git+https://github.com/x/y", "vcs_info": {"vcs": "git"}}, None, "pip",
     True),
    ("0.6", {"url": "https://x/detectron2-0.6.tar.gz", "archive_info": {}}, None, "pip", True),
    ("0.6", {"url": "https://x/detectron2-0.6%2Bcu113-cp38-cp38-linux_x86_64.whl",
             "archive_info": {}}, None, "pip", False),
    ("2.1.2", None, "cp311-cp311-manylinux_2_28_x86_64", "pip", False),
    ("2.1.2", None, "cp311-cp311-linux_x86_64", "pip", True),  # pip built the sdist
    ("2.1.2+pt21cu121", None, "cp311-cp311-linux_x86_64", "pip", False),  # PyG's index
    ("2.1.2", None, "cp311-cp311-win_amd64", "pip", None),
    ("2.1.2", None, "cp311-cp311-linux_x86_64", "conda", False),
    ("2.1.2", None, None, "pip", None),
])
def test_built_from_source_heuristic(tmp_path, version, direct_url, tag, installer, expected):
    info = install(tmp_path, "torch-scatter", version, {}, direct_url=direct_url,
                   wheel_tag=tag)
    (info / "INSTALLER").write_text(installer + "\n")
    assert built_from_source(Dist("torch-scatter", version, tmp_path, info)) is expected


def test_doctor_deadline_stops_the_search_with_a_note(tmp_path):
    site = tmp_path / "site"
    install(site, "detectron2", "0.6", {f"detectron2/_C.{SO}": elf(fatbin=standard_fatbin())})
    exts, notes = probe(site, deadline=time.monotonic() - 1)
    assert exts == {} and notes[0].startswith("probe failed: compiled torch extensions")


def _p100_host(tmp_path: Path, site: Path) -> Host:
    nvml = fakes.FakeNvml("535.183.01", 12020, [{"name": "Tesla P100-PCIE-16GB", "cc": (6, 0),
                                                 "memory": 16 << 30}])
    return fakes.make_host(tmp_path, site=site, nvml=lambda: nvml)


def test_live_detection_feeds_the_arch_rule(tmp_path):
    """detectron2 built for a V100 / A100 (sm_70, sm_80, compute_80), on a P100 (sm_60)."""
    site = tmp_path / "site"
    install(site, "detectron2", "0.6", {f"detectron2/_C.{SO}": elf(fatbin=standard_fatbin())},
            direct_url={"url": "file:///src/detectron2", "dir_info": {}})
    env = detect(host=_p100_host(tmp_path, site))
    assert [g.compute_capability for g in env.gpus] == ["6.0"]
    assert env.extensions["detectron2"]["arch_list"] == ARCHS
    found = [f for f in judge(env, load_matrix()) if f.component == "detectron2"]
    assert [(f.code, f.severity) for f in found] == [("arch-unsupported", "error")]
    assert "sm_60" in found[0].message and 'TORCH_CUDA_ARCH_LIST="6.0"' in found[0].fix
    # the saved snapshot says the same through `doctor --from`
    save_env(env, tmp_path / "env.yaml")
    assert load_env(tmp_path / "env.yaml").extensions == env.extensions
    text = (tmp_path / "env.yaml").read_text()
    d = doctor(tmp_path, text[text.index("schema:"):])  # after the comment line
    assert d.of("arch-unsupported", "detectron2")


def test_live_detection_on_a_covered_gpu_is_ok(tmp_path):
    site = tmp_path / "site"
    install(site, "detectron2", "0.6", {f"detectron2/_C.{SO}": elf(fatbin=standard_fatbin())})
    nvml = fakes.FakeNvml("535.183.01", 12020, [{"name": "NVIDIA A100-SXM4-80GB",
                                                 "cc": (8, 0), "memory": 80 << 30}])
    env = detect(host=fakes.make_host(tmp_path, site=site, nvml=lambda: nvml))
    found = [f for f in judge(env, load_matrix()) if f.component == "detectron2"]
    assert [(f.code, f.severity) for f in found] == [("ok", "info")]
