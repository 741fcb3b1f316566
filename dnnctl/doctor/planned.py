"""`dnnctl compat check`: a planned deployment (any subset of the flags) as an EnvSnapshot."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from dnnctl.compat.gpus import split_gpu_text
from dnnctl.compat.versions import TorchVersion, Version
from dnnctl.doctor.model import Component, EnvSnapshot, Gpu
from dnnctl.doctor.parse import driver_branch
from dnnctl.errors import UsageError


@dataclass
class Plan:
    """What `compat check` was asked about (any subset)."""

    gpu: str | None = None
    driver: str | None = None
    cuda: str | None = None
    cudnn: str | None = None
    torch: str | None = None
    tensorflow: str | None = None
    jax: str | None = None
    cupy: list[str] = field(default_factory=list)
    python: str | None = None


def plan_snapshot(plan: Plan) -> EnvSnapshot:
    """The planned deployment as an EnvSnapshot; every flag left out stays unknown."""
    env = EnvSnapshot(python=_ver(plan.python, "--python") if plan.python else None)
    if plan.gpu:
        env.gpus = [gpu_from_text(plan.gpu)]
    if plan.driver:
        env.driver = {"version": plan.driver.strip() if driver_branch(plan.driver) is not None
                      else _ver(plan.driver, "--driver")}
    if plan.cuda:
        env.cuda_runtimes = [Component(_ver(plan.cuda, "--cuda"), source="planned")]
    if plan.cudnn:
        env.cudnn = [Component(_ver(plan.cudnn, "--cudnn"), source="planned", loaded_first=True)]
    if plan.torch:
        tv = _parse(TorchVersion.parse, plan.torch, "--torch")
        info: dict[str, Any] = {"version": tv.text}
        if plan.cuda and not tv.local:
            info["cuda"] = plan.cuda
        env.frameworks["torch"] = info
    if plan.tensorflow:
        env.frameworks["tensorflow"] = {"version": _ver(plan.tensorflow, "--tensorflow")}
    if plan.jax:
        version, _, plugin = plan.jax.partition("+")
        info = {"version": _ver(version, "--jax")}
        if plugin:
            if not re.fullmatch(r"cuda1[123]", plugin.lower()):
                raise UsageError(f"--jax {plan.jax!r}: the plugin must be cuda12 or cuda13",
                                 hint="e.g. --jax 0.6.2+cuda12")
            info["plugin"] = f"jax-{plugin.lower()}-plugin"
        env.frameworks["jax"] = info
    if plan.cupy:
        env.frameworks["cupy"], env.packages = _cupy(plan.cupy)
    for name in ("cupy", "jax"):  # they run on the CUDA components installed next to them
        if plan.cuda and name in env.frameworks:
            env.frameworks[name].setdefault("cuda", plan.cuda)
    return env


def gpu_from_text(text: str) -> Gpu:
    """``"B200"`` / ``"NVIDIA GeForce RTX 5090"`` -> a named GPU; ``"9.0"`` / ``"sm_90"`` -> a CC."""
    name, cc = split_gpu_text(text)
    return Gpu(name=name, compute_capability=cc)


def _cupy(specs: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    packages: dict[str, str] = {}
    first: dict[str, Any] = {}
    for spec in specs:
        name, _, version = spec.partition("==")
        name = name.strip().lower()
        if re.fullmatch(r"[\d.]+", name):  # just a version
            name, version = "", name
        if name and not re.fullmatch(r"cupy(-cuda\d+x?)?", name):
            raise UsageError(f"--cupy {spec!r}: not a CuPy package",
                             hint="e.g. --cupy cupy-cuda12x==13.3.0 (repeat for several)")
        if version:
            _ver(version, "--cupy")
        if name:
            packages[name] = version or ""
        if not first:
            first = {"version": version or None, "package": name or None}
    first["packages"] = list(packages)
    if not first.get("version"):
        first["version"] = "unknown"
    return {k: v for k, v in first.items() if v}, {k: v for k, v in packages.items()}


def _ver(text: str, flag: str) -> str:
    _parse(Version.parse, text, flag)
    return text.strip()


def _parse(fn: Any, text: str, flag: str) -> Any:
    try:
        return fn(text)
    except UsageError as exc:
        raise UsageError(f"{flag} {text!r}: {exc.message}", hint=exc.hint) from None
