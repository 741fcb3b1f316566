"""The code tables of dnnctl.ops.codes agree with the CUDA headers the kernels include."""

from __future__ import annotations

import re

from dnnctl.ops import codes
from dnnctl.resources import kernels_dir


def test_activation_codes_match_the_header_enum() -> None:
    text = (kernels_dir() / "include" / "dnnctl" / "common.cuh").read_text()
    enum = re.search(r"enum Act \{([^}]*)\}", text)
    assert enum is not None
    header = {m.group(1).lower(): int(m.group(2))
              for m in re.finditer(r"ACT_(\w+)\s*=\s*(\d+)", enum.group(1))}
    assert header == codes.ACT


def test_dtype_codes_match_the_header_switch() -> None:
    text = (kernels_dir() / "include" / "dnnctl" / "common.cuh").read_text()
    found = dict(re.findall(r"DNNCTL_DTYPE == (\d+)\s*\n\s*(?:typedef|using)[^\n]*?(float|__half|"
                            r"__nv_bfloat16)", text))
    names = {"float": "float32", "__half": "float16", "__nv_bfloat16": "bfloat16"}
    explicit = {names[v]: int(k) for k, v in found.items()}
    assert explicit == {"float32": 0, "float16": 1}
    assert re.search(r"#else\s*\n\s*typedef __nv_bfloat16 elem_t", text)  # the other code
    assert {**explicit, "bfloat16": 2} == codes.DTYPE
