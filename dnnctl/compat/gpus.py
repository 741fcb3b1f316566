"""A GPU as the matrix knows it: its model row, compute capability and architecture row."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dnnctl.compat.matrix import Matrix
from dnnctl.compat.schema import Row
from dnnctl.compat.versions import CC

_CC_TEXT = re.compile(r"^(?:(?:sm|compute)_\d{2,3}[af]?|\d{1,2}\.\d)$", re.IGNORECASE)


@dataclass
class GpuInfo:
    """A GPU with what the matrix knows about it."""

    label: str  # the NVML name, or "sm_90" when only the CC was given
    cc: CC | None
    model: Row | None
    arch: Row | None

    @property
    def gpu_class(self) -> str | None:
        return self.model["class"] if self.model else None


def resolve_gpu(matrix: Matrix, name: str | None, cc_text: str | None, index: int = 0) -> GpuInfo:
    """Match a GPU by NVML name and/or compute capability."""
    model = matrix.gpu(name) if name else None
    cc = CC.maybe(cc_text) if cc_text else None
    if cc is None and model is not None:
        cc = CC.parse(model["cc"])
    if cc is None and model is None and name:  # a board known only by its die (pci.ids)
        chip = matrix.gpu_chip(name)
        if chip is not None and not chip.uncertain:
            cc = CC.parse(chip["cc"])
    label = name or (cc.sm if cc else f"GPU {index}")
    return GpuInfo(label, cc, model, matrix.arch(cc) if cc else None)


def split_gpu_text(text: str) -> tuple[str | None, str | None]:
    """``"B200"`` -> (name, None); ``"9.0"`` / ``"sm_90"`` -> (None, "9.0")."""
    t = text.strip()
    if _CC_TEXT.match(t):
        return None, str(CC.parse(t))
    return t, None
