"""CUDA_VISIBLE_DEVICES read as CUDA reads it: entries in order, up to the first invalid one
(an index past the last GPU, a UUID of no GPU here, anything else), against the GPUs the
snapshot lists or the driver counts."""

from __future__ import annotations

from pathlib import Path

import pytest
from _doctor_helpers import doctor

from dnnctl.doctor import visible
from dnnctl.doctor.model import EnvSnapshot, Gpu

ONE = 'gpus: [{name: "NVIDIA GeForce RTX 3090", compute_capability: "8.6"}]\n'
TWO = ('gpus: [{name: "NVIDIA GeForce RTX 3090", uuid: GPU-aaaa1111},'
       ' {name: "NVIDIA GeForce RTX 3090", uuid: GPU-bbbb2222}]\n')
DRIVER = 'driver: {version: "550.54.14"}\n'


def _env(value: str, gpus: int = 2, uuids: bool = False, count: int | None = None) -> EnvSnapshot:
    env = EnvSnapshot(gpus=[Gpu(index=i, uuid=f"GPU-{i}abc" if uuids else None)
                            for i in range(gpus)],
                      environment={"CUDA_VISIBLE_DEVICES": value})
    if count is not None:
        env.driver = {"gpu_count": count}
    return env


@pytest.mark.parametrize("value, shown, stop", [
    ("0,1", ("0", "1"), None),
    ("1,0", ("1", "0"), None),
    ("0, 1", ("0", "1"), None),
    ("", (), ""),
    ("-1", (), "-1"),
    ("2", (), "2"),
    ("0,2,1", ("0",), "2"),
    ("NoDevFiles", (), "NoDevFiles"),
    ("0,,1", ("0",), ""),
])
def test_entries_up_to_the_first_invalid_one(value: str, shown: tuple, stop: str | None) -> None:
    seen = visible.parse(_env(value))
    assert seen is not None and seen.shown == shown and seen.stop == stop
    assert seen.hides_all == (stop is not None and not shown)


def test_uuids_are_checked_only_when_every_gpu_has_one() -> None:
    assert visible.parse(_env("GPU-1a", uuids=True)).stop is None  # a unique prefix
    assert visible.parse(_env("GPU-9", uuids=True)).stop == "GPU-9"
    assert visible.parse(_env("GPU-", uuids=True)).stop == "GPU-"  # a prefix of both
    assert visible.parse(_env("GPU-9")).stop is None  # no UUIDs listed: not known
    assert visible.parse(_env("MIG-anything", uuids=True)).stop is None


def test_the_driver_count_wins_over_the_list_and_nothing_known_judges_nothing() -> None:
    assert visible.parse(_env("1", gpus=2, count=1)).stop == "1"
    assert visible.parse(_env("7", gpus=0)).stop is None  # how many GPUs: unknown
    assert visible.parse(EnvSnapshot()) is None


def test_an_index_past_the_only_gpu_hides_it(tmp_path: Path) -> None:
    d = doctor(tmp_path, ONE + DRIVER + 'environment: {CUDA_VISIBLE_DEVICES: "1"}\n')
    [f] = d.of("visible-devices", "gpu")
    assert f["severity"] == "warning" and "shows CUDA no GPU" in f["message"]
    assert "export CUDA_VISIBLE_DEVICES=0" in f["fix"] and f["evidence"]["gpu_count"] == 1
    assert d.data["verdict"] == "warn"


def test_a_later_invalid_entry_hides_the_gpus_after_it(tmp_path: Path) -> None:
    d = doctor(tmp_path, TWO + DRIVER + 'environment: {CUDA_VISIBLE_DEVICES: "0,2,1"}\n')
    [f] = d.of("visible-devices", "gpu")
    assert "shows CUDA only 0" in f["message"] and f["evidence"]["invalid"] == "2"
    assert "export CUDA_VISIBLE_DEVICES=0,1" in f["fix"]


def test_a_uuid_of_no_gpu_here(tmp_path: Path) -> None:
    d = doctor(tmp_path, TWO + DRIVER + 'environment: {CUDA_VISIBLE_DEVICES: "GPU-cccc"}\n')
    [f] = d.of("visible-devices", "gpu")
    assert "UUID of no GPU here" in f["message"]


@pytest.mark.parametrize("value", ["0", "1,0", "GPU-bbbb", "0,1"])
def test_valid_values_are_quiet(tmp_path: Path, value: str) -> None:
    d = doctor(tmp_path, TWO + DRIVER + f'environment: {{CUDA_VISIBLE_DEVICES: "{value}"}}\n')
    assert not d.of("visible-devices") and d.data["verdict"] == "pass"


def test_torch_unavailable_names_the_variable_once(tmp_path: Path) -> None:
    d = doctor(tmp_path, ONE + DRIVER + 'environment: {CUDA_VISIBLE_DEVICES: "3"}\n'
               'frameworks: {torch: {version: "2.4.0+cu121", cuda_available: false}}\n')
    [f] = d.of("no-gpu", "torch")
    assert "index 3 is past the last GPU" in f["message"]
    assert not d.of("visible-devices") and not d.of("cuda-unavailable")


def test_the_error_message_check_reads_it_the_same_way(tmp_path: Path) -> None:
    d = doctor(tmp_path, ONE + DRIVER + 'environment: {CUDA_VISIBLE_DEVICES: "1"}\n'
               'errors: ["RuntimeError: No CUDA GPUs are available"]\n')
    text = str(d.findings)
    assert "index 1 is past the last GPU" in text, text
