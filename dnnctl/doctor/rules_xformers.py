"""xformers against the torch installed beside it.

An xformers wheel is built against one torch release and one CUDA variant of it (the
download.pytorch.org/whl/cuXXX index it comes from): the wheel pins ``torch==X`` and its
``xformers/cpp_lib.json`` records the ``torch.__version__`` of the build ("2.6.0+cu124"),
which ``python -m xformers.info`` and the load error print ("xFormers was built for: PyTorch
2.6.0+cu124 with CUDA 1204 (you have 2.6.0+cu126)"). Loaded beside another torch, or another
CUDA variant of it, its C++/CUDA extensions do not load and its operators are missing. From
0.0.34 the builds use torch's stable ABI: a later torch release of the same CUDA major loads
them too. Without ``cpp_lib.json`` the release's pin comes from the matrix (table
``xformers``), which cannot tell the CUDA variant.
"""

from __future__ import annotations

from dnnctl.compat.schema import Row
from dnnctl.compat.versions import TorchVersion, Version
from dnnctl.doctor import rules_cpu_torch, stack
from dnnctl.doctor.context import Context, cite, finding
from dnnctl.doctor.model import Finding
from dnnctl.errors import UsageError

SOURCE = (
    "facebookresearch/xformers: setup.py (cpp_lib.json records version.torch = the build's "
    "torch.__version__, version.cuda), xformers/_cpp_lib.py ('xFormers was built for: PyTorch "
    "{torch_version} with CUDA {cuda_version} (you have {torch.__version__})'), "
    ".github/workflows/wheels_build.yml 2023-10 to 2026-02 ('echo \"torch == ${{ "
    "inputs.torch_version }}\" >> ./requirements.txt': each wheel pins one torch), CHANGELOG "
    "0.0.34 (stable ABI: 'compatible with any later version'), README (pip3 install -U xformers "
    "--index-url https://download.pytorch.org/whl/cu126)")
INDEX = "https://download.pytorch.org/whl/{tag}"
# a source build against the torch installed (README: "Install from source ... with another
# version of PyTorch"; its sdist on PyPI, so the command fits 80 columns); needs nvcc
SOURCE_BUILD = "pip install --no-build-isolation --no-binary xformers xformers"


def _installed(ctx: Context) -> dict[str, str] | None:
    """The xformers entry: frameworks.xformers, else one made from ``packages``."""
    fw = (ctx.env.frameworks or {}).get("xformers")
    if fw is not None:
        return {k: str(v) for k, v in fw.items() if v is not None}
    packages = ctx.packages
    return {"version": packages["xformers"]} if "xformers" in packages else None


def _torch(ctx: Context) -> TorchVersion | None:
    found = stack.torch_version(ctx)
    if found is None:
        return None
    ver, info = found
    return TorchVersion(ver.release, stack.torch_variant(ctx, info, ver), ver.text)


def _row(ctx: Context, version: str) -> Row | None:
    text = version.split("+")[0].strip().lower()
    return next((r for r in ctx.matrix.rows("xformers") if r["xformers"].lower() == text
                 and not r.uncertain), None)


def check(ctx: Context) -> list[Finding]:
    """xformers' build torch (cpp_lib.json, else its release's pin) against torch here."""
    info = _installed(ctx)
    if info is None:
        return []
    version = info.get("version") or ""
    what = f"xformers {version}" if version else "xformers (version unknown)"
    cpu = _cpu_build(ctx)
    if cpu is not None:
        return [cpu]
    row = _row(ctx, version) if version else None
    built_text = info.get("torch") or (str(row["torch"]) if row is not None else None)
    torch = _torch(ctx)
    if built_text is None or torch is None:
        missing = "the torch it was built for" if built_text is None else "torch's version"
        return [finding("not-judged", "info", "xformers",
                        f"{what}: {missing} is not known, so whether its C++/CUDA extensions "
                        "load is not judged (each xformers wheel is built for one torch)",
                        fix="`python -m xformers.info` prints the torch it was built for",
                        source=SOURCE)]
    try:
        built = TorchVersion.parse(built_text)
    except UsageError:
        return [finding("not-judged", "info", "xformers", f"{what}: the torch it was built "
                        f"for ({built_text!r}) could not be read", source=SOURCE)]
    later = bool(row is not None and row.get("later_torch")) or _stable_abi(version)
    problem = _mismatch(built, torch, later)
    ev = {"built_for": built.text, "torch": _show(torch), "xformers": version or None}
    cited = SOURCE + (f"; {cite(row)}" if row else "")
    if problem is None:
        tag_note = "" if built.local else " (its CUDA variant was not compared)"
        return [finding("ok", "info", "xformers", f"{what} was built for torch {built.text}, "
                        f"which loads with torch {_show(torch)}{tag_note}", source=cited, **ev)]
    return [finding(
        "cuda-mismatch", "error", "xformers",
        f"{what} was built for torch {built.text}, but torch {_show(torch)} is installed "
        f"({problem}): its C++/CUDA extensions do not load ('xFormers can't load C++/CUDA "
        f"extensions. xFormers was built for: PyTorch {built.text} ... (you have "
        f"{torch.text})') and its operators are missing ('No operator found for "
        "memory_efficient_attention_forward')",
        fix=_fix(ctx, torch), source=cited, **ev)]


def _cpu_build(ctx: Context) -> Finding | None:
    """A CUDA xformers beside a CPU-only torch: its extensions do not load, whatever the
    releases; the fix is the CUDA torch it was built for (rules_cpu_torch)."""
    info = stack.torch_info(ctx, packages=True) or {}
    text = str(info.get("version") or "")
    local = str(info.get("local_tag") or (text.split("+", 1)[1] if "+" in text else ""))
    if local.lower() != "cpu" and info.get("cuda_build") is not False:
        return None
    addons = [a for a in rules_cpu_torch.cuda_addons(ctx) if a.text.startswith("xformers")]
    if not addons:
        return None
    try:
        ver = TorchVersion.parse(text) if text else None
    except UsageError:
        ver = None
    what = f"torch {text}" if text else "torch (version unknown)"
    found = rules_cpu_torch.addon_finding(ctx, what, ver, addons, None, component="xformers")
    found.message = (f"{addons[0].text} is a CUDA build, but {what} is a CPU-only build: "
                     "its C++/CUDA extensions do not load ('xFormers can't load C++/CUDA "
                     "extensions') and its operators are missing, so it cannot use the GPU")
    return found


def _stable_abi(version: str) -> bool:
    """xformers 0.0.34 and later build against torch's stable ABI."""
    v = Version.maybe(version)
    return v is not None and v >= Version.parse("0.0.34")


def _show(torch: TorchVersion) -> str:
    release = str(torch.release)
    return f"{release}+{torch.local}" if torch.local else release


def _mismatch(built: TorchVersion, torch: TorchVersion, later: bool) -> str | None:
    """Why ``torch`` cannot load an xformers built for ``built``; None when it can."""
    if later:
        if torch.release < built.release:
            return f"it needs torch {built.release} or later"
    elif torch.release.trunc(3) != built.release.trunc(3):
        return "another torch release"
    tags = (built.local or "", torch.local or "")
    if all(t.startswith("cu") for t in tags):
        b, t = built.cuda, torch.cuda
        if later and b is not None and t is not None and b.major != t.major:
            return f"CUDA {b.major} against CUDA {t.major}"
        if not later and tags[0] != tags[1]:
            return f"the {tags[0]} build against the {tags[1]} one"
    return None


def _fix(ctx: Context, torch: TorchVersion) -> str:
    """The xformers release pinned to this torch, from the same index as torch."""
    fits = [r for r in ctx.matrix.rows("xformers") if not r.uncertain and (
        Version.parse(r["torch"]).trunc(3) == torch.release.trunc(3)
        or (r.get("later_torch") and torch.release >= Version.parse(r["torch"])))]
    index = INDEX.format(tag=torch.local) if (torch.local or "").startswith("cu") else None
    where = f" -i {index}" if index else ""  # -i: --index-url (the command fits 80 columns)
    if fits:
        pick = max(fits, key=lambda r: Version.parse(r["xformers"]))
        return (f"`pip install xformers=={pick['xformers']}{where}` (the release built for "
                f"torch {pick['torch']}{', from the same index as torch' if index else ''})")
    if index:
        return (f"install xformers from the same index as torch: `pip install -U xformers"
                f"{where}`, or build it against this torch (a CUDA toolkit needed): "
                f"`{SOURCE_BUILD}`")
    return f"build xformers against this torch (a CUDA toolkit needed): `{SOURCE_BUILD}`"
