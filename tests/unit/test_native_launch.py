"""The native launch path (dnnctl/backends/_native.c): built with this machine's C compiler,
fed a C function that stands in for cuLaunchKernel and records the parameter block."""

from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest

from dnnctl.backends import cuda, native

LAUNCH_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *(ctypes.c_uint,) * 7,
                            ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


@pytest.fixture(scope="module")
def mod(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("DNNCTL_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    native.module.cache_clear()
    try:
        m = native.module()
    finally:
        native.module.cache_clear()
        mp.undo()
    if m is None:
        pytest.skip("no C compiler or Python headers on this machine")
    return m


class Recorder:
    """A C-callable stand-in for cuLaunchKernel: keeps the last call's slots."""

    def __init__(self, nargs: int, rc: int = 0) -> None:
        self.nargs, self.rc, self.calls = nargs, rc, []
        self.fn = LAUNCH_T(self._launch)  # kept alive with the recorder

    def _launch(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        slots = [ctypes.string_at(params[i], 8) for i in range(self.nargs)]
        self.calls.append(((f, gx, gy, gz, bx, by, bz, smem, stream or 0), slots))
        return self.rc

    @property
    def address(self) -> int:
        return ctypes.cast(self.fn, ctypes.c_void_p).value


def test_launch_packs_every_kind_of_argument(mod):
    torch = pytest.importorskip("torch")
    t = torch.arange(8, dtype=torch.float32)
    arr = np.zeros(4, np.float32)
    args = [t, None, 0x1234, arr, np.int32(-7), np.uint32(9), np.int64(-3), np.float32(1.5),
            np.float64(2.25), np.int16(-2), np.uint8(250)]
    rec = Recorder(len(args))
    mod.set_launch(rec.address, cuda.ptr)
    kinds = cuda._kinds(args)
    assert kinds == b"PPPPiIqfdhB"
    rc = mod.launch(0xABC, 2, 3, 4, 128, 1, 1, 4096, 77, kinds, args)
    assert rc == 0
    head, slots = rec.calls[-1]
    assert head == (0xABC, 2, 3, 4, 128, 1, 1, 4096, 77)
    q = [struct.unpack("<Q", s)[0] for s in slots]
    assert q[0] == t.data_ptr() and q[1] == 0 and q[2] == 0x1234
    assert q[3] == arr.__array_interface__["data"][0]  # through the Python fallback
    assert struct.unpack("<i", slots[4][:4])[0] == -7
    assert struct.unpack("<I", slots[5][:4])[0] == 9
    assert struct.unpack("<q", slots[6])[0] == -3
    assert struct.unpack("<f", slots[7][:4])[0] == 1.5
    assert struct.unpack("<d", slots[8])[0] == 2.25
    assert struct.unpack("<h", slots[9][:2])[0] == -2
    assert slots[10][0] == 250


def test_launch_returns_the_driver_status_and_refuses_bad_calls(mod):
    rec = Recorder(1, rc=700)
    mod.set_launch(rec.address, cuda.ptr)
    assert mod.launch(1, 1, 1, 1, 1, 1, 1, 0, 0, b"P", [None]) == 700
    with pytest.raises(ValueError, match="arguments for"):
        mod.launch(1, 1, 1, 1, 1, 1, 1, 0, 0, b"PP", [None])
    with pytest.raises(TypeError):
        mod.launch(1, 1, 1, 1, 1, 1, 1, 0, 0, b"i", [object()])
    with pytest.raises(TypeError):
        mod.launch(1, 1, 1)


COOP_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *(ctypes.c_uint,) * 7,
                          ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))


def test_a_cooperative_launch_calls_the_cooperative_entry(mod, monkeypatch):
    """launch(..., True) goes to cuLaunchCooperativeKernel (no ``extra`` argument), the
    plain launch still to cuLaunchKernel; a Launch made cooperative takes that path, and
    without the cooperative entry the call is refused rather than launched plainly."""
    plain = Recorder(1)
    coop_calls = []

    def coop(f, gx, gy, gz, bx, by, bz, smem, stream, params):
        coop_calls.append((f, gx, bx, smem, stream or 0, ctypes.string_at(params[0], 8)))
        return 0

    cfn = COOP_T(coop)
    mod.set_launch(plain.address, cuda.ptr, ctypes.cast(cfn, ctypes.c_void_p).value)
    assert mod.launch(7, 3, 1, 1, 64, 1, 1, 512, 9, b"q", [np.int64(11)], True) == 0
    assert coop_calls == [(7, 3, 64, 512, 9, struct.pack("<q", 11))] and not plain.calls
    assert mod.launch(7, 3, 1, 1, 64, 1, 1, 512, 9, b"q", [np.int64(12)], False) == 0
    assert len(plain.calls) == 1 and len(coop_calls) == 1
    monkeypatch.setattr(cuda, "_NATIVE", mod)
    monkeypatch.setattr(cuda.STATE, "stream", 5, raising=False)
    launch = cuda.Launch(lambda *a, **k: None, (4,), (128,), 0, cooperative=True)
    launch.handle = 0x42
    launch([np.int64(13)])
    assert coop_calls[-1][:2] == (0x42, 4) and coop_calls[-1][4] == 5
    mod.set_launch(plain.address, cuda.ptr)  # no cooperative entry
    with pytest.raises(RuntimeError, match="cuLaunchCooperativeKernel"):
        mod.launch(7, 3, 1, 1, 64, 1, 1, 512, 9, b"q", [np.int64(11)], True)


def test_call_ints_passes_23_integer_arguments(mod):
    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *(ctypes.c_int,) * 9,
                             ctypes.c_longlong, *(ctypes.c_int,) * 12)
    seen = []

    def fn(*a):
        seen.append(a)
        return 5

    cfn = proto(fn)
    addr = ctypes.cast(cfn, ctypes.c_void_p).value
    args = [0xDEAD, 1, 0, 64, 32, 16, 999, 0xBEEF, 2, 64, 1 << 40, 7, 8, 9, 10, 11, 12, 13,
            14, 15, 16, 17, -1]
    assert mod.call_ints(addr, *args) == 5
    got = seen[-1]
    assert got[0] == 0xDEAD and got[10] == 1 << 40 and got[-1] == -1
    assert list(got[1:10]) == args[1:10] and list(got[11:22]) == args[11:22]


def test_launch_objects_take_the_native_path_and_fall_back_on_a_changed_kind(mod, monkeypatch):
    torch = pytest.importorskip("torch")
    rec = Recorder(3)
    mod.set_launch(rec.address, cuda.ptr)
    monkeypatch.setattr(cuda, "_NATIVE", mod)
    monkeypatch.setattr(cuda.STATE, "stream", 5, raising=False)
    launch = cuda.Launch(lambda *a, **k: None, (4,), (256,), 0)
    launch.handle = 0x42  # as if loaded from a module: launches go to the driver entry
    x = torch.ones(4)
    launch([x, np.int32(3), np.float32(0.5)])
    head, slots = rec.calls[-1]
    assert head[0] == 0x42 and head[1] == 4 and head[4] == 256 and head[8] == 5
    assert struct.unpack("<Q", slots[0])[0] == x.data_ptr()
    assert launch.kinds == b"Pif"
    # an argument of another kind: this call goes through ctypes, the kinds are learnt again
    via_ctypes = []
    monkeypatch.setattr(cuda, "_LAUNCH", lambda *a: via_ctypes.append(a) or 0)
    launch([x, np.int32(3), torch.ones(2)])
    assert launch.kinds is None and len(via_ctypes) == 1 and len(rec.calls) == 1
    launch([x, np.int32(4), np.float32(0.25)])
    assert launch.kinds == b"Pif" and len(rec.calls) == 2


def test_no_native_module_without_opt_in(monkeypatch):
    monkeypatch.setenv("DNNCTL_NATIVE", "0")
    native.module.cache_clear()
    try:
        assert native.module() is None
    finally:
        native.module.cache_clear()


def test_a_by_value_struct_takes_the_ctypes_path(mod, monkeypatch):
    rec = Recorder(2)
    mod.set_launch(rec.address, cuda.ptr)
    monkeypatch.setattr(cuda, "_NATIVE", mod)
    via_ctypes = []
    monkeypatch.setattr(cuda, "_LAUNCH", lambda *a: via_ctypes.append(a) or 0)
    launch = cuda.Launch(lambda *a, **k: None, (1,), (128,), 0)
    launch.handle = 0x42
    tensor_map = bytes(range(128))
    launch([tensor_map, 7])
    launch([tensor_map, 8])
    assert launch.kinds == b"" and len(via_ctypes) == 2 and rec.calls == []
