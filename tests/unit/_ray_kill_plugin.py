"""Test-only plugin: the first process that imports it while the file named by
$DNNCTL_TEST_KILL_ONCE exists removes the file and kills itself with SIGKILL.

Loaded through $DNNCTL_PLUGINS, so the tuner imports it at the start of a Ray task: the
Ray worker running that task dies as on a crashed node, exactly once per file."""

from __future__ import annotations

import os
import signal

_flag = os.environ.get("DNNCTL_TEST_KILL_ONCE")
if _flag:
    try:
        os.unlink(_flag)  # atomic: of concurrent importers only one succeeds
    except FileNotFoundError:
        pass
    else:
        os.kill(os.getpid(), signal.SIGKILL)
