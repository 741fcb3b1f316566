"""Where dnnctl keeps files of its own: the cache root (one place for every cache).

``$DNNCTL_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/dnnctl`` (``~/.cache/dnnctl``).
Everything kept there can be deleted at any time; it is rebuilt on demand.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The directory dnnctl's caches live under (not created here)."""
    explicit = os.environ.get("DNNCTL_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dnnctl"
