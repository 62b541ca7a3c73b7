"""DDP's wait for its peers' gradients, timed without a comm hook.

DDP's bucket all-reduces run from its C++ reducer. Without a comm hook (the default: the hook
costs ~50 us of training-thread CPU per bucket) the recorder never times them, so a DDP rank reads
as computing all of its time and a straggler is named by no rule: the RCA names one from each
rank's compute / wait split (the heartbeats' comm_s and ops_done).

The reducer waits for every bucket at the end of backward, in an autograd final callback it
queues once the last gradient is ready. This probe puts a post-accumulate-grad hook on the
module's first parameter (the input side: usually the last gradient computed), which notes the
time and queues a final callback of its own. That callback queues a second one: the engine runs
final callbacks in order, and one queued while they run goes after all queued before it, so the
second runs once DDP's wait has returned. The time between is the rank's wait for its peers (plus
what is left of its backward, about the same on every rank); it is added to the rank's
communication time and counts as one op done. Cost: three Python calls per backward.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from mycroft.instrumentation.recorder import Recorder

log = logging.getLogger("mycroft.instrumentation")


class DdpWaitProbe:
    """Times one DDP module's end-of-backward wait (see module doc)."""

    __slots__ = ("engine", "ready_ns", "recorder")

    def __init__(self, recorder: Recorder, engine: Any) -> None:
        self.recorder = recorder
        self.engine = engine
        self.ready_ns = 0

    def on_first_grad(self, _param: Any) -> None:
        """The post-accumulate-grad hook: the rank's own backward is (about) done."""
        try:
            self.ready_ns = time.time_ns()
            self.engine.queue_callback(self._after_queued)
        except Exception as exc:
            self.recorder._note_error("ddp wait probe", exc)

    def _after_queued(self) -> None:
        """First final callback: DDP's finalize (queued before it) has not run yet; go after it."""
        try:
            self.engine.queue_callback(self._after_wait)
        except Exception as exc:
            self.recorder._note_error("ddp wait probe", exc)

    def _after_wait(self) -> None:
        try:
            ready, self.ready_ns = self.ready_ns, 0
            if ready:
                self.recorder.waited_untraced(ready, time.time_ns())
        except Exception as exc:
            self.recorder._note_error("ddp wait probe", exc)


def attach(recorder: Recorder, ddp: Any) -> DdpWaitProbe | None:
    """Put the probe on a DDP module that keeps its built-in all-reduce; None where it cannot."""
    try:
        import torch

        engine = torch.autograd.Variable._execution_engine
        first = next((p for p in ddp.module.parameters() if p.requires_grad), None)
        if first is None or not hasattr(first, "register_post_accumulate_grad_hook"):
            return None
        probe = DdpWaitProbe(recorder, engine)
        first.register_post_accumulate_grad_hook(probe.on_first_grad)
        return probe
    except Exception as exc:
        log.info("mycroft: DDP's gradient wait is not timed (%r)", exc)
        return None
