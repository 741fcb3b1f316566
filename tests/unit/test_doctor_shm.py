"""NCCL's shared-memory segments against /dev/shm: the snapshot's system section, its probe
(container marks, statvfs of /dev/shm) and the rule, through the real `dnnctl doctor --from`."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from _doctor_helpers import doctor, probe_fakes

from dnnctl.doctor.envfile import parse_env
from dnnctl.doctor.probe_system import probe_system

fakes = probe_fakes()
FOUR = "".join(f"  - {{index: {i}, name: GeForce RTX 2080, compute_capability: '7.5'}}\n"
               for i in range(4))
NCCL = "libraries: {nccl: [{version: 2.7.3, source: 'apt:libnccl2'}]}\n"


def test_a_container_of_unknown_shm_size_gets_the_conditional_warning(tmp_path):
    """NVIDIA/nccl#342: NCCL 2.7.3 on 4 GPUs in nvidia/cuda:10.1, Docker's 64 MB /dev/shm."""
    d = doctor(tmp_path, "os: Ubuntu 18.04 (container nvidia/cuda:10.1-devel-ubuntu18.04)\n"
               "gpus:\n" + FOUR + NCCL)
    [f] = d.of("shm-size", "nccl")
    assert f["severity"] == "warning" and f["evidence"]["conditional"] is True
    assert f["message"].startswith("NCCL 2.7.3 with 4 GPUs in a container: NCCL puts the "
                                   "buffers it moves between GPUs in /dev/shm")
    assert "if it is that default" in f["message"] and "posix_fallocate" in f["message"]
    assert "--shm-size=1g --ulimit memlock=-1" in f["fix"] and "--ipc=host" in f["fix"]
    assert "`export NCCL_SHM_DISABLE=1`" in f["fix"] and "medium: Memory" in f["fix"]
    assert "nccl/user-guide" in f["source"] and "nccl#342" in f["source"]


def test_a_known_size_decides_and_one_gpu_or_no_nccl_says_nothing(tmp_path):
    small = doctor(tmp_path, "system: {container: docker, shm_mib: 64}\ngpus:\n" + FOUR
                   + "frameworks: {torch: {version: 2.5.1+cu124}}\n")
    [f] = small.of("shm-size")
    assert f["message"].startswith("torch 2.5.1+cu124 with 4 GPUs: NCCL puts the buffers")
    assert "/dev/shm here is 64 MiB (this is a docker container)" in f["message"]
    assert "conditional" not in f["evidence"] and f["evidence"]["shm_mib"] == 64
    big = doctor(tmp_path, "system: {container: docker, shm_mib: 16384}\ngpus:\n" + FOUR + NCCL)
    assert big.of("shm-size") == []
    host = doctor(tmp_path, "os: Ubuntu 22.04\ngpus:\n" + FOUR + NCCL)  # no container, size
    assert host.of("shm-size") == []                                       # unknown
    one = doctor(tmp_path, "system: {shm_mib: 64}\ngpus: [{name: GeForce RTX 2080}]\n" + NCCL)
    assert one.of("shm-size") == []
    bare = doctor(tmp_path, "system: {shm_mib: 64}\ngpus:\n" + FOUR)
    assert bare.of("shm-size") == []


def test_system_section_loads_and_rejects_typos():
    env = parse_env("system: {container: false, shm_mib: 64}\n")
    assert env.system == {"container": False, "shm_mib": 64}
    assert env.to_dict()["system"] == {"container": False, "shm_mib": 64}
    try:
        parse_env("system: {shm_size: 64}\n")
    except Exception as exc:  # noqa: BLE001 - the loader's error names the field
        assert "shm_size" in str(exc) and "shm_mib" in str(exc)
    else:
        raise AssertionError("a typo must be an error")


def test_probe_reads_the_container_marks_and_statvfs_of_dev_shm(tmp_path: Path) -> None:
    seen = []

    def statvfs(path: str) -> SimpleNamespace:
        seen.append(path)
        return SimpleNamespace(f_blocks=16384, f_frsize=4096)

    host = fakes.make_host(tmp_path / "a", files={"/.dockerenv": "", "/dev/shm/x": ""})
    assert probe_system(host, statvfs) == {"container": "docker", "shm_mib": 64}
    assert seen and seen[0].endswith("/dev/shm")
    k8s = fakes.make_host(tmp_path / "b", files={"/dev/shm/x": ""},
                          environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert probe_system(k8s, statvfs)["container"] == "kubernetes"
    cgroup = fakes.make_host(tmp_path / "c", files={
        "/proc/self/x": "", "/proc/1/cgroup": "12:pids:/docker/0123abcd\n"})
    assert probe_system(cgroup, statvfs) == {"container": "docker"}
    plain = fakes.make_host(tmp_path / "d", files={
        "/proc/self/x": "", "/proc/1/cgroup": "0::/init.scope\n", "/dev/shm/x": ""})
    assert probe_system(plain, statvfs) == {"container": False, "shm_mib": 64}
    assert probe_system(fakes.make_host(tmp_path / "e"), statvfs) == {}
