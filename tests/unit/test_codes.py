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


def _enum(header: str, name: str, prefix: str) -> dict[str, int]:
    text = (kernels_dir() / "include" / "dnnctl" / header).read_text()
    enum = re.search(r"enum " + name + r" \{([^}]*)\}", text)
    assert enum is not None, f"enum {name} not in {header}"
    return {m.group(1).lower(): int(m.group(2))
            for m in re.finditer(prefix + r"(\w+)\s*=\s*(\d+)", enum.group(1))}


def test_epilogue_codes_match_the_header_enums() -> None:
    assert _enum("epilogue.cuh", "BiasMode", "BIAS_") == codes.BIAS_MODE
    assert _enum("epilogue.cuh", "OutMode", "OUT_") == codes.OUT_MODE
    assert _enum("conv.cuh", "EpiFlag", "EPI_FLAG_") == codes.EPI_FLAG
    assert _enum("epilogue.cuh", "ResMode", "RES_") == codes.RES_MODE


def test_no_run_time_flag_shares_a_name_with_an_epilogue_macro() -> None:
    """One epilogue vocabulary: the compile-time EPI_* macros and the run-time EpiFlag bits
    are named apart (a macro defined as a number would rewrite an enumerator of its name)."""
    macros = set(re.findall(r"#ifndef (EPI_\w+)", (kernels_dir() / "include" / "dnnctl" /
                                                    "gemm_macros.cuh").read_text()))
    assert {"EPI_ACT", "EPI_BIAS", "EPI_RES"} <= macros
    assert not macros & {f"EPI_FLAG_{k.upper()}" for k in codes.EPI_FLAG}
