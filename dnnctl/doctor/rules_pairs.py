"""Add-on packages whose version must pair with another's, where the pairing rule is sourced.

- jax's CUDA plugin (``jax-cudaN-plugin``) is used only when its dotted version equals
  jaxlib's (jaxlib/plugin_support.py ``check_plugin_version``); otherwise JAX warns and runs
  without it.
"""

from __future__ import annotations

import re

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
    return jax_plugin(ctx)


def jax_plugin(ctx: Context) -> list[Finding]:
    """jax-cudaN-plugin against jaxlib: equal dotted versions, or the plugin is not used."""
    packages = {canonical_name(n): str(v or "") for n, v in (ctx.env.packages or {}).items()}
    jax_info = (ctx.env.frameworks or {}).get("jax") or {}
    jaxlib = str(jax_info.get("jaxlib") or packages.get("jaxlib") or "")
    lib = _dotted(jaxlib) if jaxlib else None
    out: list[Finding] = []
    for name in sorted(n for n in packages if re.fullmatch(r"jax-cuda\d+-plugin", n)):
        version = packages[name]
        plugin = _dotted(version) if version else None
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
