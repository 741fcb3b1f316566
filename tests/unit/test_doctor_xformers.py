"""xformers against the torch beside it: the torch (and CUDA variant) its cpp_lib.json says it
was built for, or its release's pin from the matrix; read from the installed wheel."""

from __future__ import annotations

import json
from pathlib import Path

from _doctor_helpers import doctor, probe_fakes

from dnnctl.doctor.probe_python import xformers_info

GPU = "gpus: [{compute_capability: '8.6'}]\n"


def test_built_for_another_cuda_variant_is_an_error(tmp_path) -> None:
    d = doctor(tmp_path, GPU + "frameworks:\n  torch: {version: 2.6.0+cu126}\n"
               "  xformers: {version: 0.0.29.post2, torch: 2.6.0+cu124, cuda: '12.4'}\n")
    bad = d.of("cuda-mismatch", "xformers")
    assert bad and bad[0]["severity"] == "error"
    assert "built for torch 2.6.0+cu124" in bad[0]["message"]
    assert "the cu124 build against the cu126 one" in bad[0]["message"]
    assert bad[0]["fix"] == ("`pip install xformers==0.0.29.post2 -i "
                             "https://download.pytorch.org/whl/cu126` (the release built for "
                             "torch 2.6.0, from the same index as torch)")
    assert "built for torch 2.6.0+cu124" in d.text  # the summary line
    assert d.code == 1


def test_release_pin_from_the_matrix_when_only_versions_are_known(tmp_path) -> None:
    d = doctor(tmp_path, GPU + "packages: {torch: 2.7.0+cu128, xformers: 0.0.29.post2}\n")
    bad = d.of("cuda-mismatch", "xformers")
    assert bad and "another torch release" in bad[0]["message"]
    assert "xformers==0.0.30" in bad[0]["fix"] and "whl/cu128" in bad[0]["fix"]
    assert "CHANGELOG.md [0.0.29.post2]" in bad[0]["source"]


def test_matching_build_passes_and_an_untagged_pin_says_the_variant_was_not_compared(
        tmp_path) -> None:
    d = doctor(tmp_path, GPU + "frameworks:\n  torch: {version: 2.6.0+cu124}\n"
               "  xformers: {version: 0.0.29.post2, torch: 2.6.0+cu124}\n")
    assert not d.of("cuda-mismatch") and d.of("ok", "xformers")
    d = doctor(tmp_path, GPU + "packages: {torch: 2.6.0+cu124, xformers: 0.0.29.post2}\n")
    assert "variant was not compared" in d.of("ok", "xformers")[0]["message"]


def test_stable_abi_builds_load_with_later_torch_of_the_same_cuda_major(tmp_path) -> None:
    later = GPU + "frameworks:\n  torch: {version: 2.11.0+cu128}\n" \
        "  xformers: {version: 0.0.35, torch: 2.10.0+cu128}\n"
    assert not doctor(tmp_path, later).of("cuda-mismatch")
    other_major = later.replace("2.11.0+cu128", "2.11.0+cu130")
    bad = doctor(tmp_path, other_major).of("cuda-mismatch", "xformers")
    assert bad and "CUDA 12 against CUDA 13" in bad[0]["message"]
    older = later.replace("2.11.0+cu128", "2.9.1+cu128")
    assert "2.10.0 or later" in doctor(tmp_path, older).of("cuda-mismatch")[0]["message"]


def test_unknown_build_is_not_judged_never_passed(tmp_path) -> None:
    d = doctor(tmp_path, GPU + "packages: {torch: 2.6.0+cu126, xformers: null}\n")
    assert [f["code"] for f in d.findings if f["component"] == "xformers"] == ["not-judged"]
    assert "xformers.info" in d.of("not-judged", "xformers")[0]["fix"]


def test_detection_reads_cpp_lib_json_then_the_pin(tmp_path: Path) -> None:
    fakes = probe_fakes()
    host = fakes.make_host(tmp_path)
    meta = {"version": {"cuda": 1204, "hip": None, "torch": "2.6.0+cu124",
                        "python": "3.12.8"}, "env": {}}
    fakes.make_dist(tmp_path / "site", "xformers", "0.0.29.post2",
                    {"xformers/cpp_lib.json": json.dumps(meta)}, requires=["torch==2.6.0"])
    dists, _ = host.distributions(lambda n: n == "xformers")
    assert xformers_info(dists) == {"version": "0.0.29.post2", "source": "metadata",
                                    "torch": "2.6.0+cu124", "cuda": "12.4", "python": "3.12.8"}
    other = tmp_path / "b"
    host = fakes.make_host(other)
    fakes.make_dist(other / "site", "xformers", "0.0.30", {}, requires=["torch==2.7.0"])
    dists, _ = host.distributions(lambda n: n == "xformers")
    assert xformers_info(dists)["torch"] == "2.7.0"


def test_torch_release_without_an_xformers_row_gets_the_index_or_a_source_build(tmp_path) -> None:
    d = doctor(tmp_path, GPU + "frameworks:\n  torch: {version: 2.0.1+cu118}\n"
               "  xformers: {version: 0.0.29.post2, torch: 2.6.0+cu124}\n")
    fix = d.of("cuda-mismatch", "xformers")[0]["fix"]
    assert "pip install -U xformers -i https://download.pytorch.org/whl/cu118" in fix
    assert "--no-build-isolation --no-binary xformers xformers" in fix
