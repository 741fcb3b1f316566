"""jax against the jaxlib beside it, and jax's CUDA plugin against its PJRT package.

``import jax`` checks jaxlib first (``check_jaxlib_version``): a jaxlib older than the jax
release's ``_minimum_jaxlib_version`` raises, and from jax 0.3.0 a jaxlib newer than jax raises
too ("jaxlib version 0.4.14 is newer than and incompatible with jax version 0.4.6"). Both
compare the dotted numeric prefix of the versions, so a ``+cuda11.cudnn82`` tag does not
count. The minimum per release is table ``jaxlib_minimum``; a jax newer than its rows is
judged by the newer-than check alone, which its source still makes.

``jax-cudaN-plugin`` requires ``jax-cudaN-pjrt`` of its own version (its plugin_setup.py); the
plugin against jaxlib is rules_pairs.jax_plugin.
"""

from __future__ import annotations

import re

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import Version, VersionRange
from dnnctl.doctor.context import Context, cite, finding
from dnnctl.doctor.model import Finding
from dnnctl.doctor.parse import jaxlib_tag

SOURCE = (
    "jax-ml/jax jax/_src/lib/__init__.py check_jaxlib_version ('jaxlib is version {jaxlib}, "
    "but this version of jax requires version >= {minimum}'; from jax 0.3.0: 'jaxlib version "
    "{jaxlib} is newer than and incompatible with jax version {jax}. Please update your jax "
    "and/or jaxlib packages.'); yashk2810 in jax-ml/jax#17638 ('Please upgrade your jax "
    "version to 0.4.14 as the error message says')")
PJRT_SOURCE = (
    "jax-ml/jax jax_plugins/cuda/plugin_setup.py from jax-v0.4.26, when the PJRT wheel was "
    "split out (install_requires jax-cuda{cuda_version}-pjrt=={__version__}: a plugin wheel "
    "requires the PJRT wheel of its own version)")
CUDA_INDEX = "https://storage.googleapis.com/jax-releases/jax_cuda_releases.html"
_DOTTED = re.compile(r"[0-9]+(?:\.[0-9]+)*")


def _dotted(text: str) -> Version | None:
    """The dotted numeric prefix, as jax's own check reads it."""
    m = _DOTTED.match(text.strip())
    return Version.parse(m.group(0)) if m else None


def check(ctx: Context) -> list[Finding]:
    """jaxlib against the jax release's accepted range; the PJRT wheel against the plugin."""
    return jaxlib_pair(ctx) + pjrt_pair(ctx)


def _row(ctx: Context, jax: Version) -> Row | None:
    return next((r for r in ctx.matrix.rows("jaxlib_minimum") if not r.uncertain
                 and VersionRange.parse(r["jax"]).contains(jax)), None)


def _rejects_newer(ctx: Context, jax: Version, row: Row | None) -> bool:
    """Whether this jax's check rejects a newer jaxlib: its row says; a jax newer than every
    row keeps the last row's check (it is still in jax's source)."""
    if row is not None:
        return bool(row["rejects_newer"])
    rows = [r for r in ctx.matrix.rows("jaxlib_minimum") if not r.uncertain]
    if not rows:
        return False
    last = max(rows, key=lambda r: VersionRange.parse(r["jax"]).lowest() or Version((0,)))
    top = VersionRange.parse(last["jax"]).upper()
    return bool(last["rejects_newer"]) and top is not None and jax >= top


def jaxlib_pair(ctx: Context) -> list[Finding]:
    """A jaxlib that jax's import check rejects: older than the minimum, or newer than jax."""
    packages = ctx.packages
    info = (ctx.env.frameworks or {}).get("jax") or {}
    jax_text = str(packages.get("jax") or info.get("version") or "")
    jaxlib_text = str(info.get("jaxlib") or packages.get("jaxlib") or "")
    jax, jaxlib = _dotted(jax_text), _dotted(jaxlib_text)
    if jax is None or jaxlib is None:
        return []
    row = _row(ctx, jax)
    minimum = Version.parse(row["jaxlib"]) if row is not None else None
    cited = SOURCE + (f"; {cite(row)}" if row else "")
    ev = {"jax": jax_text, "jaxlib": jaxlib_text, "jaxlib_minimum": minimum}
    if minimum is not None and jaxlib < minimum:
        message = (f"jaxlib {jaxlib_text} is older than jax {jax_text} accepts (jaxlib >= "
                   f"{minimum}): 'import jax' fails ('jaxlib is version {jaxlib}, but this "
                   f"version of jax requires version >= {minimum}')")
    elif jaxlib > jax and _rejects_newer(ctx, jax, row):
        message = (f"jaxlib {jaxlib_text} is newer than jax {jax_text}: 'import jax' fails "
                   f"('jaxlib version {jaxlib} is newer than and incompatible with jax "
                   f"version {jax}')")
    else:
        return []
    return [finding("build-mismatch", "error", "jax", message,
                    fix=_fix(ctx, jax, jaxlib, jaxlib_text, minimum), source=cited, **ev)]


def _fix(ctx: Context, jax: Version, jaxlib: Version, jaxlib_text: str,
         minimum: Version | None) -> str:
    """jax of jaxlib's version (where that jax release accepts it), and a jaxlib this jax
    accepts; a CUDA jaxlib (+cuda tag) keeps its build only from jax's CUDA index, so the
    jax side comes first for it. Commands of at most 80 columns: the index stays prose."""
    mate = _row(ctx, jaxlib)
    same = (f'`pip install "jax=={jaxlib}"` (the jax of jaxlib\'s version)'
            if jaxlib >= Version.parse("0.3") and mate is not None
            and Version.parse(mate["jaxlib"]) <= jaxlib else None)
    cuda = jaxlib_tag(jaxlib_text)[0] is not None
    packages = ctx.packages
    plugin = any(re.fullmatch(r"jax-cuda\d+-(plugin|pjrt)", n) for n in packages)
    spec = f"jaxlib>={minimum},<={jax}" if minimum is not None else f"jaxlib<={jax}"
    lib = (f"a CUDA jaxlib that jax {jax} accepts ({spec}, from {CUDA_INDEX})" if cuda else
           f"a jaxlib that jax {jax} accepts: `pip install \"{spec}\"`"
           + (" (and the jax-cuda*-plugin and -pjrt of that version)" if plugin else ""))
    parts = [same, lib] if cuda or jaxlib > jax else [lib, same]
    return ", or ".join(p for p in parts if p)


def pjrt_pair(ctx: Context) -> list[Finding]:
    """jax-cudaN-pjrt of another version than jax-cudaN-plugin: a warning, since the plugin
    requires its own version of the PJRT wheel but no check at run time is sourced."""
    packages = ctx.packages
    out: list[Finding] = []
    for plugin in sorted(n for n in packages if re.fullmatch(r"jax-cuda\d+-plugin", n)):
        pjrt = plugin.replace("-plugin", "-pjrt")
        a, b = _dotted(packages[plugin]), _dotted(packages.get(pjrt) or "")
        if a is None or b is None or a == b:
            continue
        out.append(finding(
            "build-mismatch", "warning", "jax",
            f"{pjrt} {packages[pjrt]} beside {plugin} {packages[plugin]}: the plugin requires "
            f"{pjrt}=={packages[plugin]}, so this pair is one pip never installs together (a "
            "--no-deps or partial upgrade) and the two halves of JAX's CUDA backend come from "
            "different releases",
            fix=f"`pip install '{pjrt}=={packages[plugin]}'`", source=PJRT_SOURCE,
            plugin=packages[plugin], pjrt=packages[pjrt]))
    return out
