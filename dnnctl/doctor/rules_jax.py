"""JAX rules: the CUDA plugin (or jaxlib +cuda build) against the driver, GPUs and cuDNN.

``check`` judges a jax with a known CUDA plugin; a jax with none is CPU-only (``cpu_only`` /
``cpu_finding``), never judged as if a plugin were installed.
"""

from __future__ import annotations

import re
from typing import Any

from dnnctl.compat.drivers import driver_need
from dnnctl.compat.schema import Row
from dnnctl.compat.suggest import reach_row
from dnnctl.compat.versions import Version, VersionRange, parse_cudnn
from dnnctl.doctor import rules_cudnn, rules_platform
from dnnctl.doctor.context import Context, finding, unknown
from dnnctl.doctor.model import Finding
from dnnctl.doctor.parse import jaxlib_tag
from dnnctl.doctor.rules_libraries import (
    arch_findings,
    built_cudnn,
    library_major,
    loadable_majors,
    loaded_runtime,
)
from dnnctl.doctor.rules_runtime import runtime_findings


def _cuda_of(info: dict[str, Any], key: str = "cuda") -> Version | None:
    return Version.maybe(info.get(key))


JAXLIB_TAG_SOURCE = (
    "the jaxlib version string: before the CUDA plugins the build was in its local version "
    "(jaxlib-0.3.7+cuda11.cudnn805 and jaxlib-0.1.68+cuda111 wheels at "
    "https://storage.googleapis.com/jax-releases/jax_cuda_releases.html); "
    "https://github.com/google/jax/releases/tag/jax-v0.2.23 (`pip install "
    "jax[cuda=11,cudnn=82]` / `cudnn=805`: one jaxlib build per cuDNN)")
JAX_BUILT_CUDNN = ("the build's own cuDNN (jaxlib +cudnnXY tag or --deep): XLA requires the "
                   "same major and an equal or higher minor; jax-ml/jax#15268 ('we found a "
                   "CuDNN v8.5, but JAX was built against CuDNN v8.6. You need to update "
                   "CuDNN')")


def with_packages(ctx: Context, info: dict[str, Any] | None) -> dict[str, Any] | None:
    """The jax entry completed from ``packages`` (a hand-written snapshot may list jax, jaxlib
    and the plugin only there): its version, jaxlib and plugin where the entry lacks them."""
    names = ctx.packages
    if info is None and "jax" not in names and "jaxlib" not in names:
        return None
    out = dict(info or {})
    if not out.get("version") and (names.get("jax") or names.get("jaxlib")):
        out["version"] = (names.get("jax") or names["jaxlib"]).split("+")[0]
    if not out.get("jaxlib") and names.get("jaxlib"):
        out["jaxlib"] = names["jaxlib"]
    plugins = sorted(n for n in names if re.fullmatch(r"jax-cuda\d+-plugin", n))
    if plugins and not out.get("plugin") and not out.get("plugins"):
        out["plugin"], out["plugin_version"] = plugins[0], names[plugins[0]]
    if not out.get("cudnn") and out.get("jaxlib"):
        cudnn = jaxlib_tag(str(out["jaxlib"]))[1]
        if cudnn:
            out["cudnn"] = cudnn
    return out


def check(ctx: Context, info: dict[str, Any]) -> list[Finding]:
    """A jax of known version: its plugin's CUDA, code for each GPU, driver and cuDNN."""
    ver = Version.maybe(info.get("jaxlib") or info.get("plugin_version") or info["version"])
    what = f"jax {info['version']}"
    plugin = _plugin_major(info)
    rows = ctx.matrix.jax_rows(ver) if ver else []
    if plugin is None:  # never judged as if a plugin were there: jax without one is CPU-only
        if cpu_only(ctx, info):
            return cpu_finding(ctx, what, ver)
        names = "/".join(f"cuda{p}" for p in sorted({r["plugin"] for r in rows})) or "CUDA"
        return [unknown("jax", f"{what}: which {names} plugin is installed is unknown (without "
                        "one, or a jaxlib +cuda build, jax runs on the CPU only)",
                        fix="name it (frameworks.jax.plugin: jax-cuda12-plugin), or run "
                        "`dnnctl doctor` where jax is installed", jax=info["version"])]
    rows = [r for r in rows if r["plugin"] == plugin]
    if (not rows or rows[0].uncertain) and jaxlib_tag(str(info.get("jaxlib") or ""))[0]:
        return tag_only(ctx, info, row=rows[0] if rows else None)
    if not rows or rows[0].uncertain:  # the build's own cuDNN is still checked
        return [unknown("jax", f"{what}: no {'cuda' + str(plugin) if plugin else 'CUDA'} "
                        "plugin row in the matrix", jax=info["version"])] + built_cudnn(
            ctx, "jax", what, info)
    row = rows[0]
    what = f"jax {info['version']} (cuda{row['plugin']} plugin)"
    install = row["install"].format(version=info["version"])
    need = VersionRange.parse(row["cuda"])
    # The runtime it runs with: --deep's report, else the plugin's CUDA major found here,
    # else the build's own field (detection knows only the major of jax-cuda12-plugin or
    # +cuda11: then only the major is judged, never as 12.0 against ">=12.1").
    cuda = _cuda_of(info, "cuda_runtime") or loaded_runtime(ctx, row["plugin"]) or _cuda_of(info)
    out: list[Finding] = []
    if cuda is not None and not need.admits(cuda):
        out.append(finding("cuda-mismatch", "error", "jax", f"{what} needs CUDA {need}; the "
                           f"runtime is {cuda}", fix=install, row=row, cuda=cuda))
    floor = min(c[1] for c in need.clauses if c[0] in (">=", "=="))
    runtime = cuda if cuda is not None and not cuda.major_only else floor
    arch, ptx_only = arch_findings(ctx, "jax", what, row, info.get("arch_list"), newest_fix(ctx))
    out += arch
    out += library_major(ctx, "jax", what, row["plugin"], "libcublas", fix=(
        f"{install} (the [cuda{row['plugin']}] extra installs the CUDA {row['plugin']} "
        "libraries as pip packages)"), row=row)
    out += runtime_findings(ctx, "jax", runtime, what=what, jit=True, ptx_only=ptx_only, row=row)
    known = cuda is not None and not cuda.major_only
    return out + _cudnn(ctx, info, row, what, runtime, known) + _libraries_unknown(
        ctx, info, row, what, install)


def tag_only(ctx: Context, info: dict[str, Any], row: Row | None = None) -> list[Finding]:
    """A jaxlib CUDA build the JAX table has no (certain) row for, judged by what its version
    says (``0.3.25+cuda11.cudnn82``: a CUDA 11 build compiled with cuDNN 8.2; ``+cuda111``:
    CUDA 11.1): the CUDA libraries it loads, the driver, the cuDNN that loads. Its arch list
    is not in the version, so the GPUs are not judged, and the doctor says so."""
    jaxlib = str(info.get("jaxlib") or "")
    cuda_text, cudnn_text = jaxlib_tag(jaxlib)
    cuda = Version.parse(cuda_text)
    what = f"jax {info['version']} (jaxlib {jaxlib})"
    states = f"CUDA {cuda_text}" + (f", cuDNN {cudnn_text}" if cudnn_text else "")
    first = min((VersionRange.parse(r["jax"]).lowest() for r in ctx.matrix.rows("jax")
                 if not r.uncertain), default=None)
    out = [unknown("jax", f"{what}: no certain row in the matrix"
                   + (f" (its JAX rows start at {first})" if first else "") + "; judged by its "
                   f"version string only ({states}); which GPUs its kernels cover was not "
                   "judged", row=row, jaxlib=jaxlib, cuda=cuda_text, cudnn=cudnn_text)]
    if row is None:
        out[0].source = JAXLIB_TAG_SOURCE
    index = "https://storage.googleapis.com/jax-releases/jax_cuda_releases.html"
    out += library_major(ctx, "jax", what, cuda.major, "libcudart", fix=(
        f"install the CUDA {cuda_text if not cuda.major_only else f'{cuda.major}.x'} "
        f"runtime libraries, or a jaxlib built for the CUDA here (-f {index})"),
        built=None if cuda.major_only else cuda)
    runtime = loaded_runtime(ctx, cuda.major) if cuda.major_only else cuda
    if runtime is not None:
        out += runtime_findings(ctx, "jax", runtime, what=what, jit=True)
    else:
        out += _major_floor(ctx, what, cuda)
    found = built_cudnn(ctx, "jax", what, info)
    for f in found:
        if f.severity == "error" and cudnn_text:
            f.fix = (f.fix or "") + (f"; or the jaxlib {jaxlib.split('+')[0]} build for the "
                                     f"cuDNN that loads (+cuda{cuda_text.replace('.', '')}"
                                     f".cudnnXY, -f {index})")
    return out + found


def _major_floor(ctx: Context, what: str, cuda: Version) -> list[Finding]:
    """A build that names only its CUDA major, with no runtime of that major listed: any
    CUDA M.x build runs on the major's minor-version-compatibility floor; below it, only if
    built with an old enough minor, which the version does not say."""
    need = driver_need(ctx.matrix, cuda)
    if ctx.tegra or not need.mvc or need.minimum is None \
            or ctx.driver_at_least(need.minimum) is not False:
        return []
    return [finding(
        "driver-too-old", "warning", "jax",
        f"{what} is a CUDA {cuda.major} build of unknown minor; driver {ctx.driver_label} is below "
        f"the CUDA {cuda.major}.x floor {need.minimum}, so it runs only if built with an "
        f"early CUDA {cuda.major} minor", fix=f"install NVIDIA driver >= {need.minimum}",
        row=need.major_row, driver=ctx.driver, driver_branch=ctx.driver_branch,
        required=need.minimum)]


def _libraries_unknown(ctx: Context, info: dict[str, Any], row: Row, what: str,
                       install: str) -> list[Finding]:
    """A CUDA jax whose CUDA libraries and cuDNN are both absent from the snapshot: what it
    loads was not judged (never "no problem found"); the row's install brings them."""
    names = list(ctx.packages)
    if loadable_majors(ctx) is not None or ctx.env.cudnn or "cudnn" in ctx.env.listed \
            or info.get("cuda_runtime") \
            or info.get("cudnn_runtime") or any(n.startswith("nvidia-") for n in names):
        return []
    return [finding(
        "not-judged", "info", "jax", f"{what}: the snapshot lists no CUDA {row['plugin']} "
        "runtime, cuDNN or nvidia-* package, so what it loads was not judged; it needs CUDA "
        f"{row['cuda']} and cuDNN {row['cudnn']}, which the [cuda{row['plugin']}] extra "
        "installs as pip packages", fix=f"if they are missing: {install}", row=row)]


def _cudnn(ctx: Context, info: dict[str, Any], row: Row, what: str,
               runtime: Version, runtime_known: bool = True) -> list[Finding]:
    """The cuDNN that loads against the one the build needs. ``cudnn`` is what the build was
    compiled with (a jaxlib ``+cudnn86`` tag, --deep's cudnnGetVersion of the build), which
    XLA checks at start (same major, equal or higher minor); without it the row's minimum."""
    built = parse_cudnn(info.get("cudnn"))
    minimum = built or Version.parse(row["cudnn"])
    loaded = parse_cudnn(info.get("cudnn_runtime"))
    if loaded is None:
        copy = rules_cudnn.loaded_copy(ctx, minimum.major)
        loaded = parse_cudnn(copy.version) if copy else None
    if loaded is None:  # no copy of the needed major: any other copy found is the wrong one
        others = sorted((v for c in ctx.env.cudnn if (v := parse_cudnn(c.version))), reverse=True)
        loaded = others[0] if others else None
    if loaded is None:
        return _cudnn_none(ctx, info, row, what, minimum)
    older = loaded.trunc(2) < built.trunc(2) if built else loaded < minimum
    if loaded.major == minimum.major and not older:
        return rules_cudnn.gpu_support(ctx, "jax", what, loaded, runtime,
                                       cuda_known=runtime_known)
    need = (f"was built against cuDNN {built} (it needs {built.major}.x, minor >= "
            f"{built.minor})" if built else
            f"needs cuDNN >= {minimum} (< {minimum.major + 1})")
    return [finding(
        "cudnn-mismatch", "error", "cudnn",
        f"{what} {need}, and cuDNN {loaded} loads: JAX refuses to start ('Loaded runtime "
        "CuDNN library ... but source was compiled with ...')",
        fix=f"pip install 'nvidia-cudnn-cu{row['plugin']}>={minimum}' (and unset "
        "LD_LIBRARY_PATH entries with an older cuDNN)", row=row,
        source=JAX_BUILT_CUDNN if built else None, cudnn_min=minimum, cudnn_built=built,
        cudnn_loaded=loaded)]


def _cudnn_none(ctx: Context, info: dict[str, Any], row: Row, what: str,
                minimum: Version) -> list[Finding]:
    """No cuDNN at all, when the snapshot says it looked (``cudnn: []``) and no nvidia-cudnn
    wheel is listed: a CUDA jaxlib dlopens libcudnn at start and fails without it."""
    names = list(ctx.packages)
    if not ctx.env.none_found("cudnn") or any(n.startswith("nvidia-cudnn") for n in names):
        return []
    return [finding(
        "cudnn-mismatch", "error", "cudnn",
        f"{what} needs cuDNN >= {minimum} (< {minimum.major + 1}), and no cuDNN is installed "
        "here: the CUDA backend fails to initialize and JAX falls back to the CPU",
        fix=f"{row['install'].format(version=info['version'])} (or pip install "
        f"'nvidia-cudnn-cu{row['plugin']}>={minimum}')", row=row,
        cudnn_min=minimum, cudnn_found=[])]


def newest_fix(ctx: Context) -> str | None:
    """The newest JAX build with cubins for every GPU here (never one without code)."""
    def newest(r: Row) -> Version:
        return max(v for _, v, _ in VersionRange.parse(r["jax"]).clauses)
    for r in sorted(ctx.matrix.rows("jax"), key=lambda r: (newest(r), r["plugin"]),
                    reverse=True):
        if r.uncertain or not ctx.known_ccs:
            continue
        if all(reach_row(g.cc, r, ctx.platform)[0] == "cubin" for g in ctx.known_ccs):
            spec = str(VersionRange.parse(r["jax"])).replace(" ", "")
            return f'pip install -U "jax[cuda{r["plugin"]}]{spec}"'
    return None


def _plugin_major(info: dict[str, Any]) -> int | None:
    names = [info.get("plugin") or "", *(info.get("plugins") or [])]
    for name in names:
        for major in (12, 13, 11):
            if f"cuda{major}" in str(name).lower():
                return major
    cuda = (_cuda_of(info, "cuda_runtime") or _cuda_of(info)
            or Version.maybe(jaxlib_tag(str(info.get("jaxlib") or ""))[0]))
    return cuda.major if cuda else None


JAX_CPU_SOURCE = (
    "https://docs.jax.dev/en/latest/installation.html ('CPU-only (Linux/macOS/Windows) pip "
    "install -U jax'; NVIDIA GPU: pip install -U \"jax[cuda13]\" / \"jax[cuda12]\"); "
    "JeffSHF/ColabDock#28 ('a CUDA-enabled jaxlib is not installed. Falling back to cpu')")


def cpu_only(ctx: Context, info: dict[str, Any]) -> bool:
    """Known CPU-only: no CUDA plugin or jaxlib +cuda build among the packages listed (a
    detected snapshot lists every jax-cuda*-plugin it finds), or ``cuda_build: false``."""
    if info.get("cuda_build") is False:
        return True
    if _plugin_major(info) is not None or info.get("plugin") or info.get("plugins"):
        return False
    names = ctx.packages
    if not names or any(re.fullmatch(r"jax-(cuda|rocm)\d+-(plugin|pjrt)", n) for n in names):
        return False  # what is installed is not listed, or a plugin is
    jaxlib = str(info.get("jaxlib") or names.get("jaxlib") or "")
    return bool(jaxlib) and jaxlib_tag(jaxlib)[0] is None


def cpu_finding(ctx: Context, what: str, ver: Version | None) -> list[Finding]:
    """The CPU-only finding with the install of the newest CUDA plugin the driver supports."""
    rows = [r for r in (ctx.matrix.jax_rows(ver) if ver else []) if not r.uncertain]
    have, _ = ctx.driver_cuda
    usable = [r for r in rows if have is None or have.major >= r["plugin"]] or rows
    if usable:
        best = max(usable, key=lambda r: r["plugin"])
        fix = best["install"].format(version=ver)
    else:
        fix = 'pip install -U "jax[cuda13]" (or "jax[cuda12]" with a driver older than R580)'
    return rules_platform.cpu_only(ctx, "jax", what, why=" (no jax-cuda*-plugin and no jaxlib "
                                   "+cuda build is installed)", fix=fix, source=JAX_CPU_SOURCE)
