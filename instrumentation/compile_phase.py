"""Whether this process is inside a torch.compile compilation, for the heartbeat's phase.

A compiling rank is outside communication for seconds to minutes at the first steps (and at a
recompile), at stacks that end anywhere (generated code, the standard library), and its
compiler can hold the GIL long enough to starve the heartbeat thread. The RCA reads the phase
to call that an expected pause rather than a hang, and a silence inside it a starved heartbeat
first. Dynamo says when it compiles (torch._dynamo.callback: start / end of each compilation,
lazy backward compilations included); Mycroft never imports Dynamo itself (a second of
import), it registers once the job did.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

_log = logging.getLogger(__name__)
_CALLBACKS = "torch._dynamo.callback"


class CompileWatch:
    """Counts the compilations in progress (Dynamo may nest them: a backward compiled lazily)."""

    def __init__(self) -> None:
        self._depth = 0
        self._lock = threading.Lock()
        self._registered = False
        self._failed = False

    def _start(self, _args: Any = None) -> None:
        with self._lock:
            self._depth += 1

    def _end(self, _args: Any = None) -> None:
        with self._lock:
            self._depth = max(0, self._depth - 1)

    def poll(self) -> None:
        """Register with Dynamo once the job imported it; cheap when done or not yet imported."""
        if self._registered or self._failed:
            return
        module = sys.modules.get(_CALLBACKS)
        if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
            return  # not imported, or the job's thread is importing it right now: its names come later
        try:
            handler = module.callback_handler
            handler.register_start_callback(self._start)
            handler.register_end_callback(self._end)
            self._registered = True
        except Exception as exc:  # another torch: no phase, never an error in training
            self._failed = True
            _log.warning("mycroft: torch.compile phases not reported (%s: %s)", type(exc).__name__, exc)

    @property
    def compiling(self) -> bool:
        return self._depth > 0


WATCH = CompileWatch()
