"""Add-on packages whose version must pair with another's, where the pairing rule is sourced.

- jax's CUDA plugin (``jax-cudaN-plugin``) is used only when its dotted version equals
  jaxlib's (jaxlib/plugin_support.py ``check_plugin_version``); otherwise JAX warns and runs
  without it.
- A serialized TensorRT engine (plan) runs only on the TensorRT version that built it, unless
  built with the version-compatible flag (then newer runtimes of the same major, and TensorRT
  10 runtimes for TensorRT 8 engines) (``frameworks.tensorrt.engines_built_with``).
"""

from __future__ import annotations

import re

from dnnctl.compat.versions import Version
from dnnctl.doctor.context import Context, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.parse import canonical_name

JAX_PLUGIN_SOURCE = (
    "jax-ml/jax jaxlib/plugin_support.py check_plugin_version (the dotted numeric prefixes "
    "of jaxlib's and the plugin's versions must be equal, ROCm plugins excepted: 'JAX plugin "
    "{plugin_name} version {plugin_version} is installed, but it is not compatible with the "
    "installed jaxlib version {jaxlib_version}, so it will not be used.')")
_DOTTED = re.compile(r"[0-9]+(?:\.[0-9]+)*")


def _dotted(text: str) -> tuple[int, ...] | None:
    m = _DOTTED.match(text.strip())
    return tuple(int(x) for x in m.group(0).split(".")) if m else None


def check(ctx: Context) -> list[Finding]:
    """Each pairing rule against the packages listed."""
    return jax_plugin(ctx) + tensorrt_engines(ctx)


def jax_plugin(ctx: Context) -> list[Finding]:
    """jax-cudaN-plugin against jaxlib: equal dotted versions, or the plugin is not used."""
    packages = ctx.packages
    jax_info = (ctx.env.frameworks or {}).get("jax") or {}
    jaxlib = str(jax_info.get("jaxlib") or packages.get("jaxlib") or "")
    lib = _dotted(jaxlib) if jaxlib else None
    plugins = {n: v for n, v in packages.items() if re.fullmatch(r"jax-cuda\d+-plugin", n)}
    named = canonical_name(str(jax_info.get("plugin") or ""))
    if re.fullmatch(r"jax-cuda\d+-plugin", named):  # the entry's own plugin and version win
        plugins[named] = str(jax_info.get("plugin_version") or plugins.get(named) or "")
    out: list[Finding] = []
    for name in sorted(plugins):
        version = plugins[name]
        plugin = _dotted(version) if version else None
        if lib is not None and plugin is None:
            out.append(_plugin_unknown(name, jaxlib, str(jax_info.get("version")
                                                         or packages.get("jax") or "")))
            continue
        if lib is None or plugin is None or plugin == lib:
            continue
        pjrt = name.replace("-plugin", "-pjrt")
        pair = f"'{name}=={jaxlib}'" + (f" '{pjrt}=={jaxlib}'" if pjrt in packages else "")
        out.append(finding(
            "build-mismatch", "error", "jax",
            f"{name} {version} beside jaxlib {jaxlib}: JAX uses a CUDA plugin only of jaxlib's "
            f"own version, so it warns 'JAX plugin ... is not compatible with the installed "
            "jaxlib version ..., so it will not be used' and runs without it",
            fix=f"give them one version: `pip install {pair}`, or jax and jaxlib of the "
            f"plugin's version ({version})", source=JAX_PLUGIN_SOURCE,
            plugin=version, jaxlib=jaxlib))
    return out


def _plugin_unknown(name: str, jaxlib: str, jax: str) -> Finding:
    """The plugin's version is not known: the rule is said, with the install that pairs it."""
    major = re.sub(r"\D", "", name.split("-")[1])
    if jax and _dotted(jax) == _dotted(jaxlib):  # the extra pins plugin and jaxlib to jax's
        cmd = f'pip install "jax[cuda{major}]=={jax}"'
    else:
        cmd = f'pip install "{name}=={jaxlib}"'
    return finding(
        "not-judged", "info", "jax",
        f"{name} (version unknown) beside jaxlib {jaxlib}: JAX uses a CUDA plugin only of "
        "jaxlib's own version (another one is not used, or fails in its initialize()); the "
        "plugin's version is not in the snapshot, so this pair was not judged",
        fix=f"check `pip show {name}`; if it is not {jaxlib}: `{cmd}`",
        source=JAX_PLUGIN_SOURCE + "; dfm in jax-ml/jax#26750 (a newer plugin beside jaxlib "
        "0.4.35: 'pip install jax[cuda12]==0.4.35 should install the right versions')",
        plugin=name, jaxlib=jaxlib)


TRT_ENGINE_SOURCE = (
    "https://docs.nvidia.com/deeplearning/tensorrt/latest/getting-started/support-matrix-10/"
    "10.10.0.html (Engine Portability: 'Version Compatibility: Engines built with the "
    "version-compatible flag can run with newer TensorRT versions within the same major "
    "version'); TensorRT 11.4 support matrix ('TensorRT 8 version-compatible engines can run "
    "with a TensorRT 10 runtime ... No other combination across major versions is "
    "supported'); NVIDIA forum answers ('Serialized engines are not portable across platforms "
    "or TensorRT versions'; a TensorRT 4.0 engine on 5.0: 'It won't work')")
# runtimes a version-compatible engine of one major may run on, besides its own major
_VC_LATER_MAJORS = {8: (10,), 10: (11,)}


def _engine_runs(built: Version, runtime: Version, compatible: bool) -> bool:
    if built.trunc(3) == runtime.trunc(3):
        return True
    if not compatible or runtime < built:
        return False
    return runtime.major == built.major or runtime.major in _VC_LATER_MAJORS.get(built.major, ())


def tensorrt_engines(ctx: Context) -> list[Finding]:
    """Each serialized engine against the TensorRT runtime here."""
    info = (ctx.env.frameworks or {}).get("tensorrt") or {}
    packages = ctx.packages
    runtime = Version.maybe(info.get("version") or packages.get("tensorrt"))
    compatible = info.get("version_compatible") is True
    out: list[Finding] = []
    for text in info.get("engines_built_with") or []:
        built = Version.maybe(text)
        if runtime is None or built is None or _engine_runs(built, runtime, compatible):
            continue
        out.append(finding(
            "build-mismatch", "error", "tensorrt",
            f"a serialized engine built with TensorRT {built} and the TensorRT {runtime} "
            "runtime here: engines run only on the TensorRT version that built them"
            + ("" if compatible else " (unless built version-compatible)")
            + ", so deserializing it fails",
            fix=f"rebuild the engine on this machine with TensorRT {runtime} from its ONNX "
            f"model (trtexec --onnx=... --saveEngine=...), or install TensorRT {built}",
            source=TRT_ENGINE_SOURCE, engine_tensorrt=str(built), tensorrt=str(runtime)))
    return out
