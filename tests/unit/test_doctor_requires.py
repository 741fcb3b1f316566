"""A package's own Requires-Dist on GPU stack packages: kept by the probe, judged by
rules_requires against what is installed."""

from __future__ import annotations

import re
import sys

import pytest
from _doctor_helpers import doctor, probe_fakes

from dnnctl.compat.matrix import load_matrix
from dnnctl.doctor import requirements, rules_requires
from dnnctl.doctor.context import build_context, finding
from dnnctl.doctor.envfile import load_env, parse_env, save_env
from dnnctl.doctor.host import Host
from dnnctl.doctor.probe_python import probe_python, relevant, requires_of
from dnnctl.errors import InputFileError

fakes = probe_fakes()
HERE = "Windows" if sys.platform == "win32" else "Linux" if sys.platform.startswith(
    "linux") else "Darwin"
ELSEWHERE = "Windows" if HERE != "Windows" else "Linux"
A100 = ("os: Ubuntu 22.04\ndriver: {version: 550.54.14}\n"
        'gpus: [{name: NVIDIA A100-SXM4-80GB, compute_capability: "8.0"}]\n')


def _requires(site) -> dict[str, list[str]]:
    _, _, dists, _ = probe_python(Host(site_paths=[str(site)]))
    return requires_of(dists)


def test_probe_keeps_only_watched_requirements_whose_markers_hold(tmp_path):
    fakes.make_dist(tmp_path, "torch", "2.4.1", requires=[
        "filelock", "numpy>=1.24", "sympy",
        f"triton==3.0.0; platform_system == '{HERE}'",
        f"nvidia-cudnn-cu12==9.1.0.70; platform_system == '{HERE}' and python_version >= '3'",
        f"nvidia-nccl-cu12==2.20.5; platform_system == '{ELSEWHERE}'",
        "nvidia-ml-py>=12",  # NVML's bindings: never breaks a load
        "opt-einsum>=3.3; extra == 'opt-einsum'", "torchvision; extra == 'vision'",
    ])
    fakes.make_dist(tmp_path, "torchvision", "0.19.1", requires=["numpy", "torch==2.4.1"])
    fakes.make_dist(tmp_path, "nvidia-cudnn-cu12", "9.1.0.70",
                    requires=["nvidia-cublas-cu12"])
    fakes.make_dist(tmp_path, "scipy", "1.14.0", requires=["torch==2.4.1"])  # not listed
    assert _requires(tmp_path) == {
        "nvidia-cudnn-cu12": ["nvidia-cublas-cu12"],
        "torch": [f"triton==3.0.0; platform_system == '{HERE}'",
                  f"nvidia-cudnn-cu12==9.1.0.70; platform_system == '{HERE}' and "
                  "python_version >= '3'"],
        "torchvision": ["torch==2.4.1"],
    }


def test_malformed_or_unevaluable_lines_are_dropped_never_guessed():
    assert requirements.kept(["torch==", "torch==2.4.1; os_name === 'x'",
                              "torch==2.4.1; python_version >= 'abc'"]) == []
    assert requirements.kept(["jax-cuda12-pjrt==0.4.35"]) == ["jax-cuda12-pjrt==0.4.35"]


@pytest.mark.parametrize("name", sorted(requirements.WATCHED_EXACT) + [
    "nvidia-cublas-cu12", "jax-cuda12-plugin", "jax-cuda12-pjrt", "cupy-cuda12x",
    "tensorrt-cu12"])
def test_every_watched_project_is_one_the_probe_lists(name):
    assert requirements.watched(name) and relevant(name)


@pytest.mark.parametrize("spec,version,ok", [
    ("==2.3.0", "2.3.0+cu121", True),  # PEP 440: a local label is ignored ...
    ("==2.3.0+cu121", "2.3.0+cu118", False),  # ... unless the specifier names one
    ("==2.3.0", "2.3.1", False),
    (">=0.4.34,<=0.4.35", "0.4.35", True),
    ("~=2.15.0", "2.16.1", False),
    ("!=3.0.0", "3.0.0", False),
    ("==2.3.0", "not-a-version", None),
])
def test_specifiers_are_pep_440(spec, version, ok):
    _, parsed = requirements.requirement(f"torch{spec}")
    assert requirements.satisfied(parsed, version) is ok


def test_an_unmet_pin_is_an_error_quoting_the_metadata(tmp_path):
    d = doctor(tmp_path, A100 + "frameworks: {torch: {version: 2.5.1+cu121}}\n"
               "packages: {torch: 2.5.1, torchvision: 0.19.1+cu121}\n"
               "requires: {torchvision: ['torch==2.4.1']}\n")
    [f] = d.of("requirement-unmet", "torchvision")
    assert f["severity"] == "error" and d.data["verdict"] == "fail"
    assert f["message"].startswith("torchvision 0.19.1+cu121 requires torch==2.4.1 (its "
                                   "metadata), torch 2.5.1+cu121 is installed")
    assert "'Requires-Dist: torch==2.4.1'" in f["source"]
    assert f["fix"].startswith("`pip install 'torch==2.4.1' --index-url "
                               "https://download.pytorch.org/whl/cu121`, or upgrade torchvision")
    assert f["evidence"] == {"package": "torchvision", "version": "0.19.1+cu121",
                             "requires": "torch==2.4.1", "installed": "2.5.1+cu121"}


def test_a_met_pin_with_a_local_label_and_an_extra_are_silent(tmp_path):
    d = doctor(tmp_path, A100 + "frameworks: {torch: {version: 2.4.1+cu121}}\n"
               "packages: {torch: 2.4.1, torchvision: 0.19.1+cu121, triton: 3.0.0}\n"
               "requires:\n  torchvision: ['torch==2.4.1']\n"
               "  torch: ['triton==3.0.0', \"tensorflow==2.15; extra == 'tf'\"]\n")
    assert not d.of("requirement-unmet")


def test_a_missing_required_project_is_a_warning_unless_another_name_provides_it(tmp_path):
    d = doctor(tmp_path, A100 + "frameworks: {torch: {version: 2.4.1+cu121}}\n"
               "packages: {torch: 2.4.1, nvidia-cufft-cu12: 11.0.2.54}\n"
               "requires: {torch: [nvidia-cufft-cu12==11.0.2.54, triton==3.0.0]}\n")
    [f] = d.of("requirement-unmet", "torch")
    assert f["severity"] == "warning" and f["evidence"]["missing"] == "triton"
    assert f["fix"] == "`pip install 'triton==3.0.0'`"
    d = doctor(tmp_path, A100 + "packages: {tensorflow-cpu: 2.15.0, tensorrt: 8.6.1}\n"
               "requires: {tensorrt: ['tensorflow>=2.13']}\n")
    assert not d.of("requirement-unmet")


def test_a_newer_nvidia_library_of_the_pinned_major_is_a_warning(tmp_path):
    d = doctor(tmp_path, A100 + "frameworks: {torch: {version: 2.4.1+cu121}}\n"
               "packages: {torch: 2.4.1, nvidia-cublas-cu12: 12.4.5.8, nvidia-nvjitlink-cu12:"
               " 12.1.105, nvidia-cusparse-cu12: 12.1.0.106}\n"
               "requires:\n  torch: [nvidia-cublas-cu12==12.1.3.1]\n"
               "  nvidia-cusparse-cu12: [nvidia-nvjitlink-cu12>=12.3]\n")
    by = {f["evidence"]["requires"]: f["severity"] for f in d.of("requirement-unmet")}
    assert by == {"nvidia-cublas-cu12==12.1.3.1": "warning",  # newer, same major
                  "nvidia-nvjitlink-cu12>=12.3": "error"}  # older than the floor


def test_pairs_a_specific_rule_judges_are_left_to_it(tmp_path):
    # xformers vs torch: rules_xformers; jax vs jaxlib: rules_jaxlib; torch vs its cuDNN
    # wheel: the cuDNN rules (a newer 9.x runs torch's 9.1 build, so they pass it)
    d = doctor(tmp_path, A100 + "frameworks: {torch: {version: 2.4.1+cu121}}\n"
               "cudnn: [{version: 9.5.1.17, source: 'pip:nvidia-cudnn-cu12'}]\n"
               "packages: {torch: 2.4.1, xformers: 0.0.28, nvidia-cudnn-cu12: 9.5.1.17,"
               " jax: 0.4.30, jaxlib: 0.4.35}\n"
               "requires:\n  xformers: ['torch==2.5.0']\n"
               "  torch: [nvidia-cudnn-cu12==9.1.0.70]\n"
               "  jax: ['jaxlib<=0.4.30,>=0.4.27']\n")
    assert not d.of("requirement-unmet")


def test_an_earlier_finding_naming_the_pair_wins():
    env = parse_env("packages: {torch: 2.5.1, torchvision: 0.19.1}\n"
                    "requires: {torchvision: ['torch==2.4.1']}\n")
    ctx = build_context(env, load_matrix())
    [f] = rules_requires.check(ctx, [])
    assert f.code == "requirement-unmet" and f.component == "torchvision"
    earlier = finding("cuda-mismatch", "error", "torch", "torch 2.5.1 beside torchvision 0.19.1")
    assert rules_requires.check(ctx, [earlier]) == []
    said = finding("ok", "info", "torch", "torch 2.5.1 beside torchvision 0.19.1")
    assert len(rules_requires.check(ctx, [said])) == 1  # a pass speaks for nothing


def test_snapshot_round_trip_keeps_requires(tmp_path):
    text = ("schema: dnnctl-env/1\npackages: {torch: 2.4.1, torchvision: 0.19.1}\n"
            "requires: {torchvision: ['torch==2.4.1'], torch: [\"triton==3.0.0; "
            "platform_system == 'Linux'\"]}\n")
    env = parse_env(text)
    assert env.requires == {"torchvision": ["torch==2.4.1"],
                            "torch": ["triton==3.0.0; platform_system == 'Linux'"]}
    again = load_env(save_env(env, tmp_path / "s.yaml"))
    assert again.requires == env.requires
    saved = (tmp_path / "s.yaml").read_text()
    assert saved.index("packages:") < saved.index("requires:")


@pytest.mark.parametrize("body,where", [
    ("requires: {torch: 'triton==3.0.0'}", "requires.torch"),
    ("requires: {torch: ['triton===']}", r"requires.torch\[0\]"),
    ("requires: [torch]", "requires"),
])
def test_malformed_requires_name_the_field(body, where):
    with pytest.raises(InputFileError) as err:
        parse_env("schema: dnnctl-env/1\n" + body + "\n", "env.yaml")
    assert re.search(where, str(err.value)), str(err.value)
