"""dnnctl-env/1 files: hand-written partial snapshots load; mistakes name file, line, field."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dnnctl.doctor import envfile
from dnnctl.doctor.envfile import load_env, parse_env, save_env
from dnnctl.doctor.model import Component, EnvSnapshot, Gpu
from dnnctl.errors import InputFileError, UsageError


def test_planned_deployment_as_written_in_the_issue(tmp_path):
    p = tmp_path / "plan.yaml"
    p.write_text("gpus: [{name: B200}]\nframeworks: {torch: {version: 2.2.0+cu121}}\n")
    env = load_env(p)
    assert env.gpus == [Gpu(name="B200")]
    assert env.frameworks == {"torch": {"version": "2.2.0+cu121"}}
    assert env.driver == {} and env.cudnn == []  # absent = unknown
    assert "gpus" in env.to_dict() and "driver" not in env.to_dict()


def test_exact_version_text_and_shorthands():
    env = parse_env("""
schema: dnnctl-env/1
driver: 550.54.15
gpus: [RTX 5090, {name: NVIDIA H100 80GB HBM3, compute_capability: sm_90}]
cuda_runtimes: [12.10, {version: 12.4, source: system}]
cudnn: [9.1.0]
frameworks:
  torch: 2.5.1+cu121
  cupy: {package: cupy-cuda12x, version: 13.3.0, packages: [cupy-cuda11x, cupy-cuda12x]}
packages: {numpy: 1.26}
""")
    assert env.driver == {"version": "550.54.15"}
    assert env.gpus[0].name == "RTX 5090" and env.gpus[1].compute_capability == "9.0"
    assert [c.version for c in env.cuda_runtimes] == ["12.10", "12.4"]  # not the float 12.1
    assert env.cudnn == [Component(version="9.1.0")]
    assert env.frameworks["torch"] == {"version": "2.5.1+cu121"}
    assert env.frameworks["cupy"]["packages"] == ["cupy-cuda11x", "cupy-cuda12x"]
    assert env.packages == {"numpy": "1.26"}


@pytest.mark.parametrize(("text", "line", "where", "words"), [
    ("gpus:\n  name: B200\n", 2, "gpus", "expected a list"),
    ("os: x\ngpu: []\n", 2, "gpu", "did you mean 'gpus'"),
    ("frameworks:\n  pytorch: {version: 2.1}\n", 2, "frameworks.pytorch", "did you mean 'torch'"),
    ("frameworks:\n  torch: {versoin: 2.1}\n", 2, "frameworks.torch.versoin", "'version'"),
    ("driver: {present: maybe}\n", 1, "driver.present", "true or false"),
    ("gpus:\n  - {index: 1.5}\n", 2, "gpus[0].index", "whole number"),
    ("gpus: [{compute_capability: banana}]\n", 1, "gpus[0].compute_capability",
     "not a compute capability"),
    ("schema: dnnctl-env/2\n", 1, "schema", "unsupported schema"),
    ("schema: dnnctl-plan/1\n", 1, "schema", "unsupported schema"),
    ("packages: {a: '1', a: '2'}\n", 1, "packages", "duplicate key 'a'"),
    ("os: !!python/object/apply:os.system [ls]\n", 1, "os", "not allowed"),
    ("notes: [[nested]]\n", 1, "notes[0]", "single value"),
    ("- a list\n", 1, None, "expected a mapping"),
    ("cudnn: [{version: 9.1, loaded_first: yes please}]\n", 1, "cudnn[0].loaded_first",
     "true or false"),
    ("driver:\n  fabric_manager: {versoin: '535.161.08'}\n", 2,
     "driver.fabric_manager.versoin", "did you mean 'version'"),
    ("driver: {fabric_manager: {active: running}}\n", 1, "driver.fabric_manager.active",
     "true or false"),
    ("gpus:\n  - {name: H100, fabric: {state: done}}\n", 2, "gpus[0].fabric.state",
     "not a fabric state"),
    ("driver: {nvswitches: six}\n", 1, "driver.nvswitches", "whole number"),
    ("driver: {kernel_module_type: closed}\n", 1, "driver.kernel_module_type",
     "not a kernel module type"),
    ("driver:\n  pci_gpus:\n    - {slot: '0000:02:00.0', nmae: GP104}\n", 3,
     "driver.pci_gpus[0].nmae", "did you mean 'name'"),
    ("gpus:\n  - {name: V100, compute_mode: shared}\n", 2, "gpus[0].compute_mode",
     "not a compute mode"),
    ("toolchain: {gcc: eleven}\n", 1, "toolchain.gcc", "not a version"),
    ("toolchain: {python_h: maybe}\n", 1, "toolchain.python_h", "true or false"),
    ("toolchain: {cc: /usr/bin/gcc}\n", 1, "toolchain.cc", "unknown field 'cc'"),
])
def test_errors_name_the_line_and_field(tmp_path, text, line, where, words):
    p = tmp_path / "env.yaml"
    p.write_text(text)
    with pytest.raises(InputFileError) as info:
        load_env(p)
    err = info.value
    assert (err.path, err.line, err.where) == (str(p), line, where)
    assert words in err.message and err.message.startswith(f"{p}:{line}")
    assert err.exit_code == 2


def test_yaml_syntax_error_has_a_line(tmp_path):
    p = tmp_path / "env.yaml"
    p.write_text("driver:\n  version: 550\n gpus: [\n")
    with pytest.raises(InputFileError) as info:
        load_env(p)
    assert info.value.line == 3 and "not valid YAML" in info.value.message


@pytest.mark.parametrize("content", ["", "# only a comment\n"])
def test_empty_file(tmp_path, content):
    p = tmp_path / "env.yaml"
    p.write_text(content)
    with pytest.raises(InputFileError, match="empty"):
        load_env(p)


def test_missing_and_binary_files(tmp_path):
    with pytest.raises(InputFileError, match="no such file"):
        load_env(tmp_path / "nope.yaml")
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InputFileError, match="cannot read"):
        load_env(tmp_path / "bin.yaml")


def test_doctor_json_report_is_accepted(tmp_path):
    env = EnvSnapshot(driver={"present": True, "version": "580.159.04"},
                      gpus=[Gpu(0, "NVIDIA H200", "9.0", 143771)])
    p = tmp_path / "report.json"
    p.write_text(json.dumps({"schema": "dnnctl-doctor/1", "verdict": "pass", "findings": [],
                             "env": env.to_dict()}))
    assert load_env(p) == env


def test_save_is_atomic_and_round_trips(tmp_path):
    env = EnvSnapshot(os="Ubuntu", python="3.12.3", driver={"present": False, "reason": "none"},
                      cudnn=[Component("9.19.0.56", "pip:nvidia-cudnn-cu13", "/x", True)],
                      frameworks={"torch": {"version": "2.11.0+cu130", "cuda_build": True,
                                            "arch_list": ["sm_90"], "device_count": 1}},
                      packages={"torch": "2.11.0"}, notes=["a note: with colon"])
    p = tmp_path / "env.yaml"
    p.write_text("old content")
    save_env(env, p)
    assert load_env(p) == env
    text = p.read_text()
    assert text.startswith("# dnnctl-env/1") and "gpus: []" in text
    assert [f.name for f in tmp_path.iterdir()] == ["env.yaml"]  # no temp file left behind


def test_fabric_manager_and_gpu_fabric_state_round_trip(tmp_path):
    """driver.fabric_manager, the NVSwitch evidence and a GPU's fabric state: nvidia-smi -q's
    spelling ("In Progress") is read as NVML's state name, and saving keeps a known False."""
    env = parse_env("driver:\n  version: 535.161.08\n  fabric_manager: {version: 535.104.05, "
                    "active: false, installed: true}\n  nvswitches: 0\n"
                    "  nvlink5_switch: false\ngpus:\n  - {name: NVIDIA H100 80GB HBM3, "
                    "fabric: {state: In Progress, status: success}}\n")
    assert env.driver["fabric_manager"] == {"version": "535.104.05", "active": False,
                                            "installed": True}
    assert (env.driver["nvswitches"], env.driver["nvlink5_switch"]) == (0, False)
    assert env.gpus[0].fabric == {"state": "in_progress", "status": "success"}
    p = tmp_path / "env.yaml"
    save_env(env, p)
    assert load_env(p) == env
    assert "active: false" in p.read_text() and "nvswitches: 0" in p.read_text()


def test_kernel_module_bus_gpus_compute_mode_and_toolchain_round_trip(tmp_path):
    """The open/proprietary flavor, the GPUs on the PCI bus (a bare name for the name), a GPU's
    compute mode as nvidia-smi prints it, and the toolchain with a known absent compiler
    (false) all load, save and load again unchanged."""
    env = parse_env(
        "driver:\n  version: 560.35.03\n  kernel_module_type: Open\n  gpu_count: 1\n"
        "  pci_gpus:\n    - GeForce GTX 1070 Ti\n"
        "    - {slot: '0000:01:00.0', device_id: 1e89, name: 'TU106 [GeForce RTX 2060]'}\n"
        "gpus:\n  - {name: NVIDIA GeForce RTX 2060, compute_mode: Exclusive_Process}\n"
        "  - {name: Tesla V100-SXM2-16GB, compute_mode: 2}\n"
        "toolchain:\n  gcc: 9.4.0\n  clang: false\n  c_compiler: false\n  python_h: false\n"
        "  python_include: /usr/include/python3.12\n"
        "  nvcc_ccbin: {path: /usr/bin/g++-8, kind: gcc, version: 8.4.0}\n")
    assert env.driver["kernel_module_type"] == "open"
    assert env.driver["pci_gpus"] == [
        {"name": "GeForce GTX 1070 Ti"},
        {"slot": "0000:01:00.0", "device_id": "1e89", "name": "TU106 [GeForce RTX 2060]"}]
    assert [g.compute_mode for g in env.gpus] == ["exclusive_process", "prohibited"]
    assert env.toolchain == {"gcc": "9.4.0", "clang": False, "c_compiler": False,
                             "python_h": False, "python_include": "/usr/include/python3.12",
                             "nvcc_ccbin": {"path": "/usr/bin/g++-8", "kind": "gcc",
                                            "version": "8.4.0"}}
    p = tmp_path / "env.yaml"
    save_env(env, p)
    assert load_env(p) == env
    text = p.read_text()
    assert "clang: false" in text and "python_h: false" in text


def test_save_into_a_missing_directory(tmp_path):
    with pytest.raises(UsageError, match="cannot write"):
        save_env(EnvSnapshot(), tmp_path / "no" / "such" / "env.yaml")


def test_loader_tables_match_the_model():
    assert set(envfile.GPU_FIELDS) == {f.name for f in dataclasses.fields(Gpu)}
    assert set(envfile.COMPONENT_FIELDS) == {f.name for f in dataclasses.fields(Component)}
    # ``listed`` is no file field: it records which SEARCHED lists a file wrote as []
    assert set(envfile.TOP_FIELDS) - {"schema"} == \
        {f.name for f in dataclasses.fields(EnvSnapshot)} - {"listed"}


@pytest.mark.parametrize(("text", "cc"), [
    ("9.0", "9.0"), ("9", "9.0"), ("sm_90", "9.0"), ("90", "9.0"), ("sm_100a", "10.0"),
    ("12.0", "12.0"), ("sm_120", "12.0"), ("compute_86", "8.6"), ("10.3", "10.3"),
    ("banana", None), ("9.0.1", None),
])
def test_normalize_cc(text, cc):
    assert envfile.normalize_cc(text) == cc
