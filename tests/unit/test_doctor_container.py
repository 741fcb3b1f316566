"""An image's NVIDIA_REQUIRE_CUDA against the host driver (rules_container)."""

from __future__ import annotations

import pytest

from dnnctl.compat.matrix import load_matrix
from dnnctl.doctor.envfile import parse_env
from dnnctl.doctor.rules import judge

BASE = 'cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=tesla,driver>=535,driver<536'


def _codes(require: str | None, driver: str, *, disable: str | None = None) -> list[tuple]:
    env = {"NVIDIA_REQUIRE_CUDA": require} if require else {}
    if disable:
        env["NVIDIA_DISABLE_REQUIRE"] = disable
    text = ("schema: dnnctl-env/1\nos: Ubuntu 22.04 (container)\n"
            f"driver: {{version: '{driver}'}}\ngpus: [{{name: Tesla V100}}]\n"
            f"environment: {env!r}\n")
    found = judge(parse_env(text, "t.yaml"), load_matrix())
    return [(f.severity, f.code) for f in found if "NVIDIA_REQUIRE_CUDA" in f.message]


@pytest.fixture(scope="module", autouse=True)
def _matrix():
    load_matrix()


def test_unmet_requirement_is_an_error_whatever_the_alternatives() -> None:
    assert _codes(BASE, "530.30.02") == [("error", "driver-too-old")]


def test_a_met_driver_group_or_cuda_floor_passes() -> None:
    assert _codes(BASE, "550.54.14") == []
    assert _codes("cuda>=12.4 driver>=530,driver<531", "530.30.02") == []


def test_a_brand_group_not_known_to_fail_is_not_judged() -> None:
    # 535 matches the driver range; whether the GPU counts as brand=tesla is not judged
    assert _codes(BASE, "535.54.03") == []


def test_disabled_check_or_no_requirement_says_nothing() -> None:
    assert _codes(BASE, "530.30.02", disable="1") == []
    assert _codes(None, "530.30.02") == []
