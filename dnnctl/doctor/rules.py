"""Pure judgement rules: an EnvSnapshot and the Matrix in, a list of Findings out.

``judge(env, matrix)`` never touches the machine: doctor feeds it a detected snapshot,
``dnnctl compat check`` a planned one built from flags. Absent fields are unknown and are
filled from the matrix (a torch wheel's arch list and cuDNN from its version and CUDA tag).
A version the matrix has no row for, or a row marked uncertain, gives ``unknown-version``:
never a guess. The shared context lives in context.py; rule families in rules_driver.py
(with rules_runtime.py: the driver against one CUDA runtime or build, shared by every
rule that judges one; rules_fabric.py: an NVSwitch node's Fabric Manager;
rules_gpu_count.py: fewer GPUs driven than named),
rules_mig.py (MIG devices), rules_kernel_module.py (the open / proprietary kernel
module flavor against the GPUs; GPUs on the PCI bus the driver does not list),
rules_compute_mode.py (a GPU one process or none may use; rules_watchdog.py: one whose
kernels a display's watchdog stops), rules_cuinit.py (cuInit failing while the driver lists
GPUs: nvidia_uvm after a suspend), rules_frameworks.py (with
rules_tf_floor.py: the lowest
compute capability of TensorFlow's binaries per release), rules_jax.py and
rules_ctranslate2.py (with
rules_platform.py: what the OS rules out; rules_os_limits.py: what native Windows and WSL 2
leave out that Linux has), rules_onnxruntime.py, rules_paddle.py
(paddlepaddle-gpu's .postNNN wheels; rules_paddle3.py: 3.x's CUDA variants and their
GPU code), rules_extensions.py (nvcc vs torch's CUDA),
rules_source_ext.py (a source-built torch CUDA extension's arch list vs the GPUs),
rules_xformers.py (xformers vs the torch it was built for), rules_cpu_torch.py (a torch
with no CUDA beside CUDA add-ons; conda-forge's CPU variant; used by rules_frameworks),
rules_graph.py (PyG's extension wheels and DGL vs torch),
rules_flash_attn.py (the torch flash-attn was built against), rules_available.py
(torch.cuda.is_available() False: its cause), rules_pairs.py (add-on
versions that must pair, e.g. jax's CUDA plugin and jaxlib), rules_jaxlib.py (jax's own
check of jaxlib), rules_vllm.py (the torch vLLM's wheels pin), rules_mmdet.py (the mmcv range
MMDetection asserts), rules_prebuilt.py (prebuilt add-ons tied to one torch line or CUDA
release), rules_tf_runtime.py (a TensorFlow CUDA build with no release row and
no runtime of its major), rules_conda_cuda.py (a conda torch build vs the env's
cudatoolkit; rules_conda.py: conda's __cuda virtual package, conda-forge's CPU-only builds), rules_ggml.py
(llama.cpp / whisper.cpp bindings: their CUDA backend, arch list and nvcc; with
rules_cpu_builds.py: a CPU-only default build is never a pass), rules_addons.py
(add-ons' GPU minimums, cuda-python),
rules_bitsandbytes.py (its native library for torch's CUDA, old releases' libcudart
search), rules_python.py, rules_reach.py, rules_broken.py (a release
broken on one OS, compat/releases.yaml), rules_container.py (an image's NVIDIA_REQUIRE_CUDA
vs the host driver), rules_torch_cudnn.py,
rules_torch_lines.py (torch nightlies and 0.x releases) and rules_torch_source.py (a torch
built from source; all three used by rules_frameworks),
rules_cudnn.py, rules_libraries.py, rules_copies.py (several copies of a library, an old
CUDA directory before cuDNN), rules_dlls.py (a DLL a library needs that nothing installs with
it: cuDNN 8.3-8.9's zlibwapi.dll on Windows), rules_nccl.py (the NCCL loaded first vs torch's pin;
rules_shm.py: its shared-memory segments vs the size of /dev/shm),
rules_nvjitlink.py, rules_nvrtc.py (torch's NVRTC vs a newer GPU), rules_tfjs.py
(tfjs-node-gpu's libtensorflow), rules_ptxas.py (a JIT compiler's ptxas vs the GPUs; with
rules_triton.py: Triton's bundled one), rules_toolchain.py (nvcc's host compiler against
its CUDA release; Triton's run-time C build: a C compiler and Python.h), rules_packages.py
(none imports this module),
rules_requires.py (a package's own Requires-Dist on a GPU stack package, unmet), rules_stub.py
(the toolkit's stub libcuda found before the driver's), rules_gpu_hide.py (a GPU a framework
has no code for beside GPUs it runs on: hide it), rules_errors.py (the error messages a user
saw: their meaning and, where the snapshot decides it, their cause), rules_tensorrt.py (a TensorRT build's
CUDA major; rules_tensorrt_gpus.py: the GPUs a release has kernels for) and, last, rules_unjudged.py (what no rule judged is said to be not judged);
os_fixes.py writes install commands for the snapshot's OS and rewrites POSIX environment
commands for a native Windows snapshot.
"""

from __future__ import annotations

from dnnctl.compat.matrix import Matrix
from dnnctl.doctor import (
    os_fixes,
    rules_addons,
    rules_available,
    rules_bitsandbytes,
    rules_broken,
    rules_compute_mode,
    rules_conda,
    rules_conda_cuda,
    rules_container,
    rules_copies,
    rules_ctranslate2,
    rules_cuinit,
    rules_dlls,
    rules_driver,
    rules_errors,
    rules_extensions,
    rules_flash_attn,
    rules_frameworks,
    rules_ggml,
    rules_gpu_count,
    rules_gpu_hide,
    rules_graph,
    rules_jaxlib,
    rules_kernel_module,
    rules_libraries,
    rules_live,
    rules_mig,
    rules_mmdet,
    rules_nccl,
    rules_nvjitlink,
    rules_nvrtc,
    rules_onnxruntime,
    rules_os_limits,
    rules_packages,
    rules_paddle,
    rules_pairs,
    rules_platform,
    rules_prebuilt,
    rules_ptxas,
    rules_requires,
    rules_shm,
    rules_source_ext,
    rules_stub,
    rules_tensorrt,
    rules_tensorrt_gpus,
    rules_tf_runtime,
    rules_tfjs,
    rules_toolchain,
    rules_unjudged,
    rules_visible,
    rules_vllm,
    rules_watchdog,
    rules_xformers,
)
from dnnctl.doctor.context import build_context
from dnnctl.doctor.model import EnvSnapshot, Finding


def judge(env: EnvSnapshot, matrix: Matrix) -> list[Finding]:
    """Judge ``env`` against ``matrix``: driver and GPUs first, then each framework."""
    ctx = build_context(env, matrix)
    findings: list[Finding] = []
    findings += rules_driver.check(ctx)
    findings += rules_gpu_count.check(ctx)
    findings += rules_visible.check(ctx)
    findings += rules_stub.check(ctx)
    findings += rules_container.check(ctx)
    findings += rules_mig.check(ctx)
    findings += rules_kernel_module.check(ctx)
    findings += rules_compute_mode.check(ctx)
    findings += rules_watchdog.check(ctx)
    findings += rules_cuinit.check(ctx, findings)
    findings += rules_frameworks.check(ctx)
    findings += rules_broken.check(ctx)
    findings += rules_ctranslate2.check(ctx)
    findings += rules_onnxruntime.check(ctx)
    findings += rules_tensorrt.check(ctx)
    findings += rules_tensorrt_gpus.check(ctx)
    findings += rules_paddle.check(ctx)
    findings += rules_extensions.check(ctx)
    findings += rules_source_ext.check(ctx)
    findings += rules_flash_attn.check(ctx)
    findings += rules_ggml.check(ctx)
    findings += rules_addons.check(ctx, findings)
    findings += rules_addons.cuda_python(ctx)
    findings += rules_platform.wsl_libcuda(ctx)
    findings += rules_os_limits.check(ctx)
    findings += rules_bitsandbytes.check(ctx, findings)
    findings += rules_xformers.check(ctx)
    findings += rules_graph.check(ctx)
    findings += rules_nvrtc.check(ctx)
    findings += rules_tfjs.check(ctx)
    findings += rules_pairs.check(ctx)
    findings += rules_jaxlib.check(ctx)
    findings += rules_vllm.check(ctx)
    findings += rules_mmdet.check(ctx)
    findings += rules_prebuilt.check(ctx)
    findings += rules_tf_runtime.check(ctx)
    findings += rules_conda_cuda.check(ctx, findings)
    findings += rules_conda.check(ctx)
    findings += rules_libraries.duplicates(ctx)
    findings += rules_copies.check(ctx)
    findings += rules_dlls.check(ctx)
    findings += rules_nccl.check(ctx)
    findings += rules_shm.check(ctx)
    findings += rules_nvjitlink.check(ctx)
    findings += rules_ptxas.check(ctx)
    findings += rules_toolchain.check(ctx)
    findings += rules_live.check(ctx)
    findings += rules_available.check(ctx, findings)
    findings += rules_packages.check(ctx)
    findings += rules_requires.check(ctx, findings)
    findings += rules_gpu_hide.check(ctx, findings)
    findings += rules_errors.check(ctx, findings, rejudge=lambda e: judge(e, matrix))
    findings += rules_unjudged.check(ctx, findings)
    os_fixes.for_shell(ctx, findings)
    return _dedupe(findings)


def _dedupe(findings: list[Finding]) -> list[Finding]:
    out: list[Finding] = []
    seen: set[tuple[str, str, str]] = set()
    for f in findings:
        key = (f.code, f.component, f.message)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out
