#!/usr/bin/env bash
# Collect canned outputs of a real GPU server for doctor's probe tests. Writes into $1.
out=${1:-/tmp/facts}; mkdir -p "$out"
{ nvidia-smi; } > "$out/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version,uuid --format=csv,noheader > "$out/nvidia-smi-query.csv" 2>&1
cat /proc/driver/nvidia/version > "$out/proc-driver-nvidia-version.txt" 2>&1
cat /sys/module/nvidia/version > "$out/sys-module-nvidia-version.txt" 2>&1
ldconfig -p > "$out/ldconfig-p.txt" 2>&1
nvcc --version > "$out/nvcc-version.txt" 2>&1
ls -la /usr/local/ > "$out/usr-local.txt" 2>&1
for f in /usr/local/cuda*/version.json; do echo "== $f"; cat "$f"; done > "$out/cuda-version-json.txt" 2>&1
ls -la /dev/nvidia* > "$out/dev-nvidia.txt" 2>&1
env | grep -E "^(LD_LIBRARY_PATH|CUDA|PATH|CONDA|NVIDIA|VIRTUAL_ENV)" > "$out/env.txt" 2>&1
python3 - > "$out/python-meta.txt" 2>&1 <<'PY'
import importlib.metadata as md, sys, os, glob, json
print("python", sys.version, sys.executable, sys.prefix)
names = sorted({d.metadata["Name"] for d in md.distributions()})
for n in names:
    if any(k in n.lower() for k in ("torch", "nvidia", "cupy", "jax", "tensorflow", "cuda", "triton")):
        d = md.distribution(n)
        print("DIST", n, d.version, d.locate_file(""))
        if n.lower() == "torch":
            print("REQUIRES", json.dumps(d.requires))
import importlib.util
spec = importlib.util.find_spec("torch")
if spec:
    p = os.path.join(spec.submodule_search_locations[0], "version.py")
    print("== torch/version.py"); print(open(p).read())
    print("torch/lib:", sorted(os.listdir(os.path.join(spec.submodule_search_locations[0], "lib")))[:80])
for base in sys.path:
    for g in glob.glob(os.path.join(base, "nvidia", "*", "lib", "*")):
        print("NVLIB", g)
PY
python3 -c "import torch, json; print(json.dumps({'v': torch.__version__, 'cuda': torch.version.cuda, 'cudnn': torch.backends.cudnn.version(), 'arch': torch.cuda.get_arch_list(), 'cap': torch.cuda.get_device_capability()}))" > "$out/torch-deep.json" 2>&1
python3 -c "import cupy, json; print(json.dumps({'v': cupy.__version__, 'rt': cupy.cuda.runtime.runtimeGetVersion(), 'drv': cupy.cuda.runtime.driverGetVersion(), 'local': cupy.cuda.get_local_runtime_version()}))" > "$out/cupy-deep.json" 2>&1
python3 -c "
import pynvml as n; n.nvmlInit(); print(n.nvmlSystemGetDriverVersion(), n.nvmlSystemGetCudaDriverVersion_v2()); h=n.nvmlDeviceGetHandleByIndex(0); print(n.nvmlDeviceGetName(h), n.nvmlDeviceGetCudaComputeCapability(h), n.nvmlDeviceGetMemoryInfo(h).total)" > "$out/nvml.txt" 2>&1
python3 - > "$out/cudnn-ctypes.txt" 2>&1 <<'PY'
import ctypes, glob, sys, os
for base in sys.path:
    for g in glob.glob(os.path.join(base, "nvidia", "*", "lib", "libcudnn.so*")) + glob.glob(os.path.join(base, "nvidia", "cudnn", "lib", "libcudnn.so*")):
        try:
            lib = ctypes.CDLL(g); lib.cudnnGetVersion.restype = ctypes.c_size_t
            print(g, lib.cudnnGetVersion())
        except OSError as e:
            print(g, "ERR", e)
PY
