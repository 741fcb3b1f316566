"""The data doctor passes around: the environment snapshot and the findings.

``EnvSnapshot`` mirrors the ``dnnctl-env/1`` file (DESIGN.md); every field may be absent,
and absent means unknown. ``Finding`` is one judgement with its fix and its source.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

ENV_SCHEMA = "dnnctl-env/1"
DOCTOR_SCHEMA = "dnnctl-doctor/1"

SEVERITIES = ("error", "warning", "info")
ENV_ORDER = ("schema", "os", "python", "driver", "gpus", "environment", "toolchain", "system",
             "cuda_runtimes", "cudnn", "libraries", "frameworks", "extensions", "live", "packages",
             "requires", "errors", "notes")
SEARCHED = ("cuda_runtimes", "cudnn")  # lists whose explicit [] means "none installed"
# other libraries whose copies and load order are judged, and ptxas: the assembler a JIT
# compiler runs (Triton's bundled copy or TRITON_PTXAS_PATH, the one XLA finds), by CUDA release
LIBRARIES = ("cublas", "nccl", "nvjitlink", "nvrtc", "ptxas")

# Finding codes (DESIGN.md lists the required ones; rules may add more, documented here).
CODES = {
    "no-driver": "no NVIDIA driver is loaded or reachable",
    "no-gpu": "the driver sees no GPU",
    "driver-too-old": "the driver is older than a CUDA runtime / build needs",
    "driver-mvc": "runs only through minor-version compatibility (PTX JIT may fail)",
    "driver-mismatch": "kernel module and user-space driver library versions differ",
    "arch-unsupported": "a build has neither cubins nor reachable PTX for the GPU",
    "arch-ptx-jit": "the GPU is reached only by JIT-compiling PTX (slow first start)",
    "cuda-mismatch": "CUDA runtimes / builds disagree in a way that breaks loading",
    "cudnn-mismatch": "the cuDNN a framework loads is not the one it needs",
    "cudnn-shadowed": "a system cuDNN on LD_LIBRARY_PATH shadows a bundled one",
    "build-mismatch": "a compiled extension (flash-attn, PyG's extension wheels, dgl) was "
                      "built against another torch (minor, CUDA or C++ ABI) than the one "
                      "installed, or is a CPU build beside a CUDA torch",
    "duplicate-package": "two installs of the same thing conflict (e.g. two cupy-cuda*)",
    "libcuda-stub": "the libcuda the loader finds first is the CUDA toolkit's link-time stub "
                    "(CUDA_ERROR_STUB_LIBRARY, 34)",
    "dll-dependency": "a library release loads a DLL nothing installs with it (cuDNN 8.3-8.9's "
                      "zlibwapi.dll on Windows); said where its presence is not known",
    "unknown-version": "the matrix has no row for a version: not judged, never guessed",
    "forward-compat": "needs the cuda-compat package (data-center GPUs only)",
    "probe-failed": "a probe could not read something (permission, broken library, timeout)",
    "library-shadowed": "an older cuBLAS / NCCL / nvJitLink / NVRTC / CUDA runtime earlier on "
                        "the search path wins over the framework's own copy or the one cuDNN "
                        "needs",
    "library-copies": "several copies of one CUDA library; the one found first is of unknown "
                      "version, so it is not passed",
    "live-cudnn": "the cuDNN torch really loaded is not the one its build expects",
    "live-sdpa": "a scaled-dot-product-attention backend failed on a tiny bf16 call",
    "live-launch": "a one-op kernel launch failed on a visible GPU",
    "live-failed": "the live check itself could not run (import error, crash, timeout)",
    "mig-enumeration": "more MIG devices are visible to one process than CUDA enumerates",
    "python-version": "the framework release has no wheels for this Python version",
    "cuda-unavailable": "a framework reports CUDA unavailable (torch.cuda.is_available() "
                        "False) and the snapshot shows no cause",
    "libcuda-unreachable": "a package opens the driver library by a name the loader does not "
                           "find (WSL 2's libcuda.so in /usr/lib/wsl/lib)",
    "libcudart-unreachable": "a package searches for the CUDA runtime by a name or in "
                             "directories where the installed copy is not (bitsandbytes "
                             "before 0.40.1 beside pip's libcudart.so.NN)",
    "requirement-unmet": "an installed package's own Requires-Dist on a GPU stack package is "
                         "not met by the version installed, or names one not installed",
    "fabric-manager": "an NVSwitch system's nvidia-fabricmanager is missing, stopped, not of the "
                      "driver's version, or has not set up the fabric (CUDA fails with "
                      "cudaErrorSystemNotReady, 802)",
    "kernel-module": "the NVIDIA kernel module flavor loaded (open or proprietary) does not drive "
                     "a GPU here, or the driver lists fewer GPUs than are present",
    "cuda-init": "cuInit fails although the driver lists GPUs (CUDA_ERROR_UNKNOWN, 999, on "
                 "Linux: nvidia_uvm left unusable by a suspend / resume)",
    "compute-mode": "a GPU's compute mode lets one process (exclusive_process) or none "
                    "(prohibited) create a CUDA context on it",
    "host-compiler": "the gcc / clang nvcc runs is outside the range its CUDA release accepts, "
                     "or there is none",
    "triton-build": "Triton's run-time C build lacks a C compiler or the interpreter's Python.h",
    "hide-gpu": "a GPU a framework here has no code for is visible beside GPUs it runs on: "
                "show CUDA only those (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER=PCI_BUS_ID)",
    "shm-size": "NCCL across several GPUs with a /dev/shm below 1 GiB (a container's default "
                "64 MB): its shared-memory segments do not fit",
    "platform-unsupported": "the OS has no build of a package (RAPIDS on native Windows) or of a "
                            "feature a program may use (torch.distributed's NCCL, "
                            "torch.compile's Triton on native Windows)",
    "pinned-memory": "a build that pins host memory runs where pinned memory is limited (WSL 2)",
    "kernel-timeout": "a GPU that drives a display runs kernels under the watchdog: a long kernel "
                      "is stopped (CUDA_ERROR_LAUNCH_TIMEOUT, 702)",
    "conda-virtual-package": "a conda CUDA build where conda sees no driver, so no __cuda "
                             "virtual package (CONDA_OVERRIDE_CUDA sets it)",
    "visible-devices": "CUDA_VISIBLE_DEVICES names a GPU this machine does not have (an index past "
                       "the last GPU, a UUID of no GPU here): CUDA stops reading the list there",
    "ptxas-newer-driver": "a ptxas newer than the CUDA the driver supports: XLA compiles "
                          "serially, and cubins of a newer CUDA major may not load",
    "error-message": "an error message the user saw (doctor --error): what it means, and its cause "
                     "where the snapshot decides it, else the causes left open (compat/errors.yaml)",
    "not-judged": "found, but nothing in the matrix judges it (shown as ?, never as a pass)",
    "ok": "a component checked and fine",
}


# What each free-form dict of a snapshot may hold, and the type of every key ("str" values
# are versions or names kept exactly as written). Detection writes these keys; the dnnctl-env/1
# loader accepts exactly these, so a typo in a hand-written file is an error, not a no-op.
# nvidia-fabricmanager, which an NVSwitch system needs at the driver's exact version
# (dnnctl.doctor.probe_fabric); absent = unknown
FABRIC_MANAGER_FIELDS = {
    "version": "version",  # nv-fabricmanager --version ("Fabric Manager version is : 535.161.08")
    "active": "bool",  # a nv-fabricmanager process runs (False: systemd says it is not running)
    "installed": "bool",  # the nv-fabricmanager program is here (False: looked, not found)
}
DRIVER_FIELDS: dict[str, Any] = {
    "present": "bool",  # detected snapshots always say; False = looked and found no driver
    # "580.159.04"; or the branch alone ("535", "r535", "535 branch": parse.driver_branch), of
    # which only what every driver of the branch shares is judged
    "version": "driver_version",
    "cuda": "version",  # newest CUDA the driver supports (cuDriverGetVersion), "13.0"
    "kernel_module": "version",  # /proc/driver/nvidia/version or /sys/module/nvidia/version
    "library": "version",  # user-space libcuda / libnvidia-ml version (from its file name)
    "libcuda": "str",  # path of the libcuda.so.1 the loader finds first
    "mismatch": "bool",  # kernel module and user-space library differ
    "forward_compat": "version_or_bool",  # CUDA version of cuda-compat's libcuda when it loads
    "device_nodes": "int",  # number of /dev/nvidiaN nodes visible here
    "gpu_count": "int",  # set when the GPUs could be listed (0 = the driver sees none)
    "source": "str",  # nvml | nvidia-smi | libcuda | proc
    "error": "str",  # a present driver that could not be read fully (probe problem)
    # cuInit(0) of the libcuda the loader finds first, asked in a child beside NVML
    # (dnnctl.doctor.probe_driver.ask_libcuda): code, the CUresult (0 CUDA_SUCCESS; 999
    # CUDA_ERROR_UNKNOWN, 100 CUDA_ERROR_NO_DEVICE, ...), name, cuGetErrorName's name of it
    "cuinit": {"code": "int", "name": "str"},
    "reason": "str",  # why no driver was found (present: false)
    "fabric_manager": FABRIC_MANAGER_FIELDS,
    # NVSwitches the driver lists in /proc/driver/nvidia-nvswitch/devices (NVLink 4 and
    # earlier; 0 = the driver lists none); an NVLink 5 switch's management port (InfiniBand
    # VPD "SW_MNG", HGX B200 and later) sets nvlink5_switch
    "nvswitches": "int",
    "nvlink5_switch": "bool",
    # the flavor of the loaded nvidia.ko (dnnctl.doctor.probe_pci): "open" (NVIDIA's open GPU
    # kernel modules, /proc/driver/nvidia/version "Open Kernel Module", license Dual MIT/GPL)
    # or "proprietary"; the open flavor drives Turing and later GPUs only
    "kernel_module_type": "module_type",
    # the NVIDIA GPUs on the PCI bus (display / 3D controllers of vendor 10de, from /sys), with
    # or without a driver that lists them; name: pci.ids' name ("GP104 [GeForce GTX 1070 Ti]");
    # bound: the kernel driver bound to it (nvidia, nouveau, vfio-pci; absent: none)
    "pci_gpus": [{"slot": "str", "device_id": "str", "name": "str", "bound": "str"}],
}
KERNEL_MODULE_TYPES = ("open", "proprietary")
# A GPU's compute mode (nvmlDeviceGetComputeMode, nvidia-smi's "Compute M."): exclusive_thread
# is the pre-CUDA 4 exclusive mode NVML still names ("support removed")
COMPUTE_MODES = ("default", "exclusive_thread", "prohibited", "exclusive_process")
_COMPUTE_MODE_TEXT = {"0": "default", "1": "exclusive_thread", "2": "prohibited",
                      "3": "exclusive_process", "e. thread": "exclusive_thread",
                      "e. process": "exclusive_process", "exclusive": "exclusive_thread"}
# The compilers a build here would run (dnnctl.doctor.probe_toolchain); absent = unknown.
TOOLCHAIN_FIELDS: dict[str, Any] = {
    "gcc": "version_or_bool",  # `gcc --version` of the gcc on PATH (nvcc's default host
    "clang": "version_or_bool",  # compiler on Linux); false = looked, none on PATH
    # MSVC, nvcc's host compiler on Windows (cl.exe on PATH): cl.exe's version "19.29.30133",
    # _MSC_VER "1929", the toolset "14.29", or Visual Studio's "VS 2022 17.10" / "vs2019"
    # (parse.msc_ver_span); false = looked, no cl.exe
    "msvc": "msvc_or_bool",
    # the host compiler nvcc is pointed at instead: -ccbin in $NVCC_PREPEND_FLAGS /
    # $NVCC_APPEND_FLAGS, $NVCC_CCBIN, or compiler-bindir in the nvcc.profile beside the nvcc
    # on PATH (kind: gcc | clang | msvc)
    "nvcc_ccbin": {"path": "str", "kind": "str", "version": "version"},
    # the C compiler Triton's run-time build takes ($CC, else gcc, else clang on PATH);
    # false = none found
    "c_compiler": "str_or_bool",
    "python_h": "bool",  # Python.h is in python_include (Triton builds against it)
    "python_include": "str",  # sysconfig's include dir, as triton/runtime/build.py asks it
}
# The machine around the GPU stack (dnnctl.doctor.probe_system); absent = unknown.
SYSTEM_FIELDS: dict[str, Any] = {
    # the container runtime this runs in, from its marks (/.dockerenv: docker,
    # /run/.containerenv: podman, KUBERNETES_SERVICE_HOST or kubepods: kubernetes, PID 1's
    # cgroup: containerd, lxc); false = none of them found
    "container": "str_or_bool",
    "shm_mib": "int",  # the size of /dev/shm (statvfs), where NCCL and DataLoader workers share
}
# A GPU's NVLink fabric registration as NVML reports it (Hopper and later;
# nvmlDeviceGetGpuFabricInfo, nvidia-smi -q "Fabric: State / Status"): state is one of
# FABRIC_STATES, status "success" or NVML's error text (meaningful once state is completed)
FABRIC_STATES = ("not_supported", "not_started", "in_progress", "completed")
FABRIC_FIELDS = {"state": "fabric_state", "status": "str"}
# A MIG device is an entry of ``gpus`` with ``mig.profile``; its physical GPU has ``mig.mode``.
MIG_FIELDS = {
    "mode": "bool",  # on a physical GPU: MIG mode is enabled (CUDA uses its MIG devices instead)
    "profile": "str",  # on a MIG device: "3g.40gb", "1c.3g.40gb" (nvidia-smi -L's name)
    "parent": "str",  # on a MIG device: its GPU's UUID (or index)
    "gpu_instance": "int",  # GPU instance (GI) id
    "compute_instance": "int",  # compute instance (CI) id within the GI
}
# Variables of the process environment that rules read (never the whole environment).
ENVIRONMENT_FIELDS = {
    "CUDA_VISIBLE_DEVICES": "str",  # "0,1", "GPU-<uuid>", "MIG-<uuid>,MIG-<uuid>"
    "CUDA_DEVICE_ORDER": "str",  # FASTEST_FIRST (CUDA's default) | PCI_BUS_ID (nvidia-smi's)
    # the __cuda virtual package conda / mamba solve with instead of the driver's
    "CONDA_OVERRIDE_CUDA": "str",
    # the ptxas Triton runs instead of its bundled copy (below / from compute capability 10.0)
    "TRITON_PTXAS_PATH": "str",
    "TRITON_PTXAS_BLACKWELL_PATH": "str",
    # a container image's CUDA requirement (set by NVIDIA's CUDA base images; checked against
    # the host driver before the container starts) and the switch that turns the check off
    "NVIDIA_REQUIRE_CUDA": "str",
    "NVIDIA_DISABLE_REQUIRE": "str",
    # the C compiler Triton's run-time build runs, and the host compiler nvcc runs instead of
    # gcc (NVCC_CCBIN: nvcc itself; CUDAHOSTCXX: CMake's CUDA builds)
    "CC": "str",
    "NVCC_CCBIN": "str",
    "CUDAHOSTCXX": "str",
    # options added to every nvcc command line (-ccbin, -allow-unsupported-compiler)
    "NVCC_PREPEND_FLAGS": "str",
    "NVCC_APPEND_FLAGS": "str",
}
_COMMON = {"version": "version", "source": "str", "cuda": "version", "cudnn": "version"}
FRAMEWORK_FIELDS: dict[str, dict[str, str]] = {
    "torch": {**_COMMON, "arch_list": "archlist", "local_tag": "str", "path": "str",
              "cxx11_abi": "bool",  # torch._C._GLIBCXX_USE_CXX11_ABI
              "installer": "str", "cuda_build": "bool", "hip": "str", "rocm": "str",
              "xpu": "str", "cudnn_package": "str", "cudnn_runtime": "version",
              "cudnn_compiled": "version", "cudnn_loaded": "str", "cuda_available": "bool",
              "device_count": "int", "capability": "str"},
    "tensorflow": {**_COMMON, "package": "str", "packages": "strlist", "arch_list": "archlist",
                   "cuda_build": "bool", "gpus_visible": "int"},
    # jax: cuda / cudnn are the build's (a jaxlib +cuda11.cudnn86 tag: "11" is the major only,
    # cuDNN 8.6 is what it was compiled with); cuda_runtime / cudnn_runtime are what it loads
    "jax": {**_COMMON, "jaxlib": "version", "plugin": "str", "plugin_version": "version",
            "arch_list": "archlist",
            "plugins": "strlist", "cuda_runtime": "version", "cudnn_runtime": "version",
            "backend": "str"},
    # onnxruntime: the onnxruntime-gpu wheel; cuda is its build's (capi/build_and_package_info.py
    # cuda_version, written from 1.21 on), else the matrix's onnxruntime table says
    "onnxruntime": {**_COMMON, "package": "str"},
    # flash-attn: its prebuilt wheel is built per torch minor, CUDA major and C++11 ABI; wheel:
    # the wheel's file name or its tag (cu12torch2.4cxx11abiFALSE); torch / cuda / cxx11_abi:
    # what it was built against, where known otherwise (a source build: the torch it found)
    "flash-attn": {**_COMMON, "wheel": "str", "torch": "version", "cxx11_abi": "bool"},
    # native ggml builds: built with the CUDA backend (GGML_CUDA), the ggml backends compiled in
    # (cuda, cpu, metal, vulkan, ...), CMAKE_CUDA_ARCHITECTURES (86, 89-real, 90-virtual, sm_86)
    "llama-cpp-python": {**_COMMON, "cuda_build": "bool", "backends": "strlist",
                         "arch_list": "archlist"},
    "pywhispercpp": {**_COMMON, "cuda_build": "bool", "backends": "strlist",
                     "arch_list": "archlist"},
    # xformers: torch is the torch.__version__ it was built for (xformers/cpp_lib.json, else
    # the wheel's Requires-Dist torch==X pin), cuda the nvcc of its build ("12.4" for 1204)
    "xformers": {**_COMMON, "torch": "str", "python": "str"},
    # tensorrt: engines_built_with lists the TensorRT version that built each serialized engine
    # (.engine / .plan) used here; version_compatible: they were built with that builder flag
    "tensorrt": {**_COMMON, "engines_built_with": "strlist", "version_compatible": "bool"},
    "cupy": {**_COMMON, "package": "str", "packages": "strlist", "runtime": "version",
             "arch_list": "archlist",
             "local_runtime": "version", "driver": "version", "nvrtc": "version",
             "device_count": "int"},
}


# extensions: a compiled CUDA extension of torch (setup.py CUDAExtension: detectron2, mmcv-full,
# apex, pytorch3d, a source-built torch-scatter) by package name. arch_list: the architectures
# its CUDA code was compiled for (sm_37 / compute_60, or TORCH_CUDA_ARCH_LIST's "3.7;6.0+PTX",
# e.g. detectron2's collect_env "detectron2 arch flags"); built_from_source: compiled on a
# machine by pip / setup.py (so for TORCH_CUDA_ARCH_LIST, else that machine's GPUs); path: the
# library read. Detection fills it (dnnctl.doctor.probe_extensions, archs from the library's
# .nv_fatbin headers); a snapshot may name it by hand.
EXTENSION_FIELDS = {"version": "version", "arch_list": "archlist", "built_from_source": "bool",
                    "path": "str"}


@dataclass
class Gpu:
    index: int | None = None
    name: str | None = None
    compute_capability: str | None = None  # "9.0"
    memory_mib: int | None = None
    uuid: str | None = None
    mig: dict[str, Any] | None = None  # keys: MIG_FIELDS
    fabric: dict[str, Any] | None = None  # keys: FABRIC_FIELDS
    compute_mode: str | None = None  # one of COMPUTE_MODES
    # a display is initialized on the GPU (NVML nvmlDeviceGetDisplayActive: an X server or a
    # desktop uses it), and the kernel run-time watchdog is on (cudaDevAttrKernelExecTimeout,
    # deviceQuery's "Run time limit on kernels", numba's cuda.detect() "Watchdog: Enabled")
    display_active: bool | None = None
    watchdog: bool | None = None


@dataclass
class Component:
    """A versioned thing found somewhere (a CUDA runtime, a cuDNN copy)."""

    version: str | None = None
    source: str | None = None  # "pip:nvidia-cudnn-cu12", "system:/usr/lib/...", "conda", ...
    path: str | None = None
    loaded_first: bool | None = None  # for cuDNN: would the dynamic loader pick this one first

    @property
    def toolkit(self) -> bool:
        """A CUDA toolkit with an nvcc: only ``nvcc[:<path to nvcc>]`` or ``system:<toolkit dir>``
        mark one (README, the snapshot's fields); not the ld cache's libcudart
        (``system:ldconfig``), pip's runtime wheels, conda's cudart, or a copy of unknown source."""
        src = self.source or ""
        return self.nvcc or (src.startswith("system:") and not src.startswith("system:ldconfig"))

    @property
    def nvcc(self) -> bool:
        """Found as an nvcc: ``nvcc:<path>``, or ``nvcc`` alone as a hand-written snapshot
        says it."""
        src = (self.source or "").strip()
        return src == "nvcc" or src.startswith("nvcc:")


@dataclass
class EnvSnapshot:
    """What doctor detected (or what a user wrote for a planned deployment)."""

    os: str | None = None
    python: str | None = None
    driver: dict[str, Any] = field(default_factory=dict)  # keys: DRIVER_FIELDS
    gpus: list[Gpu] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)  # keys: ENVIRONMENT_FIELDS
    toolchain: dict[str, Any] = field(default_factory=dict)  # keys: TOOLCHAIN_FIELDS
    system: dict[str, Any] = field(default_factory=dict)  # keys: SYSTEM_FIELDS
    cuda_runtimes: list[Component] = field(default_factory=list)
    cudnn: list[Component] = field(default_factory=list)
    libraries: dict[str, list[Component]] = field(default_factory=dict)  # keys: LIBRARIES
    live: dict[str, Any] = field(default_factory=dict)  # doctor --deep's live checks on a GPU
    frameworks: dict[str, dict[str, Any]] = field(default_factory=dict)  # FRAMEWORK_FIELDS
    extensions: dict[str, dict[str, Any]] = field(default_factory=dict)  # EXTENSION_FIELDS
    packages: dict[str, str] = field(default_factory=dict)
    # a package's own Requires-Dist entries on watched GPU stack projects (requirements.py),
    # as written, only those whose markers held where they were read: {package: [lines]}
    requires: dict[str, list[str]] = field(default_factory=dict)
    # error messages a user saw, verbatim (doctor --error / --error-file); rules_errors.py
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # probe remarks ("NVML: permission denied")
    # the SEARCHED lists a file wrote as ``[]`` (looked, found none); not a file field. An
    # absent list stays unknown; rules ask :meth:`none_found`.
    listed: list[str] = field(default_factory=list)

    def none_found(self, key: str) -> bool:
        """Whether the list ``key`` ("cudnn", "cuda_runtimes") is known to be empty."""
        return key in self.listed and not getattr(self, key)

    def to_dict(self) -> dict[str, Any]:
        fields = {k: v for k, v in asdict(self).items() if k != "listed"}
        data = _prune({"schema": ENV_SCHEMA, **fields})
        empty = {k for k in SEARCHED if self.none_found(k)}
        if isinstance(self.driver.get("present"), bool):
            empty.add("gpus")  # a detected snapshot: no GPU is a finding, not "unknown"
        if empty - set(data):
            data = {k: data.get(k, []) for k in ENV_ORDER if k in data or k in empty}
        return data


def compute_mode(text: str) -> str | None:
    """A compute mode as NVML names it, nvidia-smi prints it ("Exclusive_Process", "E. Process")
    or its number (0-3) -> COMPUTE_MODES."""
    key = " ".join(text.strip().lower().replace("-", " ").split())
    key = _COMPUTE_MODE_TEXT.get(key, key.replace(" ", "_"))
    return key if key in COMPUTE_MODES else None


def fabric_state(text: str) -> str | None:
    """A fabric state as NVML's names or nvidia-smi prints it ("In Progress") -> FABRIC_STATES."""
    key = "_".join(text.strip().lower().replace("-", " ").split())
    return key if key in FABRIC_STATES else None


def _prune(obj: Any) -> Any:
    """Drop None / empty values so a saved snapshot only says what is known."""
    if isinstance(obj, dict):
        out = {k: _prune(v) for k, v in obj.items()}
        return {k: v for k, v in out.items() if v not in (None, [], {})}
    if isinstance(obj, list):
        return [_prune(v) for v in obj]
    return obj


@dataclass
class Finding:
    code: str
    severity: str  # error | warning | info
    component: str  # driver | gpu | fabric | cuda | cudnn | torch | tensorflow | jax | cupy | ...
    message: str
    fix: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    source: str | None = None  # the matrix fact's citation

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def verdict(findings: list[Finding]) -> str:
    """pass | warn | fail from the worst severity."""
    sev = {f.severity for f in findings}
    if "error" in sev:
        return "fail"
    if "warning" in sev:
        return "warn"
    return "pass"


@dataclass
class DoctorReport:
    """One doctor run: the snapshot judged, the findings, and where the snapshot came from."""

    env: EnvSnapshot
    findings: list[Finding]
    origin: str = "detected"  # "detected", or the --from file's path
    timings: dict[str, float] | None = None  # wall ms per step (doctor --timings)

    @property
    def verdict(self) -> str:
        return verdict(self.findings)

    def to_dict(self) -> dict[str, Any]:
        """The ``dnnctl-doctor/1`` JSON document."""
        out = {"schema": DOCTOR_SCHEMA, "verdict": self.verdict,
               "findings": [f.to_dict() for f in self.findings], "env": self.env.to_dict()}
        if self.timings is not None:
            out["timings"] = dict(self.timings)
        return out
