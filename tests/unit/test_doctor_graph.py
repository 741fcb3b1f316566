"""PyG's extension wheels and DGL against the torch installed beside them."""

from __future__ import annotations

from _doctor_helpers import doctor

GPU = "gpus: [{compute_capability: '8.6'}]\n"


def test_pyg_wheels_of_another_torch_line_are_an_error_fixed_from_this_torchs_index(
        tmp_path) -> None:
    d = doctor(tmp_path, GPU + "packages: {torch: 2.1.1+cu118, "
               "torch-scatter: 2.1.1+pt113cu117, torch-sparse: 0.6.18+pt21cu118}\n")
    bad = d.of("build-mismatch", "torch-geometric")
    assert len(bad) == 1 and bad[0]["severity"] == "error"
    assert "torch-scatter 2.1.1+pt113cu117 (torch 1.13, cu117)" in bad[0]["message"]
    assert "torch-sparse" not in bad[0]["message"]
    assert bad[0]["fix"] == (
        "`export PIP_FIND_LINKS=https://data.pyg.org/whl/torch-2.1.0+cu118.html` and "
        "`pip install --force-reinstall --no-deps torch_scatter torch_sparse`")
    assert "graph.yaml" in bad[0]["source"]
    assert d.code == 1


def test_pyg_cpu_wheel_beside_a_cuda_torch_is_an_error(tmp_path) -> None:
    d = doctor(tmp_path, GPU + "packages: {torch: 2.4.0+cu121, pyg-lib: 0.4.0+pt24cpu}\n")
    bad = d.of("build-mismatch", "torch-geometric")
    assert bad and "pyg-lib 0.4.0+pt24cpu (torch 2.4, cpu)" in bad[0]["message"]
    assert "torch-2.4.0+cu121.html" in bad[0]["fix"]


def test_matching_pyg_wheels_pass(tmp_path) -> None:
    d = doctor(tmp_path, GPU + "packages: {torch: 2.5.1+cu124, torch-scatter: 2.1.2+pt25cu124,"
               " pyg-lib: 0.4.0+pt25cu124}\n")
    assert not d.of("build-mismatch")


def test_pyg_two_digit_minor_lines(tmp_path) -> None:
    ok = GPU + "packages: {torch: 2.12.0+cu130, torch-scatter: 2.1.2+pt212cu130}\n"
    assert not doctor(tmp_path, ok).of("build-mismatch")
    bad = GPU + "packages: {torch: 2.12.0+cu130, torch-scatter: 2.1.2+pt211cu130}\n"
    assert doctor(tmp_path, bad).of("build-mismatch", "torch-geometric")


def test_pyg_extensions_of_unknown_build_beside_a_nightly_torch_warn(tmp_path) -> None:
    d = doctor(tmp_path, "packages: {torch: 2.1.0.dev20230309+cu117, torch-scatter: null, "
               "torch-sparse: null}\n")
    bad = d.of("build-mismatch", "torch-geometric")
    assert bad and bad[0]["severity"] == "warning"
    assert "PyG has no extension wheels for torch 2.1.0.dev20230309+cu117" in bad[0]["message"]
    assert bad[0]["fix"].startswith("`pip uninstall -y torch_scatter torch_sparse`")


def test_pyg_extensions_of_unknown_build_beside_a_release_with_an_index_are_not_judged(
        tmp_path) -> None:
    d = doctor(tmp_path, GPU + "packages: {torch: 2.1.1+cu118, torch-scatter: null}\n")
    assert not d.of("build-mismatch")


def test_dgl_cpu_build_beside_a_cuda_torch_on_a_gpu_is_an_error(tmp_path) -> None:
    d = doctor(tmp_path, GPU + "packages: {torch: 2.3.1+cu121, dgl: 2.4.0}\n")
    bad = d.of("build-mismatch", "dgl")
    assert len(bad) == 1 and bad[0]["severity"] == "error"
    assert "CPU build" in bad[0]["message"]
    assert bad[0]["fix"] == (
        "`pip uninstall -y dgl` and `export PIP_FIND_LINKS="
        "https://data.dgl.ai/wheels/torch-2.3/cu121/repo.html` and "
        "`pip install dgl==2.4.0+cu121`")
    assert d.code == 1


def test_dgl_cuda_build_of_another_cuda_than_torch(tmp_path) -> None:
    d = doctor(tmp_path, GPU + "packages: {torch: 2.1.1+cu118, dgl: 2.1.0+cu121}\n")
    bad = d.of("build-mismatch", "dgl")
    assert bad and "built for cu121" in bad[0]["message"]
    assert "https://data.dgl.ai/wheels/cu118/repo.html" in bad[0]["fix"]


def test_dgl_matching_build_and_cpu_torch_pass(tmp_path) -> None:
    assert not doctor(tmp_path, GPU + "packages: {torch: 2.1.1+cu118, dgl: 2.1.0+cu118}\n"
                      ).of("build-mismatch")
    assert not doctor(tmp_path, "packages: {torch: 2.1.1+cpu, dgl: 2.1.0}\n"
                      ).of("build-mismatch")


def test_dgl_below_its_torch_floor(tmp_path) -> None:
    d = doctor(tmp_path, GPU + "packages: {torch: 1.13.1+cu117, dgl: 2.3.0+cu117}\n")
    bad = d.of("build-mismatch", "dgl")
    assert bad and bad[0]["severity"] == "error"
    assert "'DGL requires PyTorch >= 2.1.0'" in bad[0]["message"]
    # DGL 1.0 documents torch 1.12 but its import check only refuses below 1.9
    d = doctor(tmp_path, "packages: {torch: 1.11.0+cu113, dgl: 1.0.1}\n")
    floor = [f for f in d.of("build-mismatch", "dgl") if "needs torch" in f["message"]]
    assert floor and floor[0]["severity"] == "warning"


def test_a_torch_from_before_pygs_wheel_index_is_not_judged(tmp_path) -> None:
    """Before PyG published wheels, its extensions were built from source against the torch
    there: a missing index says nothing about them."""
    d = doctor(tmp_path, "frameworks: {torch: {version: 1.1.0, cuda: '8.0'}}\n"
               "packages: {torch: 1.1.0, torch-scatter: null}\n")
    assert not d.of("build-mismatch", "torch-geometric")


def test_an_old_torch_geometric_is_not_told_to_drop_the_extensions(tmp_path) -> None:
    d = doctor(tmp_path, "packages: {torch: 2.1.0.dev20230309+cu117, torch-scatter: null, "
               "torch-geometric: 2.2.0}\n")
    bad = d.of("build-mismatch", "torch-geometric")
    assert bad and "uninstall" not in bad[0]["fix"]
    assert "from source" in bad[0]["fix"]


def test_dgl_fix_names_only_a_published_cuda_build(tmp_path) -> None:
    """DGL 2.4.0 has cu124 builds for torch 2.4 only: beside torch 2.3.1+cu124 (whose dgl is
    the CPU build) there is no 2.4.0+cu124 to install, and no other release has one for 2.3."""
    d = doctor(tmp_path, GPU + "packages: {torch: 2.3.1+cu124, dgl: 2.4.0}\n")
    bad = d.of("build-mismatch", "dgl")
    assert bad and "dgl==2.4.0+cu124" not in bad[0]["fix"]
    assert "DGL published no cu124 build of dgl 2.4.0 for torch 2.3" in bad[0]["fix"]
    assert "cu118, cu121" in bad[0]["fix"]


def test_dgl_fix_names_the_nearest_release_with_the_build(tmp_path) -> None:
    """dgl 1.1.2 has no cu121 build (cu116-cu118); 1.1.3 is the first release with one."""
    d = doctor(tmp_path, GPU + "packages: {torch: 2.1.0+cu121, dgl: 1.1.2+cu118}\n")
    bad = d.of("build-mismatch", "dgl")
    assert bad and "the nearest release with one" in bad[0]["fix"]
    assert bad[0]["fix"].endswith("`pip install dgl==1.1.3+cu121`")
    assert "https://data.dgl.ai/wheels/cu121/repo.html" in bad[0]["fix"]


def test_dgl_published_build_keeps_the_release(tmp_path) -> None:
    d = doctor(tmp_path, GPU + "packages: {torch: 2.4.0+cu124, dgl: 2.4.0}\n")
    bad = d.of("build-mismatch", "dgl")
    assert bad and bad[0]["fix"].endswith("`pip install dgl==2.4.0+cu124`")
    assert "torch-2.4/cu124/repo.html" in bad[0]["fix"]
