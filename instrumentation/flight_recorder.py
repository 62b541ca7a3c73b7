"""torch's Flight Recorder: the per-group frontier every issuer passes through.

Every c10d collective reaches a ProcessGroup, whatever issued it: a Python call, DDP's C++
reducer (bucket all-reduce, per-forward buffer broadcast, unused-parameter bitmap), the
functional collectives of DTensor and of compiled graphs (torch.ops._c10d_functional.*),
funcol's own autograd, coalesced blocks (allreduce_coalesced, `_coalescing_manager`). The
ProcessGroup records each one in its Flight Recorder, on every backend torch 2.13 ships
(gloo and NCCL; the CPU simulator plays NCCL's), and keeps per group the last enqueued /
started / completed collective seq (`pg_status`). Reading only that part is small
(~0.01 ms), so it costs the training thread nothing: the runtime thread reads it a few
times a second. A seq enqueued but not completed that no Python call of ours issued came
from one of those issuers; an entries dump (below; taken only when such an op stays open)
names it: op, size, dtype, enqueue time.

Dumps: `_dump_fr_trace` (every backend but NCCL; pickled, read without stack traces) and
`_dump_nccl_trace_json` (NCCL, whose completed seq is advanced by ProcessGroupNCCL's watchdog,
~100 ms behind the device). A dump holds the GIL (the training thread waits for it): with
torch's 2,000 entries the JSON dump with stack traces took 70 ms here and 0.3-1 s on a loaded
machine; the pickled one without them 16 ms. Gloo never retires entries (state stays
"scheduled"), so `onlyActive` does not filter there (and costs twice the time): the frontier does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import pickle
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mycroft import schema

log = logging.getLogger("mycroft.instrumentation")


Doc = dict[str, Any]  # a dump as Python objects (the pickled dump's own form, or JSON decoded)


def _doc(dump: str | bytes | Doc) -> Any:
    return dump if isinstance(dump, dict) else json.loads(dump)


def parse_pg_status(text: str | bytes | Doc) -> dict[str, tuple[int, int]]:
    """{pg id: (last enqueued, last completed) collective seq} from a Flight Recorder dump (pure).

    The keys are this process's own pg ids (the order in which it created its groups' backends),
    not torch's group names: a rank that is no member of some `new_group` numbers its later groups
    differently from its peers and from the names. `parse_pg_ids` names them."""
    doc = _doc(text)
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


def parse_pg_ids(text: str | bytes | Doc) -> tuple[dict[str, str], set[str]]:
    """({pg id: torch's group name}, the ids whose entries carry no name) from a dump (pure): only
    entries carry both. A backend torch never named records "" (TORCH_DISTRIBUTED_DEBUG=DETAIL
    wraps each gloo backend in a ProcessGroupWrapper, which takes the name; the wrapped backend
    records the group's collectives, and a helper backend the wrapper's own checks): UnnamedIds
    names those."""
    doc = _doc(text)
    named: dict[str, str] = {}
    unnamed: set[str] = set()
    for e in doc.get("entries", []) if isinstance(doc, dict) else []:
        try:
            pg_id, name = str(e["pg_id"]), str(e["process_group"][0])
        except (KeyError, TypeError, IndexError):
            continue
        if name:
            named[pg_id] = name
        else:
            unnamed.add(pg_id)
    return named, unnamed - set(named)


UNNAMED_MIN_VOTES = 3


@dataclass(slots=True)
class UnnamedIds:
    """Names the Flight Recorder's unnamed backends by torch's own per-group counters (pure state).

    The backend that records a group's collectives counts them on the counter the group's
    `_get_sequence_number_for_group` reads, whoever issued them (Python, C++, compiled code):
    read side by side, its pg_status `last_enqueued` equals that counter. Each time an unnamed
    id's value moves and equals exactly one group's counter, that is a vote; an id is named after
    UNNAMED_MIN_VOTES votes and more than twice any rival's, and a group takes one id, with more
    than twice the votes of any other id that chose it.
    The wrapper's helper counts its checks (several per collective) and never settles on a group.
    Never guessed otherwise: a wrong id gives a group another's frontier."""

    votes: dict[str, Counter[str]] = field(default_factory=dict)
    last: dict[str, int] = field(default_factory=dict)  # pg id -> the value it last voted at

    def observe(self, enqueued: dict[str, int], counters: dict[str, int]) -> None:
        """One side-by-side read: unnamed pg id -> last enqueued; group name -> torch's counter."""
        for pg_id, value in enqueued.items():
            if value <= 0 or self.last.get(pg_id) == value:
                continue
            self.last[pg_id] = value
            matches = [name for name, counter in counters.items() if counter == value]
            if len(matches) == 1:
                self.votes.setdefault(pg_id, Counter())[matches[0]] += 1

    def named(self) -> dict[str, str]:
        """{pg id: group name} for the ids the evidence names (each group once, or not at all where two
        ids are as likely: a helper that counts its checks in step with another group's counter)."""
        claims: dict[str, list[tuple[int, str]]] = {}  # group -> (votes, pg id) of the ids that chose it
        for pg_id, counted in self.votes.items():
            ranked = counted.most_common(2)
            name, n = ranked[0]
            rival = ranked[1][1] if len(ranked) > 1 else 0
            if n >= UNNAMED_MIN_VOTES and n > 2 * rival:
                claims.setdefault(name, []).append((n, pg_id))
        out: dict[str, str] = {}
        for name, ids in claims.items():
            ids.sort(reverse=True)
            if len(ids) == 1 or ids[0][0] > 2 * ids[1][0]:
                out[ids[0][1]] = name
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

    group: str  # torch's pg name ("" where the backend was never named: see UnnamedIds)
    seq: int
    op: str
    bytes: int
    dtype: str
    created_ns: int
    pg_id: str = ""  # this process's id of the backend that recorded it


def parse_active(text: str | bytes | Doc) -> list[FrEntry]:
    """Collectives still in flight in a dump (pure): entries not completed (NCCL's `onlyActive`
    dump holds only those; gloo's holds them all, as "scheduled")."""
    doc = _doc(text)
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
                               dtype.lower(), int(e.get("time_created_ns", 0)), str(e.get("pg_id", ""))))
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


def pickled_dump(dump_fr_trace: Callable[..., bytes]) -> Callable[[bool, bool], Doc]:
    """torch's generic pickled dump as (includeCollectives, onlyActive) -> doc: no stack traces
    (symbolising them is most of a dump's cost), and never onlyActive, which filters nothing on
    gloo and doubles the cost (parse_active leaves completed entries out)."""

    def dump(include_collectives: bool, only_active: bool) -> Doc:
        doc = pickle.loads(dump_fr_trace(include_collectives, False, False))  # torch's own bytes, this process's memory
        return doc if isinstance(doc, dict) else {}

    return dump


def dump_functions() -> list[Callable[..., Any]]:
    """The Flight Recorder dumps of this torch: the generic one (gloo, ...) first, then NCCL's.
    Each is called as (includeCollectives, onlyActive) and gives a doc or its JSON text."""
    found: list[Callable[..., Any]] = []
    try:
        import torch

        c10d = torch._C._distributed_c10d
        pickled, generic = getattr(c10d, "_dump_fr_trace", None), getattr(c10d, "_dump_fr_trace_json", None)
        if pickled is not None:
            found.append(pickled_dump(pickled))
        elif generic is not None:
            found.append(generic)
    except Exception:
        pass
    nccl = nccl_dump_function()
    if nccl is not None:
        found.append(nccl)
    return found


LEARN_FIRST_S = 1.0  # after a full dump that left a pg id unnamed, the next try; doubles up to LEARN_MAX_S
LEARN_MAX_S = 60.0


class FrontierReader:
    """Reads pg_status on demand from every dump torch has; a dump that fails is dropped (logged once).

    pg_status names groups by this process's pg ids; a full dump (its entries carry id and name) is
    taken when an id appears that no dump has named yet — once per new group, backing off for one
    whose entries the ring buffer no longer holds. An id not named is left out, never guessed: taken
    for a group name, it gave one group another's frontier (a TP group the DP group's seq).
    A later dump wins for a group both report (NCCL's is the truth for NCCL groups).
    """

    def __init__(self, dump: Callable[..., Any] | None = None,
                 dumps: list[Callable[..., Any]] | None = None) -> None:
        self._dumps = [dump] if dump is not None else (dumps if dumps is not None else dump_functions())
        self._names: dict[Callable[..., Any], dict[str, str]] = {}  # per dump: pg id -> group name
        # per dump: pg ids recorded without a name (TORCH_DISTRIBUTED_DEBUG=DETAIL), named by UnnamedIds
        self._unnamed: dict[Callable[..., Any], UnnamedIds] = {}
        self._learn_at: dict[Callable[..., Any], tuple[float, float]] = {}  # per dump: (next try, backoff)
        self.reads = 0
        self.entry_reads = 0
        self.entry_read_s = 0.0  # the last entries read's duration: what the next one will cost the GIL
        self.name_reads = 0

    @property
    def available(self) -> bool:
        return bool(self._dumps)

    def read(self, counters: Callable[[], dict[str, int]] | None = None) -> dict[str, tuple[int, int]]:
        """{pg name: (last enqueued, last completed)}: pg_status only (small). `counters` (group name ->
        torch's counter, read right after) names the backends that record without a name."""
        merged: dict[str, tuple[int, int]] = {}
        for dump in list(self._dumps):
            status = self._call(dump, False, False, parse_pg_status)
            if not status:
                continue
            names = self._names.setdefault(dump, {})
            if any(key not in names for key in status):
                self._learn(dump, names)
            unnamed = self._unnamed.get(dump)
            if unnamed is not None and counters is not None:
                waiting = {key: value[0] for key, value in status.items() if key not in names and key in unnamed.last}
                if waiting:
                    unnamed.observe(waiting, counters())
                    taken = set(names.values())
                    names.update({k: v for k, v in unnamed.named().items() if v not in taken and k not in names})
            for key, value in status.items():
                name = names.get(key)
                if name is not None:
                    merged[name] = value
        self.reads += 1
        return merged

    def read_active(self) -> list[FrEntry]:
        """The collectives the Flight Recorder holds as not completed (entries; onlyActive), each named
        by its group (an unnamed backend's by what UnnamedIds learned)."""
        self.entry_reads += 1
        began = time.perf_counter()
        out: list[FrEntry] = []
        for dump in list(self._dumps):
            names = self._names.get(dump, {})
            for entry in self._call(dump, True, True, parse_active) or []:
                if not entry.group and entry.pg_id in names:
                    entry = dataclasses.replace(entry, group=names[entry.pg_id])
                out.append(entry)
        self.entry_read_s = time.perf_counter() - began
        return out

    def _learn(self, dump: Callable[..., Any], names: dict[str, str]) -> None:
        now = time.monotonic()
        next_try, backoff = self._learn_at.get(dump, (0.0, LEARN_FIRST_S))
        if now < next_try:
            return
        self.name_reads += 1
        named, unnamed = self._call(dump, True, False, parse_pg_ids) or ({}, set())
        names.update(named)
        if unnamed:
            ids = self._unnamed.setdefault(dump, UnnamedIds())
            for pg_id in unnamed - set(names):
                ids.last.setdefault(pg_id, 0)  # known unnamed: read() votes on it from now on
        self._learn_at[dump] = (now + backoff, min(LEARN_MAX_S, backoff * 2))

    def _call(self, dump: Callable[..., Any], entries: bool, only_active: bool, parse: Callable[[Any], Any]) -> Any:
        try:
            return parse(dump(entries, only_active))  # includeCollectives, onlyActive
        except Exception as exc:
            with contextlib.suppress(ValueError):
                self._dumps.remove(dump)
            log.info("mycroft: a Flight Recorder dump is unavailable (%r); Mycroft sees only the "
                     "collectives issued from Python through it", exc)
            return None
