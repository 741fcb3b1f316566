"""The replay path: what one call of a dispatch site did on the device, recorded once and run
again from C++ for the calls after it (torch CUDA tensors only).

Measured on the H200 and H100 hosts: a dnnctl op called from torch tensors paid 3-5 us of
Python over torch's own op (the site's call, the stream and allocator hand-over, the
kernel's argument lists, the launch), and a training step of ~100 such calls paid that
many times. A site whose kernel only launches kernels (:attr:`replayable` built kernels)
records its second call: the outputs it allocated, its per-call scratch, and every launch's
parameter block with which parameters are addresses into which tensor. From the third call
on, :class:`Program` (``_replay.cpp``) allocates the outputs from torch's caching allocator,
patches the new addresses in and launches on torch's current stream, in one C++ call.

A recording may also hold library calls torch makes (an ATen operator a vendor variant
calls: cuDNN's convolution, a fused attention backend), which the Program calls again,
boxed through torch's dispatcher, before its launches (:func:`note_aten`). A recording that
is not exactly that is refused (:class:`Recorder` says why), and the site keeps its Python
path: a copy, a fill or another library call during the call, an address that belongs to
no tensor of the call or to two (views of one buffer), an empty tensor, a by-value struct
parameter (a TMA descriptor holds addresses), a library result the call copies.

The extension is built in a background thread on first use (the system C++ compiler
against this torch's headers, ~20-60 s), into the cache (``<cache root>/replay/``), keyed by
the source, the interpreter and the torch version; calls take the Python path until it is
there. On by default (:data:`DEFAULT`; ``DNNCTL_REPLAY=0`` turns it off): checked against the
Python path's parameter blocks on the CPU and bitwise against the Python path's results on
the GPU (tests/gpu/test_replay_gpu.py). No compiler or no torch headers: off.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dnnctl.backends import native
from dnnctl.errors import KernelLaunchError
from dnnctl.paths import cache_root

SOURCE = Path(__file__).with_name("_replay.cpp")
NAME = "_dnnctl_replay"
BUILD_SECONDS = 600

_LOCK = threading.Lock()
# the loaded extension's ``signature(arrays)`` (bytes, or None for arrays other than torch
# tensors and Nones): the arrays' part of a dispatch site's key; None until it loads
SIGNATURE: Callable[[tuple[Any, ...]], bytes | None] | None = None
# the loaded extension's ``state(pairs, versions)``: what a captured graph of a model's
# forward depends on (dnnctl.torch.graphs); None until it loads
STATE: Callable[[tuple[Any, ...], bool], bytes] | None = None
_STATE: dict[str, Any] = {}  # "module": the loaded extension / None; "thread": the build


# on unless DNNCTL_REPLAY says otherwise (it passed its GPU tests: see the module doc)
DEFAULT = "1"


def enabled() -> bool:
    return (os.environ.get("DNNCTL_REPLAY", DEFAULT).strip().lower()
            not in ("0", "false", "no", ""))


def module(wait: float | None = 0.0) -> Any | None:
    """The loaded extension, or None: not built yet (the build is started in the background
    on the first ask; ``wait`` seconds are waited for it, None: until it is done), off, or
    impossible here."""
    if "module" in _STATE:
        return _STATE["module"]
    if not enabled():
        return None
    with _LOCK:
        if "module" in _STATE:
            return _STATE["module"]
        thread = _STATE.get("thread")
        if thread is None:
            thread = _STATE["thread"] = threading.Thread(target=_build_and_load, daemon=True,
                                                         name="dnnctl-replay-build")
            thread.start()
    if wait is None or wait > 0:
        thread.join(wait)
    return _STATE.get("module")


def failure() -> str | None:
    """Why the extension is not there (after a build), else None."""
    return _STATE.get("failure")


def describe(wait: float | None = None) -> str:
    """"on", or "off (why)", once the build (started if need be) has had ``wait`` seconds
    (None: until done): what a benchmark reports before it times anything."""
    if module(wait) is not None:
        return "on"
    return f"off ({failure() or 'DNNCTL_REPLAY=0'})"


def failed(rc: int, what: str) -> KernelLaunchError:
    """The error of a replayed call whose launch returned ``rc``."""
    return KernelLaunchError(f"cuLaunchKernel failed in a replayed {what} ({rc})",
                             hint="run 'dnnctl doctor'; an illegal address earlier on this "
                                  "stream also surfaces here; DNNCTL_REPLAY=0 turns replay off")


def _build_and_load() -> None:
    mod, why = None, None
    try:
        path, why = built()
        if path is not None:
            mod, why = _load(path)
    except Exception as exc:  # noqa: BLE001 - the path stays off; the reason is kept
        mod, why = None, f"{type(exc).__name__}: {exc}"
    if mod is not None:
        try:
            from dnnctl.backends import cuda

            mod.set_launch(*cuda.launch_addresses())
        except OSError as exc:  # no libcuda: a Program's launch returns -1 (no CUDA site
            why = f"no CUDA driver: {exc}"  # records one; a test sets its own launcher)
    _STATE["failure"] = why
    _STATE["module"] = mod
    global SIGNATURE, STATE
    if mod is not None:
        SIGNATURE, STATE = mod.signature, mod.state


def _load(path: Path) -> tuple[Any | None, str | None]:
    import torch  # noqa: F401 - libtorch loaded before the extension that links it

    return native.load(NAME, path), None


def _torch_flags() -> tuple[list[str], list[str], str]:
    import torch
    from torch.utils import cpp_extension

    lib = str(Path(torch.__file__).parent / "lib")
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    cflags = [f"-I{p}" for p in cpp_extension.include_paths()]
    cflags += [f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-DTORCH_EXTENSION_NAME={NAME}",
               "-DTORCH_API_INCLUDE_EXTENSION_H"]
    lflags = [f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch", "-ltorch_cpu",
              "-ltorch_python"]
    return cflags, lflags, torch.__version__


def _key(torch_version: str) -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(f"{sys.version}|{sys.platform}|{torch_version}".encode())
    return h.hexdigest()[:16]


def compiler() -> list[str] | None:
    """The C++ compiler command: $CXX, else c++ / g++ / clang++ on PATH."""
    return native.compiler("CXX", ("c++", "g++", "clang++"), None)


def built() -> tuple[Path | None, str | None]:
    """(the extension's path in the cache, compiled now if needed; why not, where None)."""
    try:
        cflags, lflags, version = _torch_flags()
    except ImportError as exc:
        return None, f"torch's C++ headers not found ({exc})"
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    out = cache_root() / "replay" / f"{NAME}-{_key(version)}{suffix}"
    if out.is_file():
        return out, None
    cxx = compiler()
    include = sysconfig.get_paths().get("include")
    if cxx is None:
        return None, "no C++ compiler on PATH (set CXX)"
    if not include or not Path(include, "Python.h").is_file():
        return None, "no Python.h for this interpreter"
    why = native.compile_into(out, lambda tmp: [
        *cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-w", f"-I{include}", *cflags,
        str(SOURCE), "-o", tmp, *lflags], BUILD_SECONDS)
    return (None, why) if why else (out, None)


# ----------------------------------------------------------------------------- programs


def _extent(a: Any) -> tuple[int, int]:
    """(data address, bytes from it to one past the last element) of a torch tensor or a
    CuPy / NumPy-like array (0 bytes for an empty one)."""
    from dnnctl.backends import cuda

    p = cuda.ptr(a)
    shape = tuple(a.shape)
    if any(s == 0 for s in shape):
        return p, 0
    if hasattr(a, "element_size"):  # torch: strides in elements
        item = a.element_size()
        strides = [s * item for s in a.stride()]
    else:
        item = a.itemsize
        strides = list(a.strides)
    last = sum((s - 1) * abs(st) for s, st in zip(shape, strides, strict=True))
    return p, last + item


class Unreplayable(Exception):
    """Why a recorded call cannot become a :class:`Program`."""


class AtenCall:
    """A library call a recorded call made through torch (an ATen operator: cuDNN's
    convolution, a fused attention backend), as it ran: the operator (an OpOverload), its
    arguments in the schema's order (keywords and defaults filled in) and its returns."""

    __slots__ = ("name", "overload", "args", "returns")

    def __init__(self, op: Any, args: Sequence[Any], kwargs: dict[str, Any],
                 result: Any) -> None:
        schema = op._schema
        self.name, self.overload = schema.name, schema.overload_name
        full = []
        for i, a in enumerate(schema.arguments):
            if i < len(args):
                full.append(args[i])
            elif a.name in kwargs:
                full.append(kwargs[a.name])
            elif a.has_default_value():
                full.append(a.default_value)
            else:
                raise Unreplayable(f"{schema.name}: argument {a.name!r} not given")
        self.args = full
        self.returns = tuple(result) if isinstance(result, (tuple, list)) else (result,)


def note_aten(op: Any, args: Sequence[Any], kwargs: dict[str, Any], result: Any) -> None:
    """Put a call of the ATen operator ``op`` (an OpOverload) with ``args`` / ``kwargs``,
    which returned ``result``, into the call's recording, if one is on (in order with its
    launches: a vendor variant calls this right after the library's call)."""
    from dnnctl.backends import cuda

    rec = cuda.STATE.rec
    if rec is None:
        return
    try:
        step = AtenCall(op, args, kwargs, result)
    except Unreplayable as why:
        rec.refuse(str(why))
        return
    rec.launches.append((step, None))


def _view(t: Any, base: Any) -> Any:
    """How ``t`` reads ``base``'s memory: None (it is ``base``), (sizes, strides, storage
    offset past base's); raise Unreplayable where it is no view of base."""
    if t is base or (t.shape == base.shape and t.stride() == base.stride()
                     and t.storage_offset() == base.storage_offset()
                     and t.data_ptr() == base.data_ptr()):
        return None
    if t.untyped_storage().data_ptr() != base.untyped_storage().data_ptr():
        raise Unreplayable("a torch step's tensor is no view of the call's")
    return (list(t.shape), list(t.stride()), t.storage_offset() - base.storage_offset())


def _torch_step(step: AtenCall, slots: Sequence[Any], made: dict[int, Any]) -> tuple:
    """The Program's tuple of a recorded ATen call: each tensor argument by its slot (and
    view), other arguments as constants; each made output (``made``: slot -> tensor) that
    is a view of one of its returns, by that return. Made outputs it fills are popped."""
    import torch

    args = []
    for a in step.args:
        if isinstance(a, torch.Tensor):
            k = _slot_of(a, slots)
            args.append(("t", k, _view(a, slots[k])))
        elif isinstance(a, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in a):
            raise Unreplayable(f"{step.name}: a list of tensors")
        else:
            args.append(("v", a))
    outs = []
    for k, t in list(made.items()):
        for r, ret in enumerate(step.returns):
            if (isinstance(ret, torch.Tensor) and ret.numel()
                    and ret.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()):
                outs.append((r, k, _view(t, ret), list(ret.shape), list(ret.stride())))
                del made[k]
                break
    return ("aten", step.name, step.overload, args, outs)


def _slot_of(t: Any, slots: Sequence[Any]) -> int:
    """The slot whose tensor ``t`` is, or a view of (the same storage, its data inside)."""
    for k, a in enumerate(slots):
        if a is t:
            return k
    p = t.data_ptr()
    storage = t.untyped_storage().data_ptr()
    for k, a in enumerate(slots):
        if (a is not None and hasattr(a, "untyped_storage")
                and a.untyped_storage().data_ptr() == storage):
            b, n = _extent(a)
            if b <= p < b + max(n, 1):
                return k
    raise Unreplayable("a torch step reads a tensor that is not the call's")


def program(mod: Any, arrays: Sequence[Any], outs: Sequence[Any], kept: Sequence[Any],
            rec: Any, result: Sequence[int], tuple_result: bool,
            adopted: bool = False) -> Any:
    """The extension's Program for a recorded call.

    ``arrays``: the call's tensors (None where absent), slots 0..; ``outs``: the outputs the
    site allocated (torch tensors), the slots after them (``adopted``: the kernel's own
    results instead, each of which a recorded torch step must have made); ``kept``: arrays
    that outlive the site's calls (its constants): their addresses stay as recorded;
    ``rec``: the :class:`~dnnctl.backends.cuda.Recorder` of the call; ``result``: the slot
    of each returned value (-1: None)."""
    from dnnctl.backends import cuda

    if rec.foreign:
        raise Unreplayable(rec.foreign)
    if not rec.launches:
        raise Unreplayable("no launch")
    # an adopted output is a library's result: made by a recorded ATen call (matched to its
    # return below; the extension refuses a torch step after a launch and a made output no
    # step makes)
    made = list(range(len(outs))) if adopted else []
    pending = {len(arrays) + j: outs[j] for j in made}
    temps = rec.temps
    ranges: list[tuple[int, int, int]] = []  # (start, end, slot)
    align = []
    device = None
    for i, a in enumerate(arrays):
        if a is None:
            align.append(0)
            continue
        if not hasattr(a, "data_ptr") or not getattr(a, "is_cuda", False):
            raise Unreplayable("an argument is not a torch CUDA tensor")
        device = device or a.device
        p, n = _extent(a)
        if n == 0:
            raise Unreplayable("an empty tensor")
        ranges.append((p, p + n, i))
        align.append(_align_class(p))
    for j, t in enumerate((*outs, *temps)):
        p, n = _extent(t)
        if n == 0:
            raise Unreplayable("an empty output")
        ranges.append((p, p + n, len(arrays) + j))
    fixed = [_extent(k) for k in kept if k is not None] + list(cuda.KEPT)
    steps = []
    slots = [*arrays, *outs, *temps]
    for launch, args in rec.launches:
        if isinstance(launch, AtenCall):
            steps.append(_torch_step(launch, slots, pending))
            continue
        block, offsets, kinds = cuda.param_layout(args)
        if launch.handle is None:
            raise Unreplayable("a launch with no CUfunction (the CPU emulator)")
        patches = []
        for k, (a, kind) in enumerate(zip(args, kinds, strict=True)):
            if kind == "S":
                raise Unreplayable("a by-value struct parameter")
            if kind not in ("P", "q", "Q"):
                continue
            v = int(cuda.ptr(a)) if kind == "P" else int(a)
            if v == 0:
                continue
            hits = [(s, v - b) for b, e, s in ranges if b <= v < e]
            if len(hits) > 1:  # (views of one buffer, q / k / v of a packed projection:
                # which one a launch reads cannot be told from its address)
                raise Unreplayable(f"parameter {k} of a launch is an address inside "
                                   f"tensors {hits[0][0]} and {hits[1][0]}")
            slot = hits[0] if hits else None
            if slot is None:
                if any(b <= v < b + max(n, 1) for b, n in fixed):
                    continue  # a constant of the site: the same address every call
                if kind == "P":
                    raise Unreplayable(f"parameter {k} of a launch is an address of no "
                                       "tensor of the call")
                continue  # an integer that is no address we know
            patches.append((offsets[k], slot[0], slot[1]))
        steps.append((int(launch.handle), list(launch._dims), bool(launch.cooperative),
                      bytes(block), list(offsets), patches))
    import torch

    templates = [torch.empty(0, dtype=o.dtype, device=o.device) for o in outs]
    sizes = [list(o.shape) for o in outs]
    strides = [list(o.stride()) for o in outs]
    if device is None:
        raise Unreplayable("no tensor argument")
    try:
        return mod.Program(len(arrays), align, templates, sizes, strides,
                           [max(1, _extent(t)[1]) for t in temps], steps, list(result),
                           bool(tuple_result), _DEVICE_TYPES[device.type],
                           -1 if device.type == "cpu" else device.index or 0, made)
    except ValueError as exc:  # the extension's own checks of the recording
        raise Unreplayable(str(exc)) from None


_DEVICE_TYPES = {"cpu": 0, "cuda": 1}  # c10::DeviceType


# the coarsest alignment a replayable kernel decides by (VecKernel: its vector's bytes,
# <= 16): a later call's address need only match the recorded one up to this
ALIGN = 16


def _align_class(p: int) -> int:
    """The largest power of two up to :data:`ALIGN` that divides the address."""
    if p == 0:
        return ALIGN
    a = 1
    while a < ALIGN and p % (2 * a) == 0:
        a *= 2
    return a
