"""A package of unknown version is never assumed to be a release a limit applies to: the
limit is said as not judged (README: 'unknown-version ... never guess'); only a row that covers
every release of the package (all_releases: every vLLM) still judges it."""

from __future__ import annotations

from pathlib import Path

from _doctor_helpers import doctor

# facebookresearch/detectron2#233 (audit 12, case 01): a P100 cluster node, torch and
# detectron2 of unknown version (the thread is from torch 1.3's time: no torch.compile)
CASE01 = ("os: Linux (cluster)\ngpus: [{name: Tesla P100, compute_capability: '6.0'}]\n"
          "packages: {detectron2: null, torch: null}\n")


def test_torch_compile_is_not_assumed_for_an_unknown_torch(tmp_path: Path) -> None:
    got = doctor(tmp_path, CASE01)
    assert not got.of("arch-unsupported") and got.code == 0
    [f] = [f for f in got.of("not-judged", "torch") if "torch.compile" in f["message"]]
    assert f["severity"] == "info" and "releases >=2.0" in f["message"]
    assert ">=2.0)" not in f["message"] and "not known" in f["message"]
    assert f["fix"] == "name its version (pip show torch)"
    # a known release is judged as before
    known = doctor(tmp_path, CASE01.replace("torch: null", "torch: 2.1.0"))
    [w] = known.of("arch-unsupported", "torch")
    assert w["severity"] == "warning" and "torch 2.1.0" in w["message"]
    assert not doctor(tmp_path, CASE01.replace("torch: null", "torch: 1.13.1")
                      ).of("arch-unsupported")


def test_flash_attention_of_unknown_release_is_not_judged(tmp_path: Path) -> None:
    # FlashAttention 1.x runs on Turing; 2.x needs compute capability 8.0
    got = doctor(tmp_path, "gpus: [{name: Tesla T4}]\npackages: {flash-attn: null}\n")
    assert not got.of("arch-unsupported", "flash-attn")
    assert any("FlashAttention-2" in f["message"] for f in got.of("not-judged", "flash-attn"))


def test_a_row_for_every_release_still_judges_an_unknown_version(tmp_path: Path) -> None:
    got = doctor(tmp_path, "gpus: [{compute_capability: '6.1'}]\npackages: {vllm: null}\n")
    [f] = got.of("arch-unsupported", "vllm")
    assert f["severity"] == "error" and "vllm (version unknown)" in f["message"]
