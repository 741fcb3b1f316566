"""pytest plugin: run the GPU tests of our own kernels on the CPU emulator.

    python -m pytest -p tools.cuda_emu.pytest_emu tests/gpu/test_gemm.py -k "not cublas"

get_backend("cupy") becomes the emulator before collection, so the GPU tests do not skip.
Tests that need real CuPy / torch / cuBLAS still skip or fail: deselect them with -k.
"""

from tools.cuda_emu.emu import install

install()
