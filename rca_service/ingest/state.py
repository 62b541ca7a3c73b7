"""Live per-job state folded from span records: the input of the pure analysis.

`apply_records()` is a deterministic fold (records + the time they were received ->
state); it does no I/O, so the service, the offline analyzer and the tests share it.
Memory is bounded: a window of sequence numbers per group, capped groups, ranks and jobs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from mycroft import schema
from mycroft.otlp import SpanRecord

from ..config import AnalysisConfig
from . import admission

_fold_fast: ModuleType | None
try:  # the compiled heartbeat fold (built by `pip install`, optional): see _apply_heartbeat
    from . import _fold_fast
except ImportError:  # pragma: no cover - a platform without a C compiler
    _fold_fast = None

WORK_SAMPLES = 40  # heartbeats of compute/wait history per rank (slowness.py)
FLOW_HISTORY = 8  # heartbeats with flows per rank (slow_links.py)
TIMELINE_OPS = 64  # completed ops per rank kept for the propagation evidence

#: the native flow counters of a heartbeat (every one schema.py names)
FLOW_TABLE_KEYS = (schema.ATTR_HB_FLOW_COMMS, *schema.HB_TABLES[2][2])  # the per-flow parallel arrays
FLOW_KEYS = frozenset(value for name, value in vars(schema).items()
                      if name.startswith("ATTR_HB_FLOW_") and isinstance(value, str))

Sig = tuple[str, int, str]  # (op, bytes, dtype) of one rank's op at one seq
P2PKey = tuple[str, int, int]  # (group id, src, dst)


@dataclass(frozen=True, slots=True)
class LearnedPause:
    """A pause this job made before and came back from."""

    rank: int
    signature: str
    longest_s: float
    times: int


@dataclass(slots=True)
class InFlight:
    """An op a rank reported as issued and not completed, as of `observed_at`."""

    group_id: str
    seq: int
    op: str
    age_s: float
    peer: int  # -1 for collectives
    bytes: int
    observed_at: float
    returned: bool = False  # the issuing call returned (async, or issued from C++): the rank is not inside it

    def age_at(self, now: float) -> float:
        return self.age_s + max(0.0, now - self.observed_at)

    @property
    def is_p2p(self) -> bool:
        return self.peer >= 0


@dataclass(slots=True)
class RankState:
    rank: int
    host: str = ""
    pid: int = 0
    first_seen: float = 0.0  # received time of the first record from this process
    last_seen: float = 0.0  # received time of the last record from this rank
    last_hb_at: float = 0.0  # received time of the last heartbeat (0: none yet)
    hb_counter: int = -1  # -1: no heartbeat yet (never shown as such: see heartbeat_number)
    hb_interval: float = 1.0
    final: bool = False
    exit_reason: str = ""
    idle_s: float = 0.0
    idle_observed_at: float = 0.0
    stack: str = ""
    thread_stacks: str = ""  # the rank's other threads, sent with the stack (schema.ATTR_HB_THREAD_STACKS)
    step: int | None = None
    dropped: int = 0
    # op spans so far by what the rank's trace budget did (schema.ATTR_HB_SPANS_*): /metrics sums them per job
    spans_kept: int = 0
    spans_anomalies: int = 0
    spans_sampled_out: int = 0
    issued: dict[str, int] = field(default_factory=dict)
    completed: dict[str, int] = field(default_factory=dict)
    inflight: list[InFlight] = field(default_factory=list)
    p2p_issued: dict[P2PKey, int] = field(default_factory=dict)
    p2p_completed: dict[P2PKey, int] = field(default_factory=dict)
    errors: deque[tuple[str, int, str, str]] = field(default_factory=lambda: deque(maxlen=8))
    flows: dict[str, list[Any]] = field(default_factory=dict)
    # the last heartbeats' flow arrays, each [flows, its slow_links mark (None: not computed yet)]
    flow_history: deque[list[Any]] = field(default_factory=lambda: deque(maxlen=FLOW_HISTORY))
    # (heartbeat time on the rank's clock, cumulative comm seconds, cumulative ops): compute vs wait
    work: deque[tuple[float, float, int]] = field(default_factory=lambda: deque(maxlen=WORK_SAMPLES))
    # the rank's last completed ops: (start, end, group id, seq), on its own clock
    timeline: deque[tuple[float, float, str, int]] = field(default_factory=lambda: deque(maxlen=TIMELINE_OPS))
    # what the last heartbeat's group table was (the decoder shares unchanged values, so identity
    # says "unchanged") and the (index, group id) pairs it admitted: an unchanged table is not re-folded
    hb_table: tuple[Any, Any, Any] | None = None
    hb_admitted: list[tuple[int, str]] = field(default_factory=list)
    hb_checked: tuple[Any, ...] | None = None  # admission.heartbeat_checked() of its last heartbeat folded
    resource: Any = None  # the last record's resource dict (shared by the decoder: identity = unchanged)
    windows: dict[int, Any] = field(default_factory=dict)  # slowness.work_window's memo, by window length
    phase: str = ""  # schema.PHASE_*: importing / rendezvous before init_process_group returns, then training
    # its last heartbeat: every op in flight was posted (async, call returned) and it waits on none of them;
    # it is in its own code, not in a transfer (schema.ATTR_HB_POSTED_ONLY)
    posted_only: bool = False
    device_async: bool = False  # its heartbeats say its groups' ops complete on the device (NCCL)
    phase_s: float = 0.0  # seconds in that phase as of the last heartbeat (start-up phases)

    def idle_at(self, now: float) -> float:
        if self.inflight and not self.posted_only:
            return 0.0
        if not self.idle_observed_at:  # no heartbeat yet: idle since its first record at most
            return max(0.0, now - self.first_seen) if self.first_seen else 0.0
        return self.idle_s + max(0.0, now - self.idle_observed_at)

    @property
    def heartbeat_number(self) -> int | None:
        return self.hb_counter if self.hb_counter >= 0 else None

    def spoke_at(self, job_heartbeats: bool) -> float:
        """When this rank last proved it was alive: its last heartbeat; before its first one,
        its first record (in a job whose ranks heartbeat, a rank that sent spans and then no
        heartbeat is judged from there). 0.0 when liveness cannot be judged (spans-only data)."""
        if self.last_hb_at:
            return self.last_hb_at
        return self.first_seen if job_heartbeats else 0.0


@dataclass(slots=True)
class SeqRecord:
    """What each member did at one sequence number of one group."""

    sigs: dict[int, Sig] = field(default_factory=dict)
    starts: dict[int, float] = field(default_factory=dict)
    ends: dict[int, float] = field(default_factory=dict)
    states: dict[int, str] = field(default_factory=dict)
    version: int = 0  # bumped by the fold on every change of sigs / states
    rewrites: int = 0  # ... of which a member's signature or state replaced by another value
    clean: tuple[int, int, int, int] | None = None  # (version, sigs, states, rewrites) when found clean


@dataclass(slots=True)
class AgentState:
    """A launcher agent (one per node) while its node waits for the job's other nodes (schema.KIND_AGENT):
    no rank exists yet, so what it says is all the RCA knows of a multi-node start-up."""

    host: str
    pid: int
    node_rank: int = -1  # where the rendezvous fixes it before the round (static)
    backend: str = ""
    nodes_min: int = 0
    nodes_max: int = 0
    joined: int = -1  # nodes in the round so far, as this agent last read it (-1: unknown)
    joined_hosts: tuple[str, ...] = ()
    expected_hosts: tuple[str, ...] = ()  # the job's hosts (SLURM_JOB_NODELIST), where the launcher tells them
    phase_s: float = 0.0  # seconds in the node rendezvous, at its last span
    interval_s: float = 1.0
    last_at: float = 0.0  # when its last span arrived
    done: bool = False  # the rendezvous returned (ATTR_HB_FINAL): its workers report from then on


@dataclass(slots=True)
class GroupState:
    group_id: str
    name: str = ""
    ranks: tuple[int, ...] = ()
    desc: str = ""  # the group's description (torch group_desc, e.g. "tp0"), from its op spans
    seqs: dict[int, SeqRecord] = field(default_factory=dict)
    durations: deque[float] = field(default_factory=lambda: deque(maxlen=256))
    # of those, the ones whose end was seen where it happened (not the Flight Recorder's frontier, which
    # notices a gloo op's end up to seconds late, nor inferred from a later op): what the adaptive hang
    # threshold learns from
    timed: deque[float] = field(default_factory=lambda: deque(maxlen=256))
    op_spans: int = 0  # op spans folded into its seqs (the ends / starts of seqs change only with one)
    version: int = 0  # bumped with every change of its seq records (find_mismatches reads changed groups)
    # signature digests per block of seqs: block -> rank -> digest (schema.ATTR_HB_DIGEST_*)
    digests: dict[int, dict[int, int]] = field(default_factory=dict)
    # the seqs an op span wrote (only those have starts and ends): the slowdown search reads these,
    # not the whole window (heartbeats add seqs to every TP group every beat); pruned to the window
    op_seqs: dict[int, None] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def label(self) -> str:
        """What the user calls this group (group_label)."""
        return group_label(self.name, self.desc) or self.group_id


MESH_DESC_PREFIX = "mesh_"  # DeviceMesh's group_desc for a dimension: "mesh_tp", flattened "mesh_dp_shard_tp"
DEFAULT_GROUP_DESC = "default_pg"


def group_label(name: str, desc: str) -> str:
    """The user's name for a group: its DeviceMesh dimension ("tp" from group_desc "mesh_tp"), else its
    group_desc (Megatron's "TENSOR_MODEL_PARALLEL_GROUP", a job's "tp0"), "world" for the default group,
    else torch's group name ("3")."""
    if desc.startswith(MESH_DESC_PREFIX) and len(desc) > len(MESH_DESC_PREFIX):
        return desc[len(MESH_DESC_PREFIX):]
    if desc == DEFAULT_GROUP_DESC:
        return "world"
    return desc if desc and desc != "undefined" else name


def job_name(job: JobState) -> str:
    """The name the user gave the job (OTEL_SERVICE_NAME), "" when the ranks' service is the job id."""
    for rank in job.ranks.values():
        name = str(rank.resource.get(schema.RES_SERVICE_NAME, "") or "") if rank.resource else ""
        if name and name != job.job_id and not name.startswith("unknown_service"):
            return name[:128]
        return ""
    return ""


@dataclass(slots=True)
class JobState:
    job_id: str
    world_size: int = 0
    first_seen: float = 0.0
    last_seen: float = 0.0
    last_progress_at: float = 0.0
    completions: int = 0
    ranks: dict[int, RankState] = field(default_factory=dict)
    groups: dict[str, GroupState] = field(default_factory=dict)
    spans: int = 0
    heartbeats: int = 0
    dropped_records: int = 0
    hb_interval: float = 1.0  # the interval the job's ranks last reported (for ranks not heard from yet)
    pauses: dict[tuple[int, str], LearnedPause] = field(default_factory=dict)  # pauses it resumed from
    run_id: str = ""  # the launch (mycroft.run.id) this state belongs to; "" when the ranks send none
    agents: dict[str, AgentState] = field(default_factory=dict)  # "host:pid" -> its node's agent (multi-node)
    memo: dict[str, Any] = field(default_factory=dict)  # the analysis' memos of slow-changing derived state

    def max_interval(self) -> float:
        return max((r.hb_interval for r in self.ranks.values()), default=1.0)


# --------------------------------------------------------------------------------------
# the fold
# --------------------------------------------------------------------------------------
def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _float(value: Any, default: float = 0.0) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _shared_list(value: Any) -> list[Any]:
    """A decoded list as it is (shared between heartbeats: read, never changed), else _list's copy."""
    return value if value.__class__ is list else _list(value)


def _group(job: JobState, gid: str, name: str, ranks_text: str | None, cfg: AnalysisConfig,
           ranks: Iterable[int] | None = None) -> GroupState | None:
    group = job.groups.get(gid)
    if group is None:
        if len(job.groups) >= cfg.max_groups_per_job:
            return None
        group = job.groups[gid] = GroupState(group_id=gid, name=name)
    if not group.ranks:
        if ranks is not None:
            group.ranks = tuple(sorted(ranks))
        elif ranks_text:
            try:
                group.ranks = tuple(schema.decode_ranks(ranks_text, job.world_size or None, cfg.max_ranks_per_job))
            except ValueError:
                group.ranks = ()
    if name and not group.name:
        group.name = name
    return group


def _rank_state(job: JobState, record: SpanRecord, rank: int, received_at: float) -> RankState:
    state = job.ranks.get(rank)
    resource = record.resource
    if state is not None and resource is state.resource:  # same process, same host: nothing to re-read
        if received_at > state.last_seen:
            state.last_seen = received_at
        return state
    pid = _int(resource.get(schema.RES_PROCESS_PID), 0)
    if state is None or (pid and state.pid and pid != state.pid):
        # new process for this rank (first sight or a restart): frontiers start over
        state = job.ranks[rank] = RankState(rank=rank, first_seen=received_at, hb_interval=job.hb_interval)
    state.pid = pid or state.pid
    state.host = str(resource.get(schema.RES_HOST_NAME, state.host))
    state.last_seen = max(state.last_seen, received_at)
    state.resource = resource
    return state


def _advance(frontier: dict[str, int], gid: str, seq: int) -> bool:
    if seq > frontier.get(gid, 0):
        frontier[gid] = seq
        return True
    return False


def _group_table(job: JobState, rank: RankState, a: dict[str, Any], cfg: AnalysisConfig) -> list[tuple[int, str]]:
    """The (index, group id) pairs of this heartbeat's group table that the job admits.

    Every heartbeat repeats the rank's table; when the decoder handed over the same list
    objects as last time (it shares values decoded from identical bytes) the table did not
    change and the groups it names exist already: nothing to look up again.
    """
    ids_v, names_v, members_v = a.get(schema.ATTR_HB_GROUP_IDS), a.get(schema.ATTR_HB_GROUP_NAMES), \
        a.get(schema.ATTR_HB_GROUP_RANKS)
    table = rank.hb_table
    if table is not None and table[0] is ids_v and table[1] is names_v and table[2] is members_v:
        return rank.hb_admitted
    ids = [str(x) for x in _list(ids_v)]
    names, members = _list(names_v), _list(members_v)
    descs = _list(a.get(schema.ATTR_HB_GROUP_DESCS))
    admitted: list[tuple[int, str]] = []
    settled = True  # every admitted group knows its members: the next identical table can be skipped
    for i, gid in enumerate(ids):
        name = str(names[i]) if i < len(names) else ""
        ranks_text = str(members[i]) if i < len(members) else None
        group = _group(job, gid, name, ranks_text, cfg)
        if group is None:
            settled = False  # the group cap may have room later
            continue
        if not group.desc and i < len(descs) and descs[i]:
            group.desc = str(descs[i])[:64]
        if ranks_text and not group.ranks:
            settled = False
        admitted.append((i, gid))
    if settled and isinstance(ids_v, list):
        rank.hb_table, rank.hb_admitted = (ids_v, names_v, members_v), admitted
    else:
        rank.hb_table = None
    return admitted


#: the trace budget's counts in a heartbeat -> the RankState field each folds into
_SPAN_COUNTS = ((schema.ATTR_HB_SPANS_KEPT, "spans_kept"), (schema.ATTR_HB_SPANS_ANOMALIES, "spans_anomalies"),
                (schema.ATTR_HB_SPANS_SAMPLED_OUT, "spans_sampled_out"))

# ends noticed after the fact (the Flight Recorder's frontier; a later op of the group completing)
_LATE_ENDS = frozenset({schema.TIMING_FLIGHT_RECORDER, schema.TIMING_INFERRED})

_STEADY_PHASES = frozenset({"", None, schema.PHASE_TRAINING})  # a client that sends no phase is training


def _apply_heartbeat(job: JobState, rank: RankState, record: SpanRecord, received_at: float,
                     cfg: AnalysisConfig) -> None:
    """Fold one heartbeat. The compiled fold (_fold_fast.c) takes the common one -- a running
    rank's, its group table the one it sent last, every value of its usual type -- and answers 0,
    having changed nothing, for any other; then this function is the definition."""
    a = record.attributes
    rank.posted_only = a.get(schema.ATTR_HB_POSTED_ONLY) is True
    # a device-async backend (NCCL) sends its Flight Recorder frontier: its ops run on after their call returns
    rank.device_async = schema.ATTR_HB_GROUP_FR_COMPLETED in a
    if _fold_fast is not None and rank.phase in _STEADY_PHASES and a.get(schema.ATTR_HB_PHASE) in _STEADY_PHASES:
        # start-up heartbeats, and the first one after them, take the Python fold (it reads the phase)
        folded = _fold_fast.fold(job, rank, a, received_at, record.end_ns, cfg.max_stack_chars,
                                 cfg.max_seqs_per_group)
        if folded:
            if folded == 2:
                _fold_digests_of(job, rank, a)
            return
    _apply_heartbeat_python(job, rank, record, received_at, cfg)


CONTRACT_REFUSED = "flow_table_contract"  # apply_records' `rejected` reason: flow tables off the contract, dropped


def _flow_tables_checked(records: Iterable[SpanRecord], rejected: dict[str, int] | None) -> Iterator[SpanRecord]:
    """The records, each heartbeat's native flow table checked against the typed contract first
    (schema.contract_problems): a table whose arrays are not of their types or not all of one length is
    dropped from the heartbeat (the rest of it is folded, by either fold alike) and counted in `rejected`,
    never read at the wrong index."""
    comms = schema.ATTR_HB_FLOW_COMMS
    for record in records:
        a = record.attributes
        if comms in a and schema.contract_problems(a, FLOW_TABLE_KEYS):
            for key in FLOW_TABLE_KEYS:
                a.pop(key, None)
            if rejected is not None:
                rejected[CONTRACT_REFUSED] = rejected.get(CONTRACT_REFUSED, 0) + 1
        yield record


def _apply_heartbeat_python(job: JobState, rank: RankState, record: SpanRecord, received_at: float,
                            cfg: AnalysisConfig) -> None:
    # the values' common types are tested first (`.__class__ is`): the conversions are the rare path
    a = record.attributes
    get = a.get
    counter = get(schema.ATTR_HB_COUNTER, -1)
    if counter.__class__ is not int:
        counter = _int(counter, -1)
    if counter >= 0 and counter < rank.hb_counter and received_at <= rank.last_hb_at:
        return  # an older heartbeat delivered late: the newer snapshot stands
    job.heartbeats += 1
    rank.hb_counter = counter
    if received_at > rank.last_hb_at:
        rank.last_hb_at = received_at
    interval = get(schema.ATTR_HB_INTERVAL_S)
    if interval.__class__ is not float:
        interval = _float(interval, rank.hb_interval)
    if interval:
        rank.hb_interval = interval
    job.hb_interval = rank.hb_interval
    if not rank.final:
        rank.final = bool(get(schema.ATTR_HB_FINAL, False))
    if rank.final:
        rank.exit_reason = str(get(schema.ATTR_HB_EXIT_REASON, rank.exit_reason or "exit"))
    phase = get(schema.ATTR_HB_PHASE)
    if phase is not None:
        rank.phase = str(phase)[:32]
        rank.phase_s = _float(get(schema.ATTR_HB_PHASE_S, 0.0))
    idle = get(schema.ATTR_HB_IDLE_S)
    rank.idle_s = idle if idle.__class__ is float else _float(idle)
    rank.idle_observed_at = received_at
    stack = get(schema.ATTR_HB_STACK, "")
    if stack.__class__ is not str:
        stack = str(stack)
    rank.stack = stack if len(stack) <= cfg.max_stack_chars else stack[-cfg.max_stack_chars:]
    threads = get(schema.ATTR_HB_THREAD_STACKS)
    rank.thread_stacks = "" if threads is None else str(threads)[:cfg.max_stack_chars]
    comm = get(schema.ATTR_HB_COMM_S)
    if comm is not None:
        at = record.end_ns / 1e9
        work = rank.work
        if not work or at > work[-1][0]:
            done = get(schema.ATTR_HB_OPS_DONE)
            work.append((at, comm if comm.__class__ is float else _float(comm),
                         done if done.__class__ is int else _int(done)))
    step = get(schema.ATTR_HB_STEP)
    if step is not None:
        rank.step = _int(step)
    dropped = get(schema.ATTR_HB_DROPPED)
    if dropped is not None:
        rank.dropped = dropped if dropped.__class__ is int else _int(dropped, rank.dropped)
    for key, name in _SPAN_COUNTS:
        count = get(key)
        if count is not None:
            setattr(rank, name, count if count.__class__ is int else _int(count, getattr(rank, name)))

    issued = _shared_list(get(schema.ATTR_HB_GROUP_ISSUED))
    completed = _shared_list(get(schema.ATTR_HB_GROUP_COMPLETED))
    n_issued, n_completed = len(issued), len(completed)
    rank_issued, rank_completed = rank.issued, rank.completed
    for i, gid in _group_table(job, rank, a, cfg):
        if i < n_issued:
            seq = issued[i]
            if seq.__class__ is not int:
                seq = _int(seq)
            if seq > rank_issued.get(gid, 0):
                rank_issued[gid] = seq
        if i < n_completed:
            seq = completed[i]
            if seq.__class__ is not int:
                seq = _int(seq)
            if seq > rank_completed.get(gid, 0):
                rank_completed[gid] = seq
                job.last_progress_at = received_at
                job.completions += 1

    gids = get(schema.ATTR_HB_INFLIGHT_GROUP_IDS)
    rank.inflight = _inflight(job, rank, a, _shared_list(gids), received_at, cfg) if gids else []
    flow_keys = a.keys() & FLOW_KEYS  # a set operation in C instead of a prefix test per key
    rank.flows = {key: _list(a[key]) for key in flow_keys} if flow_keys else {}
    digest_gids = a.get(schema.ATTR_HB_DIGEST_GROUP_IDS)
    if digest_gids:
        _fold_digests(job, rank, a, _list(digest_gids))
    if flow_keys or rank.flow_history:  # beats without flows count too: old marks age out
        rank.flow_history.append([rank.flows or None, None])  # marks: computed only when a pass needs them


DIGEST_BLOCKS_KEPT = 8  # per group


def _fold_digests(job: JobState, rank: RankState, a: dict[str, Any], gids: list[Any]) -> None:
    """A heartbeat's closed signature-digest blocks, into their groups (members only, bounded)."""
    blocks, values = _list(a.get(schema.ATTR_HB_DIGEST_BLOCKS)), _list(a.get(schema.ATTR_HB_DIGEST_VALUES))
    for gid, block, value in zip(gids, blocks, values, strict=False):
        group = job.groups.get(str(gid))
        if group is None:
            continue
        block, value = _int(block, -1), _int(value, -1)
        if block < 0 or value < 0:
            continue
        seen = group.digests.get(block)
        if seen is None:
            if len(group.digests) >= DIGEST_BLOCKS_KEPT:
                oldest = min(group.digests)
                if block < oldest:
                    continue
                del group.digests[oldest]
            seen = group.digests[block] = {}
        if len(seen) < len(group.ranks) or rank.rank in seen:  # at most one digest per member
            seen[rank.rank] = value


_INFLIGHT_ARRAYS = (schema.ATTR_HB_INFLIGHT_SEQS, schema.ATTR_HB_INFLIGHT_OPS, schema.ATTR_HB_INFLIGHT_AGES_S,
                    schema.ATTR_HB_INFLIGHT_PEERS, schema.ATTR_HB_INFLIGHT_BYTES, schema.ATTR_HB_INFLIGHT_DTYPES,
                    schema.ATTR_HB_INFLIGHT_RETURNED)


def _inflight(job: JobState, rank: RankState, a: dict[str, Any], gids: list[Any], received_at: float,
              cfg: AnalysisConfig) -> list[InFlight]:
    """The heartbeat's in-flight ops (parallel arrays) that the rank's own spans have not already
    said completed (_done; its frontiers are folded first); collectives also advance the issued
    frontier and leave their signature at their seq (a mismatch that hangs shows there). Decoded
    values are shared between heartbeats: read, never changed."""
    seqs, ops, ages, peers, sizes, dtypes, returns = map(_shared_list, map(a.get, _INFLIGHT_ARRAYS))
    n_seqs, n_ops, n_ages, n_peers, n_sizes, n_dtypes = map(len, (seqs, ops, ages, peers, sizes, dtypes))
    n_returns = len(returns)
    inflight: list[InFlight] = []
    groups, issued, me = job.groups, rank.issued, rank.rank
    for i, gid in enumerate(gids):
        if gid.__class__ is not str:
            gid = str(gid)
        seq = seqs[i] if i < n_seqs else 0
        if seq.__class__ is not int:
            seq = _int(seq)
        name = ops[i] if i < n_ops else ""
        if name.__class__ is not str:
            name = str(name)
        age = ages[i] if i < n_ages else 0.0
        if age.__class__ is not float:
            age = _float(age)
        peer = peers[i] if i < n_peers else -1
        if peer.__class__ is not int:
            peer = _int(peer, -1)
        size = sizes[i] if i < n_sizes else 0
        if size.__class__ is not int:
            size = _int(size)
        op = InFlight(gid, seq, name, age, peer, size, received_at, i < n_returns and returns[i] is True)
        if not _done(rank, op):
            inflight.append(op)
        if peer >= 0:
            key = _p2p_key(gid, me, peer, name)
            rank.p2p_issued[key] = max(rank.p2p_issued.get(key, 0), seq)
            continue
        _advance(issued, gid, seq)
        group = groups.get(gid)
        if group is not None:
            rec = _seq_record(group, seq, cfg)
            if me not in rec.sigs:
                dtype = dtypes[i] if i < n_dtypes else ""
                rec.sigs[me] = (name, size, dtype if dtype.__class__ is str else str(dtype))
                rec.version += 1
                group.version += 1
    return inflight


def _done(rank: RankState, op: InFlight) -> bool:
    """The op's own span already said it completed: a heartbeat snapshot is older than that."""
    if op.is_p2p:
        return rank.p2p_completed.get(_p2p_key(op.group_id, rank.rank, op.peer, op.op), 0) >= op.seq
    return rank.completed.get(op.group_id, 0) >= op.seq


def _p2p_key(gid: str, rank: int, peer: int, op: str) -> P2PKey:
    return (gid, rank, peer) if op == schema.OP_SEND else (gid, peer, rank)


def _seq_record(group: GroupState, seq: int, cfg: AnalysisConfig) -> SeqRecord:
    rec = group.seqs.get(seq)
    if rec is None:
        rec = group.seqs[seq] = SeqRecord()
        if len(group.seqs) > cfg.max_seqs_per_group:
            del group.seqs[min(group.seqs)]  # keep a window of the newest sequence numbers
    return rec


def _apply_op_span(job: JobState, rank: RankState, record: SpanRecord, received_at: float,
                   cfg: AnalysisConfig) -> None:
    a = record.attributes
    gid = str(a.get(schema.ATTR_GROUP_ID, ""))
    seq = _int(a.get(schema.ATTR_SEQ))
    op = str(a.get(schema.ATTR_OP, record.name))
    state = str(a.get(schema.ATTR_STATE, schema.STATE_COMPLETED))
    done = state == schema.STATE_COMPLETED
    if record.kind == schema.KIND_P2P:
        src = _int(a.get(schema.ATTR_P2P_SRC), -1)
        dst = _int(a.get(schema.ATTR_P2P_DST), -1)
        key = (gid, src, dst)
        rank.p2p_issued[key] = max(rank.p2p_issued.get(key, 0), seq)
        if done:
            rank.timeline.append((record.start_ns / 1e9, record.end_ns / 1e9, gid, -seq))
            rank.p2p_completed[key] = max(rank.p2p_completed.get(key, 0), seq)
            job.last_progress_at = received_at
            rank.inflight = [op for op in rank.inflight if not _done(rank, op)]
        elif state == schema.STATE_ERROR:
            rank.errors.append((gid, seq, op, str(a.get(schema.ATTR_ERROR, record.status_message))))
        return
    group = _group(job, gid, str(a.get(schema.ATTR_GROUP_NAME, "")), str(a.get(schema.ATTR_GROUP_RANKS, "")),
                   cfg)
    if group is None or seq <= 0:
        return
    if not group.desc:
        group.desc = str(a.get(schema.ATTR_GROUP_DESC, ""))[:64]
    _advance(rank.issued, gid, seq)
    rec = _seq_record(group, seq, cfg)
    rec.version += 1
    group.op_spans += 1
    group.op_seqs[seq] = None
    if len(group.op_seqs) > 2 * cfg.max_seqs_per_group:
        group.op_seqs = dict.fromkeys(s for s in group.op_seqs if s in group.seqs)
    group.version += 1
    me = rank.rank
    # a span built from the Flight Recorder (C++-issued: DDP buckets, ...) names the dtype of the entry's first
    # input as torch recorded it, not what the caller passed: not compared (op and bytes are). A DDP job with a
    # blocked rank paged a false dtype mismatch at a bucket's seq (test_srun)
    dtype = "" if a.get(schema.ATTR_SOURCE) == schema.SOURCE_FLIGHT_RECORDER else str(a.get(schema.ATTR_DTYPE, ""))
    sig = (op, _int(a.get(schema.ATTR_BYTES)), dtype)
    if rec.sigs.get(me, sig) != sig or rec.states.get(me, state) != state:
        rec.rewrites += 1  # what the member said here changed (not only added to): re-read it all
    rec.sigs[me] = sig
    rec.starts[me] = record.start_ns / 1e9
    rec.states[me] = state
    if done:
        rank.timeline.append((record.start_ns / 1e9, record.end_ns / 1e9, gid, seq))
        rec.ends[rank.rank] = record.end_ns / 1e9
        duration = max(0.0, (record.end_ns - record.start_ns) / 1e9)
        group.durations.append(duration)
        if a.get(schema.ATTR_TIMING) not in _LATE_ENDS and seq > cfg.hang_warmup_seqs:
            group.timed.append(duration)
        if _advance(rank.completed, gid, seq):
            job.last_progress_at = received_at
            job.completions += 1
            rank.inflight = [op for op in rank.inflight if not _done(rank, op)]
    elif state == schema.STATE_ERROR or state == schema.STATE_TIMEOUT:
        rank.errors.append((gid, seq, op, str(a.get(schema.ATTR_ERROR, record.status_message))))


def apply_records(jobs: dict[str, JobState], records: Iterable[SpanRecord], received_at: float,
                  cfg: AnalysisConfig, *, use_span_time: bool = False, rejected: dict[str, int] | None = None,
                  evicted: list[str] | None = None) -> int:
    """Fold records into per-job state; returns how many were used.

    Records without a rank or job (collector summaries, foreign spans) are skipped;
    records outside the bounds of admission.py are refused and counted in `rejected`
    by reason. Jobs dropped to make room (max_jobs) are appended to `evicted`.
    With use_span_time (offline replay) each record counts as received at its end time.
    """
    used = 0
    # the job of each distinct (interned) resource facts, as of this call: a batch of 512 ranks'
    # heartbeats of one job looks its job up once (checked still current: a later record may evict it)
    jobs_by_facts: dict[int, JobState] = {}
    records = _flow_tables_checked(records, rejected)
    for first in records:
        record: SpanRecord | None = first
        while record is not None:
            taken, run = _apply_record(jobs, jobs_by_facts, record, received_at, cfg, use_span_time, rejected, evicted)
            used += taken
            record = None
            if run is not None and _fold_fast is not None:
                # the heartbeats that follow in the same run (same job, processes already admitted
                # on the same values) go to the compiled fold, without a Python step per record
                job, facts = run
                folded, record = _fold_fast.fold_run(records, job, facts, admission.RESOURCE_FACTS, received_at,
                                                     cfg.max_stack_chars, cfg.max_seqs_per_group,
                                                     _apply_heartbeat_python, _fold_digests_of, cfg)
                used += folded
    return used


_FOLDED_KINDS = (schema.KIND_HEARTBEAT, schema.KIND_COLLECTIVE, schema.KIND_P2P)


def _apply_record(jobs: dict[str, JobState], jobs_by_facts: dict[int, JobState], record: SpanRecord,
                  received_at: float, cfg: AnalysisConfig, use_span_time: bool, rejected: dict[str, int] | None,
                  evicted: list[str] | None) -> tuple[int, tuple[JobState, admission.Facts] | None]:
    """apply_records for one record: (1 if used else 0, and (its job, its facts) when it was a
    heartbeat admitted on the values admitted last time, which the compiled fold's run continues)."""
    a = record.attributes
    kind = a.get(schema.ATTR_SPAN_KIND, "")
    if kind not in _FOLDED_KINDS:
        if kind == schema.KIND_AGENT:
            return _apply_agent(jobs, record, received_at, cfg, use_span_time, rejected, evicted), None
        return 0, None
    rank_id = a.get(schema.ATTR_RANK)
    if type(rank_id) is not int:  # the common case is an int attribute; else SpanRecord's rules
        rank_id = record.rank
    if rank_id is None or rank_id < 0:
        return 0, None
    resource = record.resource
    facts = admission.resource_facts(resource)
    world = facts[2]
    job = prior = None
    checked = None
    memo_ok = not use_span_time and schema.RES_JOB_ID not in a  # the record's job follows from its facts
    if memo_ok:
        job = jobs_by_facts.get(id(facts))
        if job is not None and jobs.get(job.job_id) is not job:
            job = None
        if job is not None:
            prior = job.ranks.get(rank_id)
            if prior is not None and prior.resource is not resource:
                prior = None  # another process (or host) of this rank: nothing of the last one holds
    if kind == schema.KIND_HEARTBEAT:
        checked = admission.heartbeat_checked(a)
    shortcut = prior is not None and checked is not None and checked == prior.hb_checked
    if shortcut:
        reason = None  # what admission reads equals what it admitted of this process last time
    else:
        reason = admission.reject_reason(record, rank_id, cfg, world, prior.hb_checked if prior else None)
    if reason is not None:
        if rejected is not None:
            rejected[reason] = rejected.get(reason, 0) + 1
        return 0, None
    at = record.end_ns / 1e9 if use_span_time else received_at
    if job is None:
        job = _job_for(jobs, record, at, cfg, evicted, facts)
        if memo_ok:
            jobs_by_facts[id(facts)] = job
    if rank_id not in job.ranks and len(job.ranks) >= cfg.max_ranks_per_job:
        job.dropped_records += 1
        return 0, None
    if at > job.last_seen:
        job.last_seen = at
    if world > job.world_size:
        job.world_size = world
    if prior is not None:  # _rank_state's first case, inline
        rank = prior
        if at > rank.last_seen:
            rank.last_seen = at
    else:
        rank = _rank_state(job, record, rank_id, at)
    if checked is None:
        job.spans += 1
        _apply_op_span(job, rank, record, at, cfg)
        return 1, None
    _apply_heartbeat(job, rank, record, at, cfg)
    rank.hb_checked = checked
    return 1, (job, facts) if shortcut and memo_ok else None


MAX_AGENT_HOSTS = 4096  # hosts kept of an agent's lists (a job of more nodes is named by counts)


def _hosts(value: Any) -> tuple[str, ...]:
    return tuple(str(h)[:255] for h in _list(value)[:MAX_AGENT_HOSTS] if isinstance(h, str))


def _apply_agent(jobs: dict[str, JobState], record: SpanRecord, received_at: float, cfg: AnalysisConfig,
                 use_span_time: bool, rejected: dict[str, int] | None, evicted: list[str] | None) -> int:
    """Fold one agent span (schema.KIND_AGENT) into its job's agents; 1 if used."""
    a, resource = record.attributes, record.resource
    host = str(resource.get(schema.RES_HOST_NAME, "") or "")[:255]
    pid = _int(resource.get(schema.RES_PROCESS_PID), -1)
    nodes_min, nodes_max = _int(a.get(schema.ATTR_AGENT_NODES_MIN), -1), _int(a.get(schema.ATTR_AGENT_NODES_MAX), -1)
    limit = cfg.max_ranks_per_job
    if not host or pid < 0 or not 0 <= nodes_min <= limit or not 0 <= nodes_max <= limit:
        if rejected is not None:
            rejected[admission.REJECT_BAD_AGENT] = rejected.get(admission.REJECT_BAD_AGENT, 0) + 1
        return 0
    at = record.end_ns / 1e9 if use_span_time else received_at
    job = _job_for(jobs, record, at, cfg, evicted, admission.resource_facts(resource))
    key = f"{host}:{pid}"
    agent = job.agents.get(key)
    if agent is None:
        if len(job.agents) >= cfg.max_ranks_per_job:
            job.dropped_records += 1
            return 0
        agent = job.agents[key] = AgentState(host, pid)
    node_rank = _int(resource.get(schema.RES_NODE_RANK), -1)
    agent.node_rank = node_rank if 0 <= node_rank < max(nodes_max, 1) else -1
    agent.backend = str(a.get(schema.ATTR_AGENT_RDZV_BACKEND, "") or "")[:64]
    agent.nodes_min, agent.nodes_max = nodes_min, nodes_max
    agent.joined = max(-1, min(_int(a.get(schema.ATTR_AGENT_NODES_JOINED), -1), cfg.max_ranks_per_job))
    agent.joined_hosts = _hosts(a.get(schema.ATTR_AGENT_JOINED_HOSTS))
    agent.expected_hosts = _hosts(a.get(schema.ATTR_AGENT_EXPECTED_HOSTS))
    agent.phase_s = max(0.0, _float(a.get(schema.ATTR_HB_PHASE_S)))
    agent.interval_s = min(max(_float(a.get(schema.ATTR_HB_INTERVAL_S), 1.0), 0.01), 3600.0)
    agent.last_at = at
    agent.done = a.get(schema.ATTR_HB_FINAL) is True
    if at > job.last_seen:
        job.last_seen = at
    return 1


def _fold_digests_of(job: JobState, rank: RankState, a: dict[str, Any]) -> None:
    _fold_digests(job, rank, a, _list(a.get(schema.ATTR_HB_DIGEST_GROUP_IDS)))


def _job_for(jobs: dict[str, JobState], record: SpanRecord, at: float, cfg: AnalysisConfig,
             evicted: list[str] | None, facts: admission.Facts) -> JobState:
    """The state of the record's run (`facts`: its resource's): a second live run under the same
    job id gets its own."""
    job_attr = record.attributes.get(schema.RES_JOB_ID)
    resource_job, run, world = facts
    key = job_id = resource_job if job_attr is None else str(job_attr)
    job = jobs.get(key)
    if job is not None and not admission.same_run(job.run_id, job.world_size, run, world):
        quiet = at - job.last_seen > admission.QUIET_INTERVALS * job.max_interval()
        if quiet or admission.is_relaunch(job.run_id, run):
            del jobs[key]  # the old run ended: this one takes its place (and its incidents resolve or move on)
            job = None
        else:
            key = admission.job_key(job_id, run, world)
            job = jobs.get(key)
    if job is None:
        if len(jobs) >= cfg.max_jobs:
            oldest = min(jobs.values(), key=lambda j: j.last_seen)
            del jobs[oldest.job_id]
            if evicted is not None:
                evicted.append(oldest.job_id)
        job = jobs[key] = JobState(job_id=key, first_seen=at, last_progress_at=at, run_id=run)
    elif run and not job.run_id:
        job.run_id = run
    return job


def expire_jobs(jobs: dict[str, JobState], now: float, cfg: AnalysisConfig) -> list[str]:
    """Drop jobs silent for longer than the TTL; returns their ids."""
    gone = [job_id for job_id, job in jobs.items() if now - job.last_seen > cfg.job_ttl_s]
    for job_id in gone:
        del jobs[job_id]
    return gone


#: the heartbeat keys the compiled fold reads, in its order (_fold_fast.c, enum K_*)
COMPILED_FOLD_KEYS = (
    schema.ATTR_HB_COUNTER, schema.ATTR_HB_INTERVAL_S, schema.ATTR_HB_FINAL, schema.ATTR_HB_IDLE_S,
    schema.ATTR_HB_STACK, schema.ATTR_HB_COMM_S, schema.ATTR_HB_OPS_DONE, schema.ATTR_HB_STEP,
    schema.ATTR_HB_DROPPED, schema.ATTR_HB_GROUP_ISSUED, schema.ATTR_HB_GROUP_COMPLETED, schema.ATTR_HB_GROUP_IDS,
    schema.ATTR_HB_GROUP_NAMES, schema.ATTR_HB_GROUP_RANKS, schema.ATTR_HB_INFLIGHT_GROUP_IDS,
    *_INFLIGHT_ARRAYS, schema.ATTR_HB_DIGEST_GROUP_IDS,
    schema.ATTR_HB_SPANS_KEPT, schema.ATTR_HB_SPANS_ANOMALIES, schema.ATTR_HB_SPANS_SAMPLED_OUT,
    schema.ATTR_HB_THREAD_STACKS)
if _fold_fast is not None:
    _fold_fast.configure(COMPILED_FOLD_KEYS, tuple(sorted(FLOW_KEYS)), schema.OP_SEND, InFlight, SeqRecord,
                         (schema.ATTR_SPAN_KIND, schema.KIND_HEARTBEAT, schema.ATTR_RANK, schema.RES_JOB_ID,
                          *admission.HEARTBEAT_CHECKED))
