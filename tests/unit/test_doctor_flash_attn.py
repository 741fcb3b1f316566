"""flash-attn's wheel is built per torch minor, CUDA major and C++ ABI (its name:
cu12torch2.4cxx11abiFALSE); against another torch its extension fails to import with an
undefined symbol. Judged where the snapshot carries the build."""

from __future__ import annotations

from pathlib import Path

from dnnctl.doctor.deep import run_deep
from dnnctl.doctor.envfile import parse_env
from dnnctl.doctor.host import Host
from dnnctl.doctor.model import EnvSnapshot
from tests.unit._doctor_helpers import doctor, probe_fakes

SNAP = """
os: Linux
driver: {version: "570.124.06"}
gpus: [{name: NVIDIA A100-SXM4-80GB}]
%s
"""


def test_a_wheel_for_another_torch_minor(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % 'packages: {torch: "2.5.1", flash-attn: '
                                '"2.6.3+cu123torch2.4cxx11abiFALSE"}')
    [f] = d.of("build-mismatch", "flash-attn")
    assert f["severity"] == "error" and "built for torch 2.4" in f["message"]
    assert "torch 2.5.1 is installed" in f["message"] and "undefined symbol" in f["message"]
    assert "cu12torch2.5cxx11abiFALSE" in f["fix"]
    assert "--no-build-isolation" in f["fix"] and "flash-attn==2.6.3" in f["fix"]
    assert "--no-deps" in f["fix"] and "--no-cache-dir" in f["fix"]  # keep torch, no old build


def test_the_cxx11_abi_of_torch_27_wheels(tmp_path: Path) -> None:
    # torch 2.7 wheels are C++11-ABI builds: a cxx11abiFALSE flash-attn fails on them
    d = doctor(tmp_path, SNAP % 'packages: {torch: "2.7.0", flash-attn: '
                                '"2.7.4.post1+cu12torch2.7cxx11abiFALSE"}')
    [f] = d.of("build-mismatch", "flash-attn")
    assert "pre-C++11 ABI (cxx11abiFALSE)" in f["message"]
    assert "_ZN3c105ErrorC2ENS_14SourceLocationESs" in f["message"]
    assert "cxx11abiTRUE" in f["fix"]
    # 2.6: only the cu126 wheels switched; PyPI's 2.6 (cu124) is pre-C++11
    ok = doctor(tmp_path, SNAP % 'packages: {torch: "2.6.0", flash-attn: '
                                 '"2.7.4.post1+cu12torch2.6cxx11abiFALSE"}')
    assert not ok.of("build-mismatch") and ok.of("ok", "flash-attn")
    bad = doctor(tmp_path, SNAP % 'packages: {torch: "2.6.0+cu126", flash-attn: '
                                  '"2.7.4.post1+cu12torch2.6cxx11abiFALSE"}')
    assert bad.of("build-mismatch", "flash-attn")


def test_the_cuda_major_from_a_wheel_file_name(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % (
        'frameworks:\n  torch: {version: "2.4.0+cu121"}\n  flash-attn: {version: "2.6.3", '
        'wheel: "flash_attn-2.6.3+cu118torch2.4cxx11abiFALSE-cp310-cp310-linux_x86_64.whl"}'))
    [f] = d.of("build-mismatch", "flash-attn")
    assert "built for CUDA 11" in f["message"] and "CUDA 12.1" in f["message"]


def test_explicit_fields_and_a_matching_build(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % (
        'frameworks:\n  torch: {version: "2.3.1+cu121", cxx11_abi: true}\n'
        '  flash-attn: {version: "2.5.9", torch: "2.3", cuda: "12", cxx11_abi: false}'))
    [f] = d.of("build-mismatch", "flash-attn")  # torch's own report wins over its wheel's
    assert "C++11 one" in f["message"]
    d = doctor(tmp_path, SNAP % 'packages: {torch: "2.4.1", flash-attn: '
                                '"2.6.3+cu123torch2.4cxx11abiFALSE"}')
    assert d.codes("flash-attn") == set()
    [ok] = d.of("ok", "flash-attn")
    assert "built for torch 2.4, CUDA 12, cxx11abiFALSE" in ok["message"]


def test_a_patch_release_apart_is_a_warning(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % (
        'frameworks:\n  torch: {version: "2.2.0+cu121"}\n'
        '  flash-attn: {version: "2.5.8", torch: "2.2.2", cuda: "12.2"}'))
    [f] = d.of("build-mismatch", "flash-attn")
    assert f["severity"] == "warning" and "patch release" in f["message"]


def test_without_the_build_it_is_not_judged(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % 'packages: {torch: "2.4.1", flash-attn: "2.6.3"}')
    [f] = d.of("not-judged", "flash-attn")
    assert "which torch it was built against is not known" in f["message"]
    assert "cu12torch2.4cxx11abiFALSE" in f["fix"]


def test_the_snapshot_fields_load() -> None:
    env = parse_env("schema: dnnctl-env/1\nframeworks:\n  flash-attn: {version: 2.6.3, "
                    "wheel: cu12torch2.4cxx11abiFALSE, torch: '2.4', cxx11_abi: false}\n"
                    "  torch: {version: 2.4.1, cxx11_abi: false}\n")
    assert env.frameworks["flash-attn"]["cxx11_abi"] is False
    assert env.frameworks["torch"]["cxx11_abi"] is False


def test_deep_reads_torchs_abi() -> None:
    env = EnvSnapshot(frameworks={"torch": {"version": "2.7.0+cu128"}})
    out = 'DNNCTL_JSON {"version": "2.7.0+cu128", "cuda": "12.8", "cxx11_abi": false}\n'
    runner = probe_fakes().FakeRunner(deep={"torch": out})
    run_deep(Host(runner=runner, python="python3"), env)
    assert env.frameworks["torch"]["cxx11_abi"] is False
