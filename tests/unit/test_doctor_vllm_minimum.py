"""Prebuilt vLLM needs compute capability 7.0 (vLLM's installation requirements), judged like
the other add-on minimums, with or without the vLLM version."""

from __future__ import annotations

from _doctor_helpers import doctor


def test_vllm_on_pascal_is_an_error(tmp_path) -> None:
    d = doctor(tmp_path, "gpus: [{name: NVIDIA GeForce GTX 1080 Ti}]\n"
               "packages: {vllm: 0.10.0}\n")
    bad = d.of("arch-unsupported", "vllm")
    assert bad and bad[0]["severity"] == "error"
    assert "7.0" in bad[0]["message"] and "sm_61" in bad[0]["message"]
    assert "7.0 or newer" in bad[0]["fix"] and "docs.vllm.ai" in bad[0]["source"]
    assert d.code == 1


def test_vllm_of_unknown_version_is_still_judged(tmp_path) -> None:
    d = doctor(tmp_path, "gpus: [{compute_capability: '6.1'}]\npackages: {vllm: null}\n")
    bad = d.of("arch-unsupported", "vllm")
    assert bad and "version unknown" in bad[0]["message"]


def test_vllm_on_volta_and_newer_passes(tmp_path) -> None:
    d = doctor(tmp_path, "gpus: [{name: Tesla V100-SXM2-16GB}, {name: NVIDIA A100-SXM4-80GB}]\n"
               "packages: {vllm: 0.10.0}\n")
    assert not d.of("arch-unsupported", "vllm")
