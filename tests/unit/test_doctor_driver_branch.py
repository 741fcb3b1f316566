"""A driver known by its branch alone ("390", "r535", "535 branch"): judged where every driver
of the branch agrees, said to depend on the exact version elsewhere, never read as 390.0."""

from __future__ import annotations

import pytest
from _doctor_helpers import doctor

from dnnctl.compat.matrix import load_matrix
from dnnctl.doctor.envfile import parse_env
from dnnctl.doctor.parse import driver_branch
from dnnctl.doctor.planned import Plan, plan_snapshot
from dnnctl.doctor.rules import judge
from dnnctl.errors import InputFileError


@pytest.mark.parametrize("text, branch", [
    ("390", 390), ("r535", 535), ("R535", 535), ("535 branch", 535), ("branch 535", 535),
    ("535.xx", 535), (" 470 ", 470), ("535.54.03", None), ("570.26", None), ("abc", None),
    ("", None), (None, None)])
def test_a_bare_branch_is_read_as_a_branch(text, branch):
    assert driver_branch(text) == branch


def test_snapshots_and_planned_deployments_accept_a_branch():
    env = parse_env("schema: dnnctl-env/1\ndriver: {version: r535}\n", "t.yaml")
    assert env.driver["version"] == "r535"
    with pytest.raises(InputFileError, match="not a version"):
        parse_env("schema: dnnctl-env/1\ndriver: {version: latest}\n", "t.yaml")
    assert plan_snapshot(Plan(driver="535 branch")).driver == {"version": "535 branch"}


def _judge(text: str) -> list:
    return judge(parse_env("schema: dnnctl-env/1\n" + text, "t.yaml"), load_matrix())


def _said(found: list) -> str:
    return " | ".join(f.message for f in found)


def test_never_a_precise_version_it_does_not_have():
    """R470 with a CUDA 11.6 toolkit (jax-ml/jax#11967): R470 supports CUDA 11.4 at most, so the
    11.6 toolkit runs through minor-version compatibility whatever the exact 470.x."""
    found = _judge("driver: {version: '470'}\n"
                   "cuda_runtimes: [{version: 11.6.2, source: 'system:/usr/local/cuda-11.6'}]\n")
    assert "470.0" not in _said(found) and "driver 470 " not in _said(found)
    [mvc] = [f for f in found if f.code == "driver-mvc"]
    assert mvc.severity == "warning"
    assert "a driver of the R470 branch (exact version unknown) fully supports CUDA 11.4 at " \
           "most" in mvc.message
    assert mvc.fix.startswith("install NVIDIA driver >= 510.47.03")
    [line] = [f for f in found if f.component == "driver"]
    assert line.code == "ok" and line.message.endswith(
        "fully supports CUDA 11.3, and CUDA 11.4 from 470.42.01")


def test_a_branch_below_a_minimum_is_too_old_for_sure():
    """pytorch/pytorch#11138: driver 390 and cudatoolkit 9.2 (needs 396.26)."""
    found = _judge("driver: {version: '390'}\n"
                   "cuda_runtimes: [{version: '9.2', source: 'conda:cudatoolkit'}]\n")
    [old] = [f for f in found if f.code == "driver-too-old"]
    assert old.severity == "error" and "R390 branch" in old.message
    assert "supports CUDA 9.1 at most" in old.message and "396.26" in old.message


def test_a_branch_that_spans_the_minimum_depends_on_the_exact_version():
    # CUDA 12.2 is fully supported from 535.54.03: a toolkit (its PTX) needs to know which 535
    found = _judge("driver: {version: r535}\n"
                   "cuda_runtimes: [{version: '12.2', source: 'nvcc:/usr/local/cuda/bin/nvcc'}]\n")
    [f] = [f for f in found if f.component == "cuda"]
    assert f.code == "unknown-version" and "from 535.54.03 fully support it" in f.message
    assert "exact version of this one is not in the snapshot" in f.message
    assert "nvidia-smi --query-gpu=driver_version" in f.fix
    # pip's runtime libraries run either way (full support or minor-version compatibility)
    found = _judge("driver: {version: r535}\n"
                   "cuda_runtimes: [{version: '12.2', source: 'pip:nvidia-cuda-runtime-cu12'}]\n")
    assert [f.code for f in found if f.component == "cuda"] == []
    # R525 holds drivers on both sides of CUDA 12's minor-version floor 525.60.13
    found = _judge("driver: {version: '525'}\n"
                   "cuda_runtimes: [{version: '12.4', source: 'pip:nvidia-cuda-runtime-cu12'}]\n")
    [f] = [f for f in found if f.component == "cuda"]
    assert f.code == "unknown-version" and "needs driver >= 525.60.13" in f.message


def test_a_branch_against_each_gpu():
    found = _judge("driver: {version: '570'}\ngpus: [{name: B200}]\n")
    [f] = [f for f in found if f.component == "driver" and f.severity != "info"]
    assert f.code == "unknown-version" and "needs driver >= 570.26" in f.message
    found = _judge("driver: {version: '560 branch'}\ngpus: [{name: B200}]\n")
    assert [f.code for f in found if f.severity == "error"] == ["driver-too-old"]
    found = _judge("driver: {version: '580'}\ngpus: [{name: B200}]\n")
    assert [f for f in found if f.severity != "info"] == []
    found = _judge("driver: {version: '535'}\ngpus: [{name: Tesla K80}]\n")
    [f] = [f for f in found if f.code == "arch-unsupported"]
    assert "R470 was the last branch" in f.message and "R535 branch" in f.message


def test_a_container_requirement_against_a_branch():
    def errors(branch: str) -> list[str]:
        found = _judge(f"os: Ubuntu 22.04 (container)\ndriver: {{version: '{branch}'}}\n"
                       "environment: {NVIDIA_REQUIRE_CUDA: 'cuda>=12.4'}\n")
        return [f.message for f in found if "NVIDIA_REQUIRE_CUDA" in f.message]
    assert errors("580") == []
    assert errors("550") == []  # 12.4 needs 550.54.14: which 550 it is decides
    [msg] = errors("535")
    assert "supports CUDA 12.2" in msg


def test_a_reported_cuda_still_wins_and_windows_is_not_judged_by_branch(tmp_path):
    found = _judge("driver: {version: '530', cuda: '12.1'}\n"
                   "cuda_runtimes: [{version: '12.4', source: 'system:ldconfig'}]\n")
    [f] = [f for f in found if f.code == "driver-mvc"]
    assert "the driver supports CUDA 12.1" in f.message
    [line] = [f for f in found if f.component == "driver"]
    assert line.code == "not-judged" and "R530 branch" in line.message
    d = doctor(tmp_path, "os: Windows 11\ndriver: {version: r535}\ngpus: [{name: B200}]\n")
    [line] = d.of("not-judged", "driver")
    assert "Windows drivers are not numbered by their branch" in line["message"]
    assert "(branch; exact version unknown)" in d.text
