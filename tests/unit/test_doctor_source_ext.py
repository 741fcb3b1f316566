"""A source-built torch CUDA extension has code only for the architectures it was compiled for
(detectron2#233: built on a K80, run on a P100): judged from extensions.<name>.arch_list; with
the list unknown, a source-built package is not-judged naming TORCH_CUDA_ARCH_LIST."""

from __future__ import annotations

from pathlib import Path

import pytest

from dnnctl.doctor.envfile import parse_env
from dnnctl.errors import InputFileError
from tests.unit._doctor_helpers import doctor

P100 = "gpus: [{name: Tesla P100-PCIE-16GB}]\n"


def test_built_on_a_k80_run_on_a_p100(tmp_path: Path) -> None:
    # collect_env's "detectron2 arch flags   3.7": a sm_37 cubin, no PTX
    d = doctor(tmp_path, P100 + 'extensions: {detectron2: {arch_list: ["3.7"], '
                                'built_from_source: true}}\n')
    [f] = d.of("arch-unsupported", "detectron2")
    assert f["severity"] == "error" and "sm_60" in f["message"]
    assert "no kernel image is available" in f["message"]
    assert '`export TORCH_CUDA_ARCH_LIST="6.0"`' in f["fix"]
    assert "`pip install --no-build-isolation -e .`" in f["fix"]
    assert "rm -rf build/ **/*.so" in f["fix"] and "sm_37 now" in f["fix"]
    assert "detectron2#233" in f["source"] and d.data["verdict"] == "fail"


def test_cubin_and_ptx_rules(tmp_path: Path) -> None:
    # a 6.0 cubin runs on 6.1 (same major, higher minor); 6.1 does not run on 6.0
    ok = doctor(tmp_path, 'gpus: [{name: NVIDIA GeForce GTX 1080}]\n'
                          'extensions: {mmcv-full: {arch_list: [sm_60]}}\n')
    assert not ok.codes("mmcv-full") and ok.of("ok", "mmcv-full")
    bad = doctor(tmp_path, P100 + 'extensions: {mmcv-full: {arch_list: ["6.1"]}}\n')
    [f] = bad.of("arch-unsupported", "mmcv-full")
    assert "`pip install --no-cache-dir --no-binary mmcv-full mmcv-full`" in f["fix"]
    # PTX of a lower compute capability JIT-compiles: a warning, not an error
    jit = doctor(tmp_path, 'gpus: [{name: NVIDIA A100-SXM4-80GB}]\n'
                           'extensions: {apex: {arch_list: ["7.0+PTX"]}}\n')
    assert jit.of("arch-ptx-jit", "apex") and not jit.of("arch-unsupported")


def test_two_gpus_are_both_in_the_rebuild(tmp_path: Path) -> None:
    d = doctor(tmp_path, 'gpus: [{name: Tesla K80}, {name: Tesla P100-PCIE-16GB}]\n'
                         'extensions: {pytorch3d: {arch_list: ["3.7"]}}\n')
    [f] = d.of("arch-unsupported", "pytorch3d")
    assert 'TORCH_CUDA_ARCH_LIST="3.7;6.0"' in f["fix"]


def test_unknown_arch_list_of_a_source_build_is_not_judged(tmp_path: Path) -> None:
    # the report's own snapshot: detectron2 listed in packages only
    d = doctor(tmp_path, P100 + "packages: {detectron2: null, torch: null}\n")
    [f] = d.of("not-judged", "detectron2")
    assert "TORCH_CUDA_ARCH_LIST" in f["message"]
    assert "python -m detectron2.utils.collect_env" in f["fix"]
    assert "✓ detectron2" not in d.text
    other = doctor(tmp_path, P100 + "extensions: {torch-scatter: {built_from_source: true}}\n")
    [f] = other.of("not-judged", "torch-scatter")
    assert "cuobjdump" in f["fix"]
    # a wheel (not built from source) with no list is not judged here: said, never silent
    wheel = doctor(tmp_path, P100 + "extensions: {torch-scatter: {built_from_source: false}}\n")
    assert [(x["code"], x["severity"]) for x in wheel.findings
            if x["component"] == "torch-scatter"] == [("not-judged", "info")]


def test_snapshot_field_is_validated() -> None:
    env = parse_env('extensions: {detectron2: {arch_list: ["3.7"], built_from_source: true, '
                    'version: "0.6"}}\n')
    assert env.extensions == {"detectron2": {"arch_list": ["3.7"], "built_from_source": True,
                                             "version": "0.6"}}
    assert env.to_dict()["extensions"]["detectron2"]["arch_list"] == ["3.7"]
    with pytest.raises(InputFileError, match="arch_list"):
        parse_env("extensions: {detectron2: {arch: [sm_37]}}\n")
