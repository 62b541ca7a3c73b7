"""Where the main thread is now, as the heartbeats report it (before init and after).

Its own module so that the start-up reporter and the runtime share it without importing each other.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable

from mycroft import schema

# Frames of Mycroft's own code are dropped from reported stacks: the instrumentation and the
# top-level mycroft modules, but not mycroft.faults (its jobs are the user code under test).
_OUR_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_OUR_PACKAGE = os.path.dirname(os.path.abspath(schema.__file__))


def _ours(filename: str) -> bool:
    return filename.startswith(_OUR_DIR) or os.path.dirname(filename) == _OUR_PACKAGE


# at most this many other threads' stacks on a heartbeat, each this deep, all of them in this many characters
OTHER_THREADS_MAX = 8
OTHER_THREAD_DEPTH = 8
OTHER_THREADS_CHARS = 6000


def main_thread_stack(depth: int, context: int = 16) -> str:
    """Where the main thread is now (see thread_stack)."""
    return thread_stack(threading.main_thread().ident or -1, depth, context)


def issuing_thread(issuers: Iterable[int]) -> int:
    """The thread that issues the rank's collectives: of the threads that ever issued one (each noted once,
    when it first did: recorder.PerThread), the last to start that is still alive; else the main thread.
    Ray Train, an RL trainer or a user's own loop runs the training in a worker thread while the main
    thread sits in the framework's loop: the worker's stack is the one that says where the rank is."""
    alive = sys._current_frames()
    for ident in reversed(list(issuers)):
        if ident in alive:
            return ident
    return threading.main_thread().ident or -1


def thread_stack(ident: int, depth: int, context: int = 16) -> str:
    """Where thread `ident` is now: innermost frame last, Mycroft's own frames removed ("" if it is gone).

    The innermost `depth` frames, and above them the frame where each package was entered (at most
    `context` of them, the nearest): a rank compiling a template deep inside a lazy import shows the
    import around the recursion, which is what tells a normal pause from a hang. Read from the frames
    themselves, no source file is read (the rank may hang on its file system)."""
    frame = sys._current_frames().get(ident)
    walked: list[tuple[str, int, str]] = []
    while frame is not None:
        code = frame.f_code
        if not _ours(code.co_filename):
            walked.append((code.co_filename, frame.f_lineno or 0, code.co_name))
        frame = frame.f_back
    walked.reverse()
    return "\n".join(f"{filename}:{line} in {name}" for filename, line, name in summarize(walked, depth, context))


def other_thread_stacks(skip: int, depth: int = OTHER_THREAD_DEPTH) -> str:
    """Every other live thread's stack but Mycroft's own, each under a `--- thread NAME` line (bounded:
    OTHER_THREADS_MAX threads, OTHER_THREADS_CHARS in all): what the rank's other threads were doing
    when its issuing thread stopped (a loader thread holding a lock, a checkpoint writer)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts: list[str] = []
    size = 0
    for ident in sys._current_frames():
        name = names.get(ident, f"thread-{ident}")
        if ident == skip or name.startswith("mycroft"):
            continue
        stack = thread_stack(ident, depth, context=4)
        if not stack:
            continue
        part = f"--- thread {name}\n{stack}"
        if len(parts) >= OTHER_THREADS_MAX or size + len(part) > OTHER_THREADS_CHARS:
            break
        parts.append(part)
        size += len(part) + 1
    return "\n".join(parts)


def summarize(frames: list[tuple[str, int, str]], depth: int, context: int) -> list[tuple[str, int, str]]:
    """The innermost `depth` frames (outermost first), after the nearest `context` frames above them
    at which the stack entered another package (a run of frames in one package keeps its first)."""
    if len(frames) <= depth:
        return frames
    outer = frames[:-depth] if depth > 0 else frames
    entries: list[tuple[str, int, str]] = []
    last = None
    for entry in outer:
        package = _package(entry[0])
        if package != last:
            entries.append(entry)
            last = package
    kept = entries[-context:] if context > 0 else []
    return kept + (frames[-depth:] if depth > 0 else [])


def _package(filename: str) -> str:
    """What a frame's file belongs to: a site-packages' top-level package, the import machinery, a
    standard-library module, or the user's own file."""
    for marker in ("site-packages/", "dist-packages/"):
        at = filename.find(marker)
        if at >= 0:
            return filename[at + len(marker):].split("/", 1)[0]
    if filename.startswith("<frozen importlib"):
        return "<frozen importlib>"
    return filename
