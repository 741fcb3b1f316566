"""``doctor --deep``: ask each installed framework itself, in a subprocess with a timeout.

Each framework gets its own interpreter (they run concurrently), so a hang, a crash or a
slow import costs only that framework's answers; every failure becomes a note, and a torch
child that fails on a GPU host becomes ``live["error"]`` (a ``live-failed`` finding). Answers
are merged into the snapshot built from metadata; where they disagree, a note says so.

Time limit: each child gets ``DEEP_TIMEOUT`` seconds (``--deep-timeout`` or
``$DNNCTL_DEEP_TIMEOUT`` change it). Importing torch or jax, creating a CUDA context, loading
cuDNN and running a tiny SDPA call take several seconds on a real GPU host, so this is not
the plain doctor's 3 s probe budget; the children run in parallel, so ``--deep`` as a whole
finishes within about one limit even when a child hangs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dnnctl.doctor import parse
from dnnctl.doctor.background import Task
from dnnctl.doctor.deep_scripts import MARK, SCRIPTS
from dnnctl.doctor.host import Host
from dnnctl.doctor.model import Component, EnvSnapshot
from dnnctl.errors import UsageError

__all__ = ["DEEP_TIMEOUT", "DEEP_TIMEOUT_ENV", "MARK", "SCRIPTS", "ask", "ask_all", "deep_names",
           "merge_deep", "resolve_deep_timeout", "run_deep"]

DEEP_TIMEOUT = 60.0  # seconds per framework child (they run in parallel)
DEEP_TIMEOUT_ENV = "DNNCTL_DEEP_TIMEOUT"
MAX_DEEP_TIMEOUT = 3600.0


def resolve_deep_timeout(value: float | str | None = None,
                 environ: Mapping[str, str] | None = None) -> float:
    """The per-child limit: ``value``, else ``$DNNCTL_DEEP_TIMEOUT``, else DEEP_TIMEOUT.

    Raises UsageError for anything but a number of seconds in (0, 3600].
    """
    source = "--deep-timeout"
    if value is None:
        raw = (environ if environ is not None else os.environ).get(DEEP_TIMEOUT_ENV, "")
        if not raw.strip():
            return DEEP_TIMEOUT
        value, source = raw, f"${DEEP_TIMEOUT_ENV}"
    try:
        seconds = float(str(value).strip()) if len(str(value)) <= 32 else float("nan")
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds <= MAX_DEEP_TIMEOUT:  # also false for NaN
        raise UsageError(f"{source} must be a number of seconds in (0, {MAX_DEEP_TIMEOUT:g}], "
                         f"not {str(value)[:40]!r}",
                         hint=f"e.g. {source.lstrip('$')}=120 when torch imports slowly here")
    return seconds

Answer = tuple[dict[str, Any], str | None]


def ask(host: Host, framework: str, timeout: float) -> Answer:
    """Run one framework's script; (answers, why it failed or None)."""
    res = host.run([host.python, "-c", SCRIPTS[framework]], timeout=timeout,
                   label=f"--deep {framework} child")
    if res is None:
        return {}, f"cannot run {host.python}"
    for line in reversed(res.stdout.splitlines()):
        if line.startswith(MARK):
            try:
                data = json.loads(line[len(MARK):])
            except ValueError:
                break
            return (data, None) if isinstance(data, dict) else ({}, "malformed answer")
    if res.error:
        if "timed out" in res.error:
            return {}, (f"{res.error} (the per-framework limit; raise it with --deep-timeout "
                        f"or ${DEEP_TIMEOUT_ENV})")
        return {}, res.error
    tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
    return {}, f"exited with status {res.returncode}: {tail[:300]}"


def deep_names(frameworks: Mapping[str, Any]) -> list[str]:
    """The frameworks ``--deep`` asks: those with a script that are installed."""
    return [f for f in SCRIPTS if f in frameworks]


def ask_all(host: Host, names: Sequence[str], timeout: float = DEEP_TIMEOUT) -> dict[str, Answer]:
    """Ask every framework in ``names`` at once, each under ``timeout`` seconds.

    The plain probes' overall deadline does not apply (the limit is per child, and the
    children run in parallel, so this takes about ``timeout`` at most).
    """
    if not names:
        return {}
    host = dataclasses.replace(host, deadline=None)
    tasks = [Task(ask, host, name, timeout) for name in names]
    return {name: task.result() for name, task in zip(names, tasks)}


def run_deep(host: Host, env: EnvSnapshot, timeout: float = DEEP_TIMEOUT) -> None:
    """Ask every framework present in ``env`` and merge the answers into it (in place)."""
    merge_deep(env, ask_all(host, deep_names(env.frameworks), timeout))


def merge_deep(env: EnvSnapshot, results: Mapping[str, Answer]) -> None:
    """Merge the children's answers (from :func:`ask_all`) into ``env``."""
    no_driver = env.driver.get("present") is False
    for name, (data, failure) in results.items():
        if name not in env.frameworks:
            continue
        if failure:
            if name == "torch" and _gpu_host(env):  # the live check's own finding says it
                env.notes.append(f"--deep {name}: {failure}")
                env.live = {"error": f"the torch child process failed: {failure}"[:1000]}
            else:  # hung, killed by a signal or not runnable: a probe-failed finding
                hard = re.search(r"timed out|^cannot run|exited with status -\d", failure)
                env.notes.append(f"{'probe failed: ' if hard else ''}--deep {name}: {failure}")
            continue
        for key, msg in sorted((data.get("errors") or {}).items()):
            env.notes.append(f"--deep {name}: {key}: {_explain(msg, no_driver)}")
        MERGE[name](env, env.frameworks[name], data)
        env.frameworks[name]["source"] = "deep"


def _gpu_host(env: EnvSnapshot) -> bool:
    """Whether a live torch check was due: a driver is there and it lists a GPU."""
    return env.driver.get("present") is True and bool(env.gpus)


def _explain(msg: str, no_driver: bool) -> str:
    # CuPy (cudart) reports a missing driver as "CUDA driver version is insufficient for CUDA
    # runtime version", which sends people to upgrade a driver that is not even there.
    if no_driver and ("insufficient" in msg.lower() or "cudaErrorInsufficientDriver" in msg):
        return "cannot reach a GPU: no NVIDIA driver is loaded"
    return msg


def _version_note(env: EnvSnapshot, name: str, before: Any, after: Any) -> None:
    if before and after and str(before) != str(after):
        env.notes.append(f"--deep {name}: installed metadata says {before} but the imported "
                         f"module reports {after} (two installs on the path?)")


def _merge_torch(env: EnvSnapshot, info: dict[str, Any], data: dict[str, Any]) -> None:
    _version_note(env, "torch", info.get("version"), data.get("version"))
    if data.get("version"):
        info["version"] = data["version"]
        tag = parse.local_tag(data["version"])
        if tag:
            info["local_tag"] = tag
    if data.get("cuda"):
        info["cuda"] = data["cuda"]
    if isinstance(data.get("arch_list"), list):
        info["arch_list"] = [str(a) for a in data["arch_list"]]
    runtime = parse.cudnn_int_version(data.get("cudnn"))
    if runtime:
        info["cudnn_runtime"] = runtime
        info.setdefault("cudnn", runtime)
    compiled = data.get("cudnn_compiled")
    if isinstance(compiled, list) and compiled:
        info["cudnn_compiled"] = ".".join(str(x) for x in compiled)
    for key in ("cuda_available", "device_count", "cxx11_abi"):
        if key in data:
            info[key] = data[key]
    if isinstance(data.get("capability"), list) and len(data["capability"]) == 2:
        info["capability"] = "{}.{}".format(*data["capability"])
    if isinstance(data.get("live"), dict):
        env.live = _live(data["live"])
    elif data.get("cuda") and data.get("cuda_available") is False and _gpu_host(env):
        env.live = {"torch": str(data.get("version"))[:100], "error": (
            f"torch (built for CUDA {data['cuda']}) sees no GPU although the driver lists "
            f"{len(env.gpus)}: torch.cuda.is_available() is False")}
    elif "import" in (data.get("errors") or {}) and _gpu_host(env):
        env.live = {"error": f"import torch: {data['errors']['import']}"[:1000]}
    libs = [p for p in data.get("cudnn_libs") or [] if "libcudnn.so." in os.path.basename(p)]
    if libs:
        info["cudnn_loaded"] = libs[0]
        _mark_loaded(env, libs[0])


def _live(data: dict[str, Any]) -> dict[str, Any]:
    """The live answers as plain strings (the snapshot format), bounded in length."""
    out: dict[str, Any] = {}
    for key in ("torch", "cudnn_library", "error"):
        if data.get(key):
            out[key] = str(data[key])[:1000]
    cudnn = parse.cudnn_int_version(data.get("cudnn"))
    if cudnn:
        out["cudnn"] = cudnn
    if data.get("cudnn_error"):
        out["error"] = f"cuDNN: {data['cudnn_error']}"[:1000]
    for key in ("sdpa", "launch"):
        if isinstance(data.get(key), dict):
            out[key] = {str(k)[:40]: str(v)[:400] for k, v in list(data[key].items())[:64]}
    return out


def _mark_loaded(env: EnvSnapshot, loaded: str) -> None:
    """What torch really mapped beats the loader-order model for that cuDNN major."""
    real = os.path.realpath(loaded)
    hit = next((c for c in env.cudnn if c.path and os.path.realpath(c.path) == real), None)
    if hit is None:
        return
    for c in env.cudnn:
        if _soname_major(c.path) == _soname_major(hit.path):
            c.loaded_first = c is hit


def _soname_major(path: str | None) -> str | None:
    m = re.search(r"libcudnn\.so\.(\d+)", os.path.basename(path or ""))
    return m.group(1) if m else None


def _merge_cupy(env: EnvSnapshot, info: dict[str, Any], data: dict[str, Any]) -> None:
    _version_note(env, "cupy", info.get("version"), data.get("version"))
    for key in ("runtime", "local_runtime", "driver"):
        v = parse.cuda_int_version(data.get(key))
        if v:
            info[key] = v
    nvrtc = data.get("nvrtc")
    if isinstance(nvrtc, list) and len(nvrtc) == 2:
        info["nvrtc"] = "{}.{}".format(*nvrtc)
    if isinstance(data.get("device_count"), int):
        info["device_count"] = data["device_count"]
    if info.get("runtime"):  # the runtime CuPy links statically: a concrete version now
        source = f"pip:{info.get('package', 'cupy')}"
        comp = next((c for c in env.cuda_runtimes if c.source == source), None)
        if comp is None:
            env.cuda_runtimes.append(Component(version=info["runtime"], source=source))
        else:
            comp.version = info["runtime"]


def _merge_tensorflow(env: EnvSnapshot, info: dict[str, Any], data: dict[str, Any]) -> None:
    _version_note(env, "tensorflow", info.get("version"), data.get("version"))
    for key in ("cuda", "cudnn"):
        v = parse.tf_version_field(data.get(key))
        if v:
            info[key] = v
    if isinstance(data.get("arch_list"), list):
        info["arch_list"] = [str(a) for a in data["arch_list"]]
    if data.get("cuda_build") is False:
        info["cuda_build"] = False
    if isinstance(data.get("gpus_visible"), int):
        info["gpus_visible"] = data["gpus_visible"]


def _merge_jax(env: EnvSnapshot, info: dict[str, Any], data: dict[str, Any]) -> None:
    _version_note(env, "jax", info.get("version"), data.get("version"))
    if data.get("version"):
        info["version"] = data["version"]
    if data.get("jaxlib"):
        info["jaxlib"] = data["jaxlib"]
    for key, parser, dest in (
        ("cuda_runtime_get_version", parse.cuda_int_version, "cuda_runtime"),
        ("cuda_runtime_build_version", parse.cuda_int_version, "cuda"),
        ("cudnn_get_version", parse.cudnn_int_version, "cudnn_runtime"),
        ("cudnn_build_version", parse.cudnn_int_version, "cudnn"),
    ):
        v = parser(data.get(key))
        if v:
            info[dest] = v
    if data.get("backend"):
        info["backend"] = data["backend"]


MERGE = {"torch": _merge_torch, "cupy": _merge_cupy, "tensorflow": _merge_tensorflow,
         "jax": _merge_jax}
