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
from collections import Counter, deque
from collections.abc import Callable
from collections.abc import Set as AbstractSet
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


_TORCH_DTYPES = {"float": "float32", "double": "float64", "half": "float16", "long": "int64", "int": "int32",
                 "short": "int16", "char": "int8", "byte": "uint8"}


def torch_dtype_name(fr_dtype: str) -> str:
    """The Flight Recorder's dtype ("float", as FrEntry holds it) as a Python call's span names it ("float32")."""
    return _TORCH_DTYPES.get(fr_dtype, fr_dtype)


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
    completed_ns: int = 0  # when the backend saw it complete (NCCL's watchdog); 0: not said (gloo never does)


def parse_active(text: str | bytes | Doc) -> list[FrEntry]:
    """Collectives still in flight in a dump (pure): entries not completed (NCCL's `onlyActive`
    dump holds only those; gloo's holds them all, as "scheduled")."""
    return parse_collectives(text, active_only=True)


def parse_collectives(text: str | bytes | Doc, active_only: bool = False) -> list[FrEntry]:
    """The collectives a dump holds, whatever their state (pure); p2p entries left out."""
    doc = _doc(text)
    out: list[FrEntry] = []
    for e in doc.get("entries", []) if isinstance(doc, dict) else []:
        try:
            if e.get("is_p2p") or (active_only and e.get("state") == "completed"):
                continue
            sizes = e.get("input_sizes") or []
            dtypes = [str(d) for d in e.get("input_dtypes") or []]
            dtype = dtypes[0] if dtypes else ""
            nbytes = 0
            for i, shape in enumerate(sizes):  # every input (a coalesced op has several)
                count = 1
                for dim in shape:
                    count *= int(dim)
                nbytes += count * _DTYPE_BYTES.get(dtypes[i] if i < len(dtypes) else dtype, 0)
            out.append(FrEntry(str(e["process_group"][0]), int(e["collective_seq_id"]),
                               op_family(str(e.get("profiling_name", ""))), nbytes,
                               dtype.lower(), int(e.get("time_created_ns") or 0), str(e.get("pg_id", "")),
                               int(e.get("time_discovered_completed_ns") or 0)
                               if e.get("state") == "completed" else 0))
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
        self.entry_read_total_s = 0.0  # every entries read's, together (the dumps' duty cycle)
        self.name_reads = 0

    @property
    def available(self) -> bool:
        return bool(self._dumps)

    def read(self, counters: Callable[[], dict[str, int]] | None = None,
             learn_now: bool = False) -> dict[str, tuple[int, int]]:
        """{pg name: (last enqueued, last completed)}: pg_status only (small). `counters` (group name ->
        torch's counter, read right after) names the backends that record without a name; `learn_now`:
        an id not named yet is looked up whatever the back-off (last words)."""
        merged: dict[str, tuple[int, int]] = {}
        for dump in list(self._dumps):
            status = self._call(dump, False, False, parse_pg_status)
            if not status:
                continue
            names = self._names.setdefault(dump, {})
            # an id that enqueued nothing has no entry to name it yet: looking would only start the back-off
            if any(key not in names and value[0] > 0 for key, value in status.items()):
                if learn_now:
                    self._learn_at.pop(dump, None)
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
        return self.read_entries(active_only=True)

    def read_entries(self, active_only: bool = False) -> list[FrEntry]:
        """The collectives the Flight Recorder holds (all of them, or only those not completed: NCCL's
        onlyActive dump is small), each (group, seq) once: a later dump wins (NCCL's for NCCL groups).
        The read's duration (it holds the GIL) is kept: what the next one will cost."""
        self.entry_reads += 1
        began = time.perf_counter()
        found: dict[tuple[str, int], FrEntry] = {}
        parse = parse_active if active_only else parse_collectives
        for dump in list(self._dumps):
            names = self._names.get(dump, {})
            for entry in self._call(dump, True, active_only, parse) or []:
                if not entry.group and entry.pg_id in names:
                    entry = dataclasses.replace(entry, group=names[entry.pg_id])
                found[(entry.group, entry.seq)] = entry
        self.entry_read_s = time.perf_counter() - began
        self.entry_read_total_s += self.entry_read_s
        return list(found.values())

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


# A group's unexplained seqs wait for an entries dump that names them: this many dumps that hold
# none of a seq's entries (its group unnamed there, or an entry torch never wrote) and it is lost
UNMATCHED_DUMPS = 3
NOTED_MAX = 65536  # seqs noted for a group the frontier has not reported yet, at most


@dataclass(slots=True)
class _Trail:
    """One group's completed collectives as the frontier saw them (FrCoverage)."""

    covered: int = 0  # every seq up to here is accounted for: a Python record, a span built, or lost
    known: set[int] = field(default_factory=set)  # seqs above `covered` something else records
    completed: int = -1  # the last completed seq pg_status gave, and when it was read
    read_ns: int = 0
    # (completed through, previous read, this read): the reads between which the frontier passed each seq
    advances: deque[tuple[int, int, int]] = field(default_factory=deque)
    misses: dict[int, int] = field(default_factory=dict)  # seq -> dumps that held no entry of it
    forgot: bool = False  # `known` overflowed before the frontier first reported the group


@dataclass(frozen=True, slots=True)
class FrDone:
    """A completed collective that only the Flight Recorder recorded: its entry and when it ended.

    end_ns is the backend's completion time where the entry gives one (NCCL: the watchdog's), else
    the first frontier read that found it completed; it ended within window_ns before end_ns (gloo:
    the reads' interval; 0 where the entry gave the time)."""

    gid: str
    entry: FrEntry
    end_ns: int
    window_ns: int


class FrCoverage:
    """Which completed collectives no Python call of ours recorded, and when they ended (pure state).

    Fed on the runtime thread: `observe` at each pg_status read (per group, its last completed seq),
    `note` for each seq something else records (a Python call's record, an op adopted in flight). A
    seq the frontier passed that nothing noted is unexplained (DDP's buckets, its unused-parameter
    all-reduce, coalesced broadcasts, compiled code's collectives: issued from C++). An entries dump
    names them (`resolve`): each gets an FrDone, ended between the two frontier reads around its
    completion (gloo's entries never say when: they stay "scheduled"); a seq older than every entry
    the dump holds of its group was overwritten in the Flight Recorder's ring before it was read:
    counted in `lost`, never guessed."""

    def __init__(self, since_ns: int = 0) -> None:
        # collectives created before this (a runtime started late, instrumented again) are not this runtime's:
        # passed over, neither built nor lost
        self.since_ns = since_ns
        self._trails: dict[str, _Trail] = {}
        self.lost = 0  # unexplained seqs whose entries the ring no longer held (or never named)
        self.built = 0  # FrDone answered

    def observe(self, gid: str, completed: int, read_ns: int) -> None:
        trail = self._trails.get(gid)
        if trail is None:
            trail = self._trails[gid] = _Trail()
        if trail.completed < 0 and trail.forgot:
            trail.covered = max(trail.covered, completed)  # its history was forgotten: covered from here on
        if completed > trail.completed:
            if completed > trail.covered:
                trail.advances.append((completed, trail.read_ns, read_ns))
            trail.completed = completed
        trail.read_ns = read_ns

    def note(self, gid: str, seq: int) -> None:
        trail = self._trails.get(gid)
        if trail is None:
            trail = self._trails[gid] = _Trail()
        if seq > trail.covered:
            known = trail.known
            known.add(seq)
            if trail.completed < 0 and len(known) > NOTED_MAX:
                # a group the frontier does not report (yet): what it did before its first report is forgotten
                known.clear()
                trail.forgot = True

    def unexplained(self, known_now: AbstractSet[tuple[str, int]] = frozenset(),
                    settled_before_ns: int | None = None) -> dict[str, list[int]]:
        """{gid: completed seqs nothing recorded}; `known_now`: (gid, seq) recorded but not noted yet
        (Python ops in flight or not drained). `settled_before_ns`: only seqs a read before then found
        completed (a Python op's record is drained and noted a tick after it completed: looking
        later spares the runtime the look at every record not drained yet). Groups with none move
        their `covered` on."""
        out: dict[str, list[int]] = {}
        for gid, trail in self._trails.items():
            if trail.completed <= trail.covered:
                continue
            through = trail.completed
            if settled_before_ns is not None:
                through = trail.covered
                for advanced, _, read_ns in trail.advances:
                    if read_ns > settled_before_ns:
                        break
                    through = advanced
                if through <= trail.covered:
                    continue
            known = trail.known
            waiting = [seq for seq in range(trail.covered + 1, through + 1)
                       if seq not in known and (gid, seq) not in known_now]
            if waiting:
                out[gid] = waiting
                self._settle(trail, waiting[0] - 1)
            else:
                self._settle(trail, through)
        return out

    def resolve(self, names: dict[str, str], entries: list[FrEntry],
                known_now: AbstractSet[tuple[str, int]] = frozenset(),
                settled_before_ns: int | None = None) -> list[FrDone]:
        """The unexplained seqs an entries dump names, as FrDone; `names`: torch's group name -> gid.
        Those older than what the dump holds of their group are lost (the ring wrapped), as are those
        UNMATCHED_DUMPS dumps did not name."""
        by_seq: dict[str, dict[int, FrEntry]] = {}
        for entry in entries:
            gid = names.get(entry.group)
            if gid is not None:
                by_seq.setdefault(gid, {})[entry.seq] = entry
        out: list[FrDone] = []
        for gid, waiting in self.unexplained(known_now, settled_before_ns).items():
            trail = self._trails[gid]
            held = by_seq.get(gid, {})
            oldest = min(held) if held else None
            before_us = oldest is not None and held[oldest].created_ns < self.since_ns
            for seq in waiting:
                found = held.get(seq)
                if found is not None:
                    if found.created_ns >= self.since_ns:
                        out.append(self._done(gid, trail, found))
                    trail.known.add(seq)
                    trail.misses.pop(seq, None)
                elif oldest is not None and seq < oldest:
                    self.lost += 0 if before_us else 1
                    trail.known.add(seq)
                else:
                    misses = trail.misses[seq] = trail.misses.get(seq, 0) + 1
                    if misses >= UNMATCHED_DUMPS:
                        self.lost += 1
                        trail.known.add(seq)
                        del trail.misses[seq]
        self.unexplained(known_now, settled_before_ns)  # move `covered` over what was just settled
        self.built += len(out)
        return out

    def pending(self) -> int:
        """Unexplained seqs waiting for a dump (as of the last `unexplained`)."""
        return sum(max(0, t.completed - t.covered) for t in self._trails.values())

    @staticmethod
    def _done(gid: str, trail: _Trail, entry: FrEntry) -> FrDone:
        if entry.completed_ns:
            return FrDone(gid, entry, max(entry.completed_ns, entry.created_ns), 0)
        after, before = 0, trail.read_ns
        for through, previous_ns, read_ns in trail.advances:
            if through >= entry.seq:
                after, before = previous_ns, read_ns
                break
        after = max(after, entry.created_ns)
        before = max(before, after)
        return FrDone(gid, entry, before, before - after)

    @staticmethod
    def _settle(trail: _Trail, through: int) -> None:
        if through <= trail.covered:
            return
        trail.covered = through
        if trail.known and min(trail.known) <= through:
            trail.known = {seq for seq in trail.known if seq > through}
        while trail.advances and trail.advances[0][0] <= through:
            trail.advances.popleft()
