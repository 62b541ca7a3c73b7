"""Mycroft's background threads under their own names in the OS (`top -H`, `ps -L`, /proc/<pid>/task).

Python 3.11 names threads for Python only: the kernel sees every thread as `python`, so an operator
asking what Mycroft costs a rank (or a profile of per-thread CPU) cannot tell its threads from
torch's. Linux's prctl(PR_SET_NAME) names the calling thread (15 bytes); elsewhere, or if libc
cannot be loaded, nothing happens.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

PR_SET_NAME = 15
_libc: Any = None


def name_this_thread(name: str) -> None:
    """Give the calling thread `name` (cut to 15 bytes) in the OS; never raises."""
    global _libc
    if not sys.platform.startswith("linux"):
        return
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None)  # the process's own symbols: libc's prctl (no ldconfig run)
        _libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except Exception:  # a name is a convenience: never worth an error in a rank
        pass
