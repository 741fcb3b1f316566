"""The scripts ``doctor --deep`` runs, one per framework, each in its own interpreter.

Each prints one line ``DNNCTL_JSON {...}`` (MARK) with what the framework says about itself;
errors are collected under ``errors`` instead of raised. The torch script also runs the live
checks on a GPU host (cuDNN loaded, SDPA backends, a one-op launch per GPU) into ``live``.
"""

from __future__ import annotations

MARK = "DNNCTL_JSON "

_PRELUDE = r"""
import importlib, json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # a probe, not a job
out = {}
def err(key, e):
    out.setdefault("errors", {})[key] = "%s: %s" % (type(e).__name__, e)
def done():
    print("DNNCTL_JSON " + json.dumps(out, default=str), flush=True)
def need(name):
    try:
        return importlib.import_module(name)
    except Exception as e:
        err("import", e); done(); sys.exit(0)
"""

SCRIPTS = {
    "torch": _PRELUDE + r"""
torch = need("torch")
out["version"] = str(torch.__version__)
out["cuda"] = torch.version.cuda
try:
    flags = getattr(torch._C, "_cuda_getArchFlags", lambda: None)()
    out["arch_list"] = flags.split() if flags else torch.cuda.get_arch_list()
except Exception as e:
    err("arch_list", e)
try:
    out["cudnn_compiled"] = list(torch._C._cudnn.getCompileVersion())
except Exception:
    pass
abi = getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", None)
if isinstance(abi, bool):
    out["cxx11_abi"] = abi
try:
    out["cudnn"] = torch.backends.cudnn.version()
except Exception as e:
    err("cudnn", e)
try:
    with open("/proc/self/maps") as fh:
        out["cudnn_libs"] = sorted({l.split()[-1] for l in fh if "/libcudnn" in l})
except OSError:
    pass
try:
    out["cuda_available"] = bool(torch.cuda.is_available())
    if out["cuda_available"]:
        out["device_count"] = torch.cuda.device_count()
        out["capability"] = list(torch.cuda.get_device_capability(0))
except Exception as e:
    err("cuda", e)
def short(e):
    return ("%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip()
                        else ""))[:300]
if out.get("cuda_available"):
    live = {"torch": out["version"], "launch": {}, "sdpa": {}}
    try:
        live["cudnn"] = torch.backends.cudnn.version()
        with open("/proc/self/maps") as fh:
            libs = sorted({l.split()[-1] for l in fh if "/libcudnn.so" in l})
        if libs:
            live["cudnn_library"] = libs[0]
    except Exception as e:
        live["cudnn_error"] = short(e)
    for i in range(out.get("device_count") or 0):
        try:
            y = (torch.ones(8, device="cuda:%d" % i) + 1).sum().item()
            live["launch"][str(i)] = "ok" if y == 16.0 else "wrong result %r" % y
        except Exception as e:
            live["launch"][str(i)] = short(e)
    try:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(1, 2, 16, 64, device="cuda", dtype=torch.bfloat16, generator=g)
        ref = F.scaled_dot_product_attention(q.float(), q.float(), q.float())
        for name, attr in (("flash", "FLASH_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION"),
                           ("cudnn", "CUDNN_ATTENTION")):
            be = getattr(SDPBackend, attr, None)
            if be is None:
                live["sdpa"][name] = "unsupported: this torch has no %s backend" % attr
                continue
            try:
                with sdpa_kernel([be]):
                    o = F.scaled_dot_product_attention(q, q, q)
                torch.cuda.synchronize()
                e = (o.float() - ref).abs().max().item()
                live["sdpa"][name] = "ok" if e < 0.05 else "wrong result (max error %.3g)" % e
            except Exception as e:
                m = short(e)
                live["sdpa"][name] = ("unsupported: " + m) if "No available kernel" in m else m
    except Exception as e:
        live["error"] = "SDPA: " + short(e)
        for name in ("flash", "efficient", "cudnn"):
            live["sdpa"].setdefault(name, "not run: " + short(e))
    out["live"] = live
done()
""",
    "cupy": _PRELUDE + r"""
cupy = need("cupy")
runtime = cupy.cuda.runtime
out["version"] = cupy.__version__
for key, fn in (("runtime", runtime.runtimeGetVersion),
                ("local_runtime", cupy.cuda.get_local_runtime_version),
                ("driver", runtime.driverGetVersion),
                ("device_count", runtime.getDeviceCount)):
    try:
        out[key] = fn()
    except Exception as e:
        err(key, e)
try:
    from cupy.cuda import nvrtc
    out["nvrtc"] = list(nvrtc.getVersion())
except Exception as e:
    err("nvrtc", e)
done()
""",
    "tensorflow": _PRELUDE + r"""
tf = need("tensorflow")
out["version"] = tf.__version__
try:
    info = dict(tf.sysconfig.get_build_info())
    out.update(cuda=info.get("cuda_version"), cudnn=info.get("cudnn_version"),
               arch_list=info.get("cuda_compute_capabilities"),
               cuda_build=info.get("is_cuda_build"))
except Exception as e:
    err("build_info", e)
try:
    out["gpus_visible"] = len(tf.config.list_physical_devices("GPU"))
except Exception as e:
    err("gpus", e)
done()
""",
    "jax": _PRELUDE + r"""
jax = need("jax")
jaxlib = need("jaxlib")
out["version"] = jax.__version__
out["jaxlib"] = getattr(jaxlib, "__version__", None)
try:
    from jax._src.lib import cuda_versions
    for key in ("cuda_runtime_get_version", "cuda_runtime_build_version",
                "cudnn_get_version", "cudnn_build_version", "cuda_driver_get_version"):
        fn = getattr(cuda_versions, key, None) if cuda_versions else None
        if fn is not None:
            try:
                out[key] = fn()
            except Exception as e:
                err(key, e)
except Exception as e:
    err("cuda_versions", e)
try:
    out["backend"] = jax.default_backend()
    out["devices"] = [str(d) for d in jax.devices()]
except Exception as e:
    err("devices", e)
done()
""",
}
