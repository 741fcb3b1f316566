"""NVSwitch systems need nvidia-fabricmanager of the driver's version (compat/fabric.yaml)."""

from __future__ import annotations

import pytest

from dnnctl.compat.matrix import load_matrix


@pytest.fixture(scope="module")
def m():
    return load_matrix()


def test_every_example_name_matches_its_row(m) -> None:
    for row in m.rows("nvswitch_gpus"):
        for name in row["examples"]:
            assert row in m.nvswitch_rows(name), (name, row["model"])


@pytest.mark.parametrize("name", [
    "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA A100 80GB PCIe",
    "NVIDIA A100-PCIE-40GB", "NVIDIA GH200 480GB", "NVIDIA GB200", "Tesla V100-SXM2-16GB",
    "NVIDIA GeForce RTX 4090", "H100", "NVIDIA H800 PCIe"])
def test_pcie_cards_and_boards_without_nvswitch_have_no_row(m, name) -> None:
    assert m.nvswitch_rows(name) == []
