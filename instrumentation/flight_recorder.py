"""The NCCL Flight Recorder's per-group frontier: a completion source for ops Mycroft holds no Work for.

`torch._C._distributed_c10d._dump_nccl_trace_json(includeCollectives=False, onlyActive=False)`
returns, per process group, the last enqueued / started / completed collective seq
(`pg_status`; completed is advanced by ProcessGroupNCCL's watchdog, so it lags the device
by up to its ~100 ms loop). Without the entries the dump is small (measured on the CPU
simulator, docs/instrumentation.md), so the runtime reads it only when some op needs it —
functional collectives (they run in C++: no Work reaches Python), ops whose Work was
released to bound memory, and collectives issued by C++ (DDP's reducer on NCCL, where
Mycroft does not hook it): their seqs show up enqueued but unknown to Python, and the
entries of an `onlyActive` dump (in flight only) name them — and once per heartbeat as a
cross-check (`mycroft.hb.group.fr_completed`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mycroft import schema

log = logging.getLogger("mycroft.instrumentation")


def parse_pg_status(text: str | bytes) -> dict[str, tuple[int, int]]:
    """{pg name: (last enqueued, last completed) collective seq} from a Flight Recorder dump (pure)."""
    doc = json.loads(text)
    status = doc.get("pg_status") if isinstance(doc, dict) else None
    out: dict[str, tuple[int, int]] = {}
    if not isinstance(status, dict):
        return out
    for key, value in status.items():
        if not isinstance(value, dict):
            continue
        try:
            out[str(key)] = (int(value.get("last_enqueued_collective", -1)),
                             int(value.get("last_completed_collective", -1)))
        except (TypeError, ValueError):
            continue
    return out


_FR_OPS = (  # substrings of the Flight Recorder's profiling_name ("nccl:all_reduce", "nccl:_allgather_base", ...)
    ("reduce_scatter", schema.OP_REDUCE_SCATTER), ("allgather", schema.OP_ALL_GATHER),
    ("all_gather", schema.OP_ALL_GATHER), ("allreduce", schema.OP_ALL_REDUCE), ("all_reduce", schema.OP_ALL_REDUCE),
    ("alltoall", schema.OP_ALL_TO_ALL), ("all_to_all", schema.OP_ALL_TO_ALL), ("broadcast", schema.OP_BROADCAST),
    ("barrier", schema.OP_BARRIER), ("reduce", schema.OP_REDUCE), ("gather", schema.OP_GATHER),
    ("scatter", schema.OP_SCATTER),
)
_DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
                "Byte": 1, "Bool": 1}


def op_family(profiling_name: str) -> str:
    """"nccl:all_reduce" -> "all_reduce" (the contract's op families)."""
    name = profiling_name.rsplit(":", 1)[-1].lower()
    return next((op for key, op in _FR_OPS if key in name), name)


@dataclass(frozen=True, slots=True)
class FrEntry:
    """A collective the Flight Recorder holds as not yet completed."""

    group: str  # torch's pg name
    seq: int
    op: str
    bytes: int
    dtype: str
    created_ns: int


def parse_active(text: str | bytes) -> list[FrEntry]:
    """Collectives still in flight in an `onlyActive` dump (pure)."""
    doc = json.loads(text)
    out: list[FrEntry] = []
    for e in doc.get("entries", []) if isinstance(doc, dict) else []:
        try:
            if e.get("is_p2p") or e.get("state") == "completed":
                continue
            sizes = e.get("input_sizes") or [[]]
            dtype = str((e.get("input_dtypes") or [""])[0])
            count = 1
            for dim in sizes[0] if sizes else []:
                count *= int(dim)
            out.append(FrEntry(str(e["process_group"][0]), int(e["collective_seq_id"]),
                               op_family(str(e.get("profiling_name", ""))), count * _DTYPE_BYTES.get(dtype, 0),
                               dtype.lower(), int(e.get("time_created_ns", 0))))
        except (KeyError, TypeError, ValueError, IndexError):
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

    def read(self) -> dict[str, tuple[int, int]]:
        """{pg name: (last enqueued, last completed)}: pg_status only (small)."""
        return self._call(False, parse_pg_status, {})

    def read_active(self) -> list[FrEntry]:
        """The collectives the Flight Recorder holds as in flight (entries, onlyActive)."""
        return self._call(True, parse_active, [])

    def _call(self, entries: bool, parse: Callable[[Any], Any], empty: Any) -> Any:
        if not self.available:
            return empty
        assert self._dump is not None
        try:
            text = self._dump(entries, entries)  # includeCollectives, onlyActive
            self.reads += 1
            return parse(text)
        except Exception as exc:
            self._failed = True
            log.info("mycroft: NCCL Flight Recorder unavailable (%r); its cross-check is off", exc)
            return empty
