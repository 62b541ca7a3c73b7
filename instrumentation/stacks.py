"""Where the main thread is now, as the heartbeats report it (before init and after).

Its own module so that the start-up reporter and the runtime share it without importing each other.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback

from mycroft import schema

# Frames of Mycroft's own code are dropped from reported stacks: the instrumentation and the
# top-level mycroft modules, but not mycroft.faults (its jobs are the user code under test).
_OUR_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_OUR_PACKAGE = os.path.dirname(os.path.abspath(schema.__file__))


def _ours(filename: str) -> bool:
    return filename.startswith(_OUR_DIR) or os.path.dirname(filename) == _OUR_PACKAGE


def main_thread_stack(depth: int) -> str:
    """Where the main thread is now: innermost frame last, Mycroft's own frames removed."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    if frame is None:
        return ""
    frames = [entry for entry in traceback.extract_stack(frame) if not _ours(entry.filename)]
    return "\n".join(f"{entry.filename}:{entry.lineno} in {entry.name}" for entry in frames[-depth:])
