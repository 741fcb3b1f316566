"""An installed package's own declared requirement on a GPU stack package, not met here.

``requires`` holds each package's ``Requires-Dist`` lines on watched projects
(requirements.py), so no table is needed: ``torchvision 0.19.1`` requires ``torch==2.4.1``
and torch 2.5.0 is installed (its operators fail to register), ``torch 2.4.1`` requires
``triton==3.0.0`` and another Triton was installed over it (torch.compile fails). A pip that
installed the package met the requirement; a later install, ``--no-deps`` or another package's
pin broke it. An unmet requirement is an error; a required project that is not installed at
all, and is not provided under another known name, a warning. An exact pin of an NVIDIA
library wheel met by a newer release of its major is a warning: the library usually loads, but
this is not the pairing that was shipped.

Pairs a specific rule judges (with a reason this rule cannot see, such as cuDNN's promise
that a newer minor runs a build against an older one) are left to it (``OWNED``), and so is
any pair an earlier error or warning already names.
"""

from __future__ import annotations

import re

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from dnnctl.compat.suggest import TORCH_INDEX
from dnnctl.doctor import requirements
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.parse import canonical_name, local_tag

# (requiring package, required project): the rule that judges the pair instead
OWNED = (
    (r"xformers", r"torch", "rules_xformers: the torch of its build, stable ABI from 0.0.34"),
    (r"vllm", r"torch", "rules_vllm: another patch of the pinned line is a warning"),
    (r"jax", r"jaxlib", "rules_jaxlib: jax's own check_jaxlib_version"),
    (r"jax-cuda\d+-plugin", r"jax-cuda\d+-pjrt", "rules_jaxlib"),
    (r"jax-cuda\d+-(plugin|pjrt)", r"jaxlib", "rules_pairs.jax_plugin"),
    (r"torch", r"nvidia-cudnn(-cu\d+)?", "rules_cudnn: the cuDNN that loads against the pin"),
    (r"torch", r"nvidia-nccl(-cu\d+)?", "rules_nccl: the NCCL that loads against the pin"),
)
# another distribution that provides a required project under its own name
PROVIDERS = {
    "tensorflow": ("tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos",
                   "tf-nightly", "tf-nightly-gpu", "tf-nightly-cpu"),
    "triton": ("pytorch-triton",),
    "pytorch-triton": ("triton",),
    "tensorrt": ("tensorrt-cu12", "tensorrt-cu11", "tensorrt-cu13"),
}
# served by download.pytorch.org/whl/<variant> in the installed torch's variant
TORCH_FAMILY = ("torch", "torchvision", "torchaudio")
_VARIANT = re.compile(r"cu\d{2,3}|cpu|rocm\d+(\.\d+)*|xpu")
SOURCE = "{owner} {version} METADATA ('Requires-Dist: {line}'), the package's own declaration"


def check(ctx: Context, findings: list[Finding]) -> list[Finding]:
    """Every watched requirement of every listed package against what is installed."""
    installed = _installed(ctx)
    spoken = [f for f in findings if f.severity in ("error", "warning")]
    out: list[Finding] = []
    for owner, lines in sorted((ctx.env.requires or {}).items()):
        owner = canonical_name(owner)
        for line in lines:
            parsed = requirements.requirement(line)
            if parsed is None:
                continue
            name, spec = parsed
            if not requirements.watched(name) or _owned(owner, name) \
                    or _named(spoken, owner, name):
                continue
            f = _judge(owner, installed.get(owner, ""), line, name, spec, installed)
            if f is not None:
                out.append(f)
    return out


def _installed(ctx: Context) -> dict[str, str]:
    """{canonical name: version ("" = unknown)} from ``packages`` and the frameworks."""
    out = ctx.packages
    fw = ctx.env.frameworks or {}
    pairs = [("torch", (fw.get("torch") or {}).get("version")),
             ("jax", (fw.get("jax") or {}).get("version")),
             ("jaxlib", (fw.get("jax") or {}).get("jaxlib")),
             ("xformers", (fw.get("xformers") or {}).get("version"))]
    for key in ("tensorflow", "cupy", "onnxruntime"):
        info = fw.get(key) or {}
        pairs.append((info.get("package") or key, info.get("version")))
    jax = fw.get("jax") or {}
    pairs.append((jax.get("plugin"), jax.get("plugin_version")))
    for name, version in pairs:
        if not name or not version:
            continue
        name = canonical_name(str(name))
        # torch/version.py's "2.4.1+cu121" says more than METADATA's "2.4.1"
        if not out.get(name) or str(version).startswith(out[name] + "+"):
            out[name] = str(version)
    return out


def _owned(owner: str, name: str) -> bool:
    return any(re.fullmatch(a, owner) and re.fullmatch(b, name) for a, b, _ in OWNED)


def _named(findings: list[Finding], owner: str, name: str) -> bool:
    """An earlier error or warning of one of the two that names the other."""
    for f in findings:
        comp = canonical_name(f.component)
        other = name if comp == owner else owner if comp == name else None
        if other and re.search(rf"(?<![\w-]){re.escape(other)}(?![\w-])", f.message.lower()):
            return True
    return False


def _judge(owner: str, version: str, line: str, name: str, spec: SpecifierSet,
           installed: dict[str, str]) -> Finding | None:
    who = f"{owner} {version}" if version else owner
    wanted = f"{name}{spec}"
    source = SOURCE.format(owner=owner, version=version or "(version unknown)", line=line)
    if name not in installed:
        provider = next((p for p in PROVIDERS.get(name, ()) if p in installed), None)
        if provider:
            return None
        return finding(
            "requirement-unmet", "warning", owner,
            f"{who} requires {wanted} (its metadata), and {name} is not installed: pip "
            "installs it with the package, so it was removed since or another name provides "
            "it; the code that uses it fails where it is needed",
            fix=f"`pip install '{wanted}'`", source=source, package=owner,
            version=version or None, requires=line, missing=name)
    have = installed[name]
    if not have or requirements.satisfied(spec, have) is not False:
        return None  # unknown, or not a PEP 440 version: not judged here, never guessed
    newer = name.startswith("nvidia-") and _newer_same_major(spec, have)
    message = (f"{who} requires {wanted} (its metadata), {name} {have} is installed"
               + (": a newer release of the pinned major, which usually loads, but not the "
                  "pairing the wheel shipped with" if newer else
                  ": what it was built or tested against is not what loads, so importing or "
                  "loading it can fail"))
    return finding(
        "requirement-unmet", "warning" if newer else "error", owner, message,
        fix=f"{_install(wanted, name, have)}, or upgrade {owner} to a release made for "
        f"{name} {have}", source=source, package=owner, version=version or None,
        requires=line, installed=have)


def _install(wanted: str, name: str, have: str) -> str:
    """The command that meets the requirement; torch's own wheels from the installed variant's
    index (``+cu121`` -> download.pytorch.org/whl/cu121)."""
    tag = local_tag(have)
    if name in TORCH_FAMILY and tag and _VARIANT.fullmatch(tag):
        return f"`pip install '{wanted}' --index-url {TORCH_INDEX.format(variant=tag)}`"
    return f"`pip install '{wanted}'`"


def _newer_same_major(spec: SpecifierSet, have: str) -> bool:
    """An exact ``==X`` pin and an installed release newer than X with X's first number."""
    pins = [s for s in spec if s.operator == "==" and "*" not in s.version]
    if len(pins) != 1 or len(spec) != 1:
        return False
    try:
        pinned, installed = Version(pins[0].version), Version(have)
    except InvalidVersion:
        return False
    return installed > pinned and installed.release[0] == pinned.release[0]
