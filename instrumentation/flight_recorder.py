"""The NCCL Flight Recorder's per-group frontier: a completion source for ops Mycroft holds no Work for.

`torch._C._distributed_c10d._dump_nccl_trace_json(includeCollectives=False, onlyActive=False)`
returns, per process group, the last enqueued / started / completed collective seq
(`pg_status`; completed is advanced by ProcessGroupNCCL's watchdog, so it lags the device
by up to its ~100 ms loop). Without the entries the dump is small (measured on the CPU
simulator, docs/instrumentation.md), so the runtime reads it only when some op needs it —
functional collectives (they run in C++: no Work reaches Python) and ops whose Work was
released to bound memory — and once per heartbeat as a cross-check
(`mycroft.hb.group.fr_completed`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("mycroft.instrumentation")


def parse_pg_status(text: str | bytes) -> dict[str, int]:
    """{pg name: last completed collective seq} from a Flight Recorder JSON dump (pure)."""
    doc = json.loads(text)
    status = doc.get("pg_status") if isinstance(doc, dict) else None
    out: dict[str, int] = {}
    if not isinstance(status, dict):
        return out
    for key, value in status.items():
        if not isinstance(value, dict):
            continue
        try:
            out[str(key)] = int(value.get("last_completed_collective", -1))
        except (TypeError, ValueError):
            continue
    return out


def nccl_dump_function() -> Callable[..., Any] | None:
    """torch's NCCL Flight Recorder dump, or None where torch has none (CPU builds without a simulator)."""
    try:
        import torch

        return getattr(torch._C._distributed_c10d, "_dump_nccl_trace_json", None)
    except Exception:
        return None


class FrontierReader:
    """Reads pg_status on demand; gives up quietly (once logged) when the dump fails."""

    def __init__(self, dump: Callable[..., Any] | None = None) -> None:
        self._dump = dump if dump is not None else nccl_dump_function()
        self.reads = 0
        self._failed = False

    @property
    def available(self) -> bool:
        return self._dump is not None and not self._failed

    def read(self) -> dict[str, int]:
        if not self.available:
            return {}
        assert self._dump is not None
        try:
            text = self._dump(False, False)  # includeCollectives=False, onlyActive=False: pg_status only
            self.reads += 1
            return parse_pg_status(text)
        except Exception as exc:
            self._failed = True
            log.info("mycroft: NCCL Flight Recorder unavailable (%r); its cross-check is off", exc)
            return {}
