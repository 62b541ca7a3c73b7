"""A CPU-time budget for work done inline in someone else's pipeline.

Inside rotel, `process_spans` runs on rotel's pipeline: every millisecond spent there
delays every span behind it, heartbeats included. The budget allows at most
`busy_fraction` of wall time (averaged over `window_s`) for decoding and joining;
past it the adapter sheds (native detail dropped undecoded, rank spans passed
unjoined, both counted) until the budget refills. Time is measured, not estimated,
so the bound holds on a loaded machine too; the bucket is small (0.1 s at the
defaults), so no single batch stalls rotel for longer than that.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class BusyBudget:
    """Token bucket of CPU seconds: refills at `busy_fraction` s per s, holds `busy_fraction * window_s`."""

    def __init__(self, busy_fraction: float = 0.5, window_s: float = 0.2,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if not 0 < busy_fraction <= 1 or window_s <= 0:
            raise ValueError("busy_fraction must be in (0, 1] and window_s > 0")
        self.rate = busy_fraction
        self.capacity = busy_fraction * window_s
        self._clock = clock
        self._tokens = self.capacity
        self._last = clock()

    def remaining(self) -> float:
        """CPU seconds that may be spent now (<= 0: shed)."""
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate)
        self._last = now
        return self._tokens

    def available(self) -> bool:
        return self.remaining() > 0

    def spend(self, seconds: float) -> None:
        self._tokens -= seconds
