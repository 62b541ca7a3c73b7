"""Rate-limited logging: a flood of bad requests must not become a flood of tracebacks.

Each key (e.g. "otlp-grpc decode") logs at most once per `every_s`; the next line that
gets through says how many were suppressed in between.
"""

from __future__ import annotations

import logging
import threading
import time


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, every_s: float = 10.0, max_keys: int = 1024) -> None:
        self._log = logger
        self._every = every_s
        self._max_keys = max_keys
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def _admit(self, key: str) -> int | None:
        """None: suppress; else the number suppressed since the last line for this key."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._every:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return None
            if key not in self._last and len(self._last) >= self._max_keys:
                self._last.clear()
                self._suppressed.clear()
            self._last[key] = now
            return self._suppressed.pop(key, 0)

    def _emit(self, level: int, key: str, msg: str, args: tuple[object, ...], exc_info: bool) -> None:
        suppressed = self._admit(key)
        if suppressed is None:
            return
        if suppressed:
            msg += f" ({suppressed} more like this in the last {self._every:g} s not logged)"
        self._log.log(level, msg, *args, exc_info=exc_info)

    def warning(self, key: str, msg: str, *args: object) -> None:
        self._emit(logging.WARNING, key, msg, args, False)

    def error(self, key: str, msg: str, *args: object) -> None:
        self._emit(logging.ERROR, key, msg, args, False)

    def exception(self, key: str, msg: str, *args: object) -> None:
        self._emit(logging.ERROR, key, msg, args, True)
