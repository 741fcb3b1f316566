"""Triton's bundled ptxas without its version in the snapshot: known from the Triton release
(matrix table ``triton``), or from the torch that pins it (``triton_pins``) when the snapshot
names Triton's ptxas; judged against each GPU's compute capability, a second Blackwell copy
(3.3 on) for compute capability 10.0 and newer."""

from __future__ import annotations

from pathlib import Path

from dnnctl.compat.matrix import load_matrix
from dnnctl.compat.versions import Version
from tests.unit._doctor_helpers import doctor

SNAP = """
os: Linux
driver: {version: "580.95.05"}
gpus: [{name: "%s"}]
%s
"""


def test_every_triton_row_names_a_cuda_release_the_matrix_knows() -> None:
    m = load_matrix()
    for row in m.rows("triton"):
        for key in ("ptxas", "ptxas_blackwell"):
            if row.get(key):
                assert m.cuda_release(Version.parse(row[key])) is not None, row
    for pin in m.rows("triton_pins"):
        assert m.triton_row(Version.parse(pin["triton"])) is not None, pin


def test_unversioned_pytorch_triton_ptxas_is_inferred_from_torch(tmp_path: Path) -> None:
    named = "libraries: {ptxas: [{source: pip:pytorch-triton}]}\n"
    d = doctor(tmp_path, SNAP % ("NVIDIA GeForce RTX 4090",
                                 named + 'frameworks: {torch: {version: "2.1.2+cu121"}}'))
    [f] = [f for f in d.of("ok", "ptxas")]
    assert "triton 2.1.0 (the one torch 2.1.2+cu121 pins)" in f["message"]
    assert "sm_89 (ptxas 12.1.105)" in f["message"]
    # torch 2.0's Triton: sources disagree on which ptxas it ran -> unknown, never a guess
    d = doctor(tmp_path, SNAP % ("NVIDIA GeForce RTX 4090",
                                 named + 'frameworks: {torch: {version: "2.0.1+cu118"}}'))
    [u] = d.of("unknown-version", "ptxas")
    assert "triton 2.0.0" in u["message"] and u["evidence"]["conflicts"]
    # nothing says which Triton: not judged
    d = doctor(tmp_path, SNAP % ("NVIDIA GeForce RTX 4090", named))
    assert d.of("not-judged", "ptxas") and not d.of("arch-unsupported")


def test_triton_32_bundles_a_ptxas_without_blackwell(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % ("NVIDIA GeForce RTX 5090", 'packages: {triton: "3.2.0"}'))
    [f] = d.of("arch-unsupported", "ptxas")
    assert f["severity"] == "error"
    assert "CUDA 12.4 (12.4.99), which does not know" in f["message"]
    assert "Value 'sm_120' is not defined" in f["message"]
    assert "triton>=3.3" in f["fix"] and "TRITON_PTXAS_PATH" in f["fix"]


def test_gb10_needs_the_blackwell_ptxas_of_triton_36(tmp_path: Path) -> None:
    # triton-lang/triton#8539: pytorch-triton 3.5.0 on a DGX Spark (sm_121a not defined)
    d = doctor(tmp_path, SNAP % ("NVIDIA GB10",
                                 'packages: {pytorch-triton: "3.5.0+git7416ffcb"}'))
    [f] = d.of("arch-unsupported", "ptxas")
    assert "12.8.93" in f["message"] and "sm_121" in f["message"]
    assert "triton>=3.6" in f["fix"] and "torch >=2.11,<2.12 pins it" in f["fix"]
    d = doctor(tmp_path, SNAP % ("NVIDIA GB10", 'packages: {triton: "3.6.0"}'))
    assert not d.of("arch-unsupported")
    [ok] = d.of("ok", "ptxas")
    assert "sm_121 (ptxas 12.9.86)" in ok["message"]


def test_thor_needs_a_cuda_13_blackwell_ptxas(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % ("NVIDIA Thor", 'packages: {triton: "3.6.0"}'))
    [f] = d.of("arch-unsupported", "ptxas")
    assert "Blackwell ptxas of CUDA 12.9" in f["message"] and "does not know" in f["message"]
    assert "TRITON_PTXAS_BLACKWELL_PATH" in f["fix"] and "triton>=3.7" in f["fix"]
    assert not doctor(tmp_path, SNAP % ("NVIDIA Thor", 'packages: {triton: "3.7.0"}')).of(
        "arch-unsupported")


def test_an_override_replaces_the_bundled_copy(tmp_path: Path) -> None:
    env = "environment: {TRITON_PTXAS_BLACKWELL_PATH: /usr/local/cuda-13.0/bin/ptxas}\n"
    d = doctor(tmp_path, SNAP % ("NVIDIA Thor", env + 'packages: {triton: "3.6.0"}'))
    assert not d.of("arch-unsupported")
    [f] = d.of("not-judged", "ptxas")
    assert "TRITON_PTXAS_BLACKWELL_PATH=/usr/local/cuda-13.0/bin/ptxas" in f["message"]
    # a listed Triton copy with its version says it all: judged as before
    d = doctor(tmp_path, SNAP % ("NVIDIA GeForce RTX 5090", 'packages: {triton: "3.2.0"}\n'
                                 'libraries: {ptxas: [{version: "12.8.93", '
                                 'source: "pip:triton"}]}'))
    assert not d.of("arch-unsupported")


def test_unknown_release_and_torch_alone(tmp_path: Path) -> None:
    d = doctor(tmp_path, SNAP % ("NVIDIA GeForce RTX 5090", 'packages: {triton: "3.9.0"}'))
    [f] = d.of("not-judged", "ptxas")
    assert "not in the matrix" in f["message"]
    # a torch alone names no Triton: nothing is said about its ptxas
    d = doctor(tmp_path, SNAP % ("NVIDIA GeForce RTX 5090",
                                 'frameworks: {torch: {version: "2.6.0+cu126"}}'))
    assert not [f for f in d.findings if f["component"] == "ptxas"]
