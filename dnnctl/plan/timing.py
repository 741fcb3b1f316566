"""What a plan's timing numbers mean: the statistics of a candidate's samples and the version
of the harness that took them (both part of the kernels digest, so a plan measured another
way is reported stale)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dnnctl.plan.schema import Timing

# Bump when the way candidates are measured or compared changes: it is part of the kernels
# digest, so plans made with the old harness are reported stale.
TIMING_HARNESS_VERSION = 1


def summarize(samples: Sequence[float] | np.ndarray) -> Timing:
    """Median, p20, p80 and n of per-call times in microseconds."""
    arr = np.asarray(samples, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        raise ValueError("no finite timing samples")
    p20, med, p80 = np.percentile(arr, [20.0, 50.0, 80.0])
    return Timing(float(med), float(p20), float(p80), int(arr.size))
