"""A GPU's compute mode: how many processes may hold a CUDA context on it.

NVML's ``nvmlDeviceGetComputeMode`` (nvidia-smi's "Compute M."): ``default`` lets any number
of processes share the GPU; ``exclusive_process`` lets one process create a context at a time
(a second one fails with cudaErrorDevicesUnavailable, "all CUDA-capable devices are busy or
unavailable"), which breaks the many stacks that run several processes on one GPU
(multiprocessing ranks or DataLoader workers that touch CUDA, a server and its workers, a
notebook kernel beside a script); ``prohibited`` lets none. ``exclusive_thread`` is the
pre-CUDA 4 exclusive mode, read like exclusive_process. Setting the mode needs root
(``nvidia-smi -c``); MPS lets several processes share an exclusive-process GPU through its
server.
"""

from __future__ import annotations

from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding, Gpu

SOURCE = (
    "CUDA C++ Programming Guide, 'Compute Modes' (exclusive-process: 'Only one CUDA context may "
    "be created on the device across all processes in the system'; prohibited: 'No CUDA context "
    "can be created on the device'); CUDA driver API CUcomputemode ('Compute-exclusive-process "
    "mode (Only one context used by a single process can be present on this device at a time)', "
    "'Compute-prohibited mode (No contexts can be created on this device at this time)'); CUDA "
    "runtime API cudaErrorDevicesUnavailable = 46 ('all CUDA-capable devices are busy or "
    "unavailable ... due to use of cudaComputeModeProhibited, cudaComputeModeExclusiveProcess'); "
    "nvidia-smi(1) ('-c, --compute-mode: Set MODE for compute applications: 0/DEFAULT, "
    "1/EXCLUSIVE_THREAD (DEPRECATED), 2/PROHIBITED, 3/EXCLUSIVE_PROCESS'; requires root); "
    "iffiX in iffiX/machin#25 ('your GPU is in exclusive mode, which means only one process can "
    "occupy the GPU ... move the model to a unique GPU every time you create a new process'); "
    "henline in tensorflow/tensorflow#526 (nvidia-smi --compute-mode=0)")
MPS_SOURCE = ("CUDA Multi-Process Service, 'Starting MPS control daemon' (https://docs.nvidia.com/"
              "deploy/topics/topic_6_1_1_1.html: as root, 'nvidia-smi -i 0 -c EXCLUSIVE_PROCESS' "
              "then 'nvidia-cuda-mps-control -d'), 'When to Use MPS' ('Exclusive-mode "
              "restrictions are applied to the MPS server, not MPS clients')")
BUSY = "'all CUDA-capable devices are busy or unavailable' (cudaErrorDevicesUnavailable)"


def check(ctx: Context) -> list[Finding]:
    """One finding per GPU whose compute mode is not default."""
    out: list[Finding] = []
    for i, g in enumerate(ctx.env.gpus):
        if (g.mig or {}).get("profile"):
            continue  # a MIG device: its GPU's mode is what is set
        mode = g.compute_mode
        if mode in ("exclusive_process", "exclusive_thread"):
            out.append(_exclusive(g, i, mode))
        elif mode == "prohibited":
            out.append(finding(
                "compute-mode", "error", "gpu",
                f"{_name(g, i)} is in the prohibited compute mode: no process can create a CUDA "
                f"context on it, so every CUDA program that uses it fails with {BUSY}",
                fix=f"with root: `sudo nvidia-smi -i {_index(g, i)} -c DEFAULT`; or run on "
                "another GPU (`CUDA_VISIBLE_DEVICES`)", source=SOURCE, gpu=g.name,
                compute_mode=mode))
    return out


def _exclusive(g: Gpu, i: int, mode: str) -> Finding:
    idx = _index(g, i)
    return finding(
        "compute-mode", "warning", "gpu",
        f"{_name(g, i)} is in the {mode.replace('_', '-')} compute mode: one process at a time "
        "can hold a CUDA context on it, so a second process that uses it (multiprocessing "
        "ranks or DataLoader workers that touch CUDA, a server and its workers, two programs "
        f"at once) fails with {BUSY}",
        fix=f"give each process its own GPU (`CUDA_VISIBLE_DEVICES=<one index>` per process, or "
        f"cuda:<rank>), or keep the GPU work in one process; with root, make the GPU shared: "
        f"`sudo nvidia-smi -i {idx} -c DEFAULT`, or share it through an MPS server "
        "(`sudo nvidia-cuda-mps-control -d`: exclusive mode then binds the MPS server, not its "
        "clients)",
        source=f"{SOURCE}; {MPS_SOURCE}", gpu=g.name, compute_mode=mode)


def _index(g: Gpu, i: int) -> int:
    return g.index if g.index is not None else i


def _name(g: Gpu, i: int) -> str:
    return f"GPU {_index(g, i)} ({g.name})" if g.name else f"GPU {_index(g, i)}"
