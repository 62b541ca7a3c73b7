"""The ingest fast path and the bounded analysis give the verdicts of the plain path.

The receivers decode with a DecodeCache (values shared between records decoded from the
same bytes); the fold then skips what did not change (same objects), and the analysis
memoizes what did not change since the last pass. These tests run scenarios both ways —
records folded as built, and records that went over the wire through a DecodeCache — and
check the memos against changes that must invalidate them.
"""

from __future__ import annotations

import copy
import math
import random

import pytest
from mycroft.rca_service.analysis import graph as wfg
from mycroft.rca_service.analysis import graph_view, slowness
from mycroft.rca_service.analysis.rank_table import rank_table
from mycroft.rca_service.analysis.triggers import (
    _complete_seqs,
    _complete_seqs_since,
    _newest_seqs,
    find_mismatches,
    hang_sweep,
    hang_threshold,
    hung_ranks,
    statuses,
)
from mycroft.rca_service.analysis.work_table import _work_window, work_table
from mycroft.rca_service.config import AnalysisConfig
from mycroft.rca_service.incidents.engine import Engine
from mycroft.rca_service.ingest.state import GroupState, JobState, RankState, SeqRecord, _apply_op_span, _seq_record
from mycroft.rca_service.service import pass_wait

from mycroft import schema
from mycroft.faults.made_up_job import Group, InFlightOp, StepJob, collective, heartbeat, p2p
from mycroft.otlp import DecodeCache, SpanRecord, request_from_records


class WireEngine(Engine):
    """An Engine fed like the live service: every batch serialized and decoded with one DecodeCache."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = DecodeCache()

    def ingest(self, records, received_at, **kwargs):  # type: ignore[no-untyped-def,override]
        wire = self.cache.decode(request_from_records(list(records)).SerializeToString())
        return super().ingest(wire, received_at, **kwargs)


def _scenario(engine: Engine, kind: str) -> list[tuple[str, list[tuple[object, object]]]]:
    job = StepJob("job", 4)
    for _ in range(20):
        engine.ingest(job.steps(1), job.now)
        engine.ingest(job.heartbeats(job.now, not_entered=range(4), stack=""), job.now)
        engine.step(job.now)
    t = job.now
    for k in range(8):
        at = t + 0.5 * k
        if kind == "hang":
            engine.ingest(job.heartbeats(at, not_entered=[2]), at)
        elif kind == "lost":
            engine.ingest(job.heartbeats(at, not_entered=[1], silent=[1]), at)
        elif kind == "mismatch" and k == 1:
            nxt = job.seq + 1
            engine.ingest([heartbeat("job", r, 4, at, 900 + k, [job.group], [nxt], [job.seq],
                                     [InFlightOp(job.group, nxt, op=schema.OP_BROADCAST if r == 3 else
                                                 schema.OP_ALL_REDUCE, age_s=0.05)]) for r in range(4)], at)
        engine.step(at)
    return sorted((i.kind, [(c.get("kind"), c.get("rank")) for c in i.root_causes])
                  for i in engine.tracker.active.values())


def test_wire_path_reaches_the_plain_paths_verdicts() -> None:
    for kind, expected in (("hang", ("hang", 2)), ("lost", ("hang", 1)), ("mismatch", ("mismatch", 3))):
        plain, wire = _scenario(Engine(), kind), _scenario(WireEngine(), kind)
        assert plain == wire, kind
        assert plain and plain[0][0] == expected[0] and plain[0][1][0][1] == expected[1], (kind, plain)


def test_a_changed_group_table_after_identical_ones_is_folded() -> None:
    engine = WireEngine()
    tp, world = Group("tp0", (0, 1)), Group("world", (0, 1, 2, 3))
    for counter in (1, 2):  # the same table twice: the second is skipped as unchanged
        engine.ingest([heartbeat("job", 0, 4, 10.0 + counter, counter, [tp], [5], [5])], 10.0 + counter)
    engine.ingest([heartbeat("job", 0, 4, 13.0, 3, [tp, world], [6, 7], [6, 7])], 13.0)
    state = engine.jobs["job"]
    assert set(state.groups) == {tp.id, world.id}
    assert state.groups[world.id].ranks == (0, 1, 2, 3)
    assert state.ranks[0].completed == {tp.id: 6, world.id: 7}


def test_a_clean_seq_that_changes_is_checked_again() -> None:
    engine = Engine()
    group = Group("g", (0, 1, 2))
    engine.ingest([collective("job", r, 3, group, 1, 1.0, 1.1) for r in range(2)], 1.2)
    state = engine.jobs["job"]
    assert find_mismatches(state) == [] and state.groups[group.id].seqs[1].clean is not None
    assert find_mismatches(state) == []  # memoized
    engine.ingest([collective("job", 2, 3, group, 1, 1.0, 1.1, nbytes=999)], 1.3)
    found = find_mismatches(state)
    assert [sorted(m.minority) for m in found] == [[2]] and found[0].field == "bytes"


def test_a_dtype_tie_of_two_members_names_the_one_that_broke_with_the_groups_history() -> None:
    """A 2-rank TP group: one float64 against one float32, the float64 rank issuing first; the
    group always all-reduced float32 before, so the float64 rank is the one that diverged."""
    from mycroft.rca_service.ingest.state import GroupState, JobState, SeqRecord

    job = JobState("job")
    group = job.groups["tp"] = GroupState("tp", "tp", (356, 357))
    for seq in range(1, 6):
        group.seqs[seq] = SeqRecord(sigs={356: ("all_reduce", 1 << 20, "float32"),
                                          357: ("all_reduce", 1 << 20, "float32")})
    group.seqs[6] = SeqRecord(sigs={356: ("all_reduce", 1 << 20, "float64"), 357: ("all_reduce", 1 << 20, "float32")})
    found = find_mismatches(job)
    assert [(sorted(m.minority), m.field) for m in found] == [([356], "dtype")]
    group.seqs[6] = SeqRecord(sigs={357: ("all_reduce", 1 << 20, "float32"), 356: ("all_reduce", 1 << 20, "float64")})
    job.memo.clear()
    assert [sorted(m.minority) for m in find_mismatches(job)] == [[356]]


def test_work_windows_are_reused_until_a_heartbeat_adds_a_sample() -> None:
    cfg = AnalysisConfig()
    engine = Engine(cfg)
    job = StepJob("job", 2)
    records: list[SpanRecord] = []
    for k in range(cfg.imbalance_beats + 4):
        records = job.heartbeats(job.now + k, not_entered=range(2), stack="")
        for i, r in enumerate(records):
            r.attributes[schema.ATTR_HB_COMM_S] = 0.3 * k + 0.01 * i
            r.attributes[schema.ATTR_HB_OPS_DONE] = 10 * (k + 1)
        engine.ingest(records, job.now + k)
    rank = engine.jobs["job"].ranks[0]
    first = slowness.work_window(rank, cfg, cfg.slow_recent_beats)
    assert first is not None and slowness.work_window(rank, cfg, cfg.slow_recent_beats) is first
    later = job.now + 100
    records[0].end_ns = int(later * 1e9)
    records[0].attributes[schema.ATTR_HB_COMM_S] = 0.3 * 12 + 90.0  # a much busier interval
    records[0].attributes[schema.ATTR_HB_OPS_DONE] = 10_000
    engine.ingest(records[:1], later)
    again = slowness.work_window(rank, cfg, cfg.slow_recent_beats)
    assert again is not None and again.recent_span[1] == later and again.recent < first.recent


def test_analysis_passes_are_spaced_to_their_share_of_a_core() -> None:
    assert pass_wait(0.01, 0.2, 0.2) == 0.2  # cheap passes: every tick
    assert abs(pass_wait(0.15, 0.2, 0.2) - 0.6) < 1e-9  # a 0.15 s pass held to 20% of a core
    assert pass_wait(0.5, 0.2, 0.0) == 0.2  # no bound


def _graph_facts(wf: wfg.WaitForGraph, found: list[wfg.Sink]) -> tuple[object, ...]:
    return (sorted(wf.graph.edges, key=str), sorted(wf.data_sinks, key=str), sorted(wf.waiting),
            [(s.nodes, s.path, s.longest, s.blast) for s in found])


@pytest.mark.parametrize("sweeps", ["mixed", "rank table"])
def test_the_wait_for_graph_is_reused_only_while_what_it_was_built_from_holds(sweeps: str) -> None:
    """Pass after pass, the memoized graph (wfg.wait_for) is the one build() and sinks() make
    from scratch: while a hang stands still it is reused; a rank that issues its op (its
    frontier moves, not the shape of the ops in flight), one in another op, one that goes
    silent and one that restarts each change it. The graph takes its ranks from no sweep, the
    per-rank one or the rank table's (whose shape epochs replace comparing the ops)."""
    cfg = AnalysisConfig()
    engine = Engine(cfg)
    world = tuple(range(6))
    tps = [Group(f"tp{i}", (2 * i, 2 * i + 1)) for i in range(3)]
    everyone = Group("world", world)
    t0 = 100.0

    def beat(r: int, at: float, k: int, pid: int | None = None) -> SpanRecord:
        tp = tps[r // 2]
        groups = [tp, everyone]
        if r in (2, 3):  # tp1: rank 3 has not entered seq 11 (it issues it at k 4, in flight from 5); 2 waits for it
            ops = [] if r == 3 and k < 5 else [InFlightOp(tp, 11, age_s=at - t0 + 0.5)]
            record = heartbeat("job", r, 6, at, k, groups, [11 if ops or k == 4 else 10, 10], [10, 10], ops,
                               idle_s=0.0 if ops else at - t0, stack="" if ops else "  File \"x.py\", line 1, in f")
        else:  # done with their tp seq 11, waiting in the world all-reduce 11 for ranks 2 and 3
            seq = 12 if r == 4 and k in (8, 9) else 11  # (rank 4 reports another op for two beats: same ranks graphed)
            record = heartbeat("job", r, 6, at, k, groups, [11, seq], [11, 10],
                               [InFlightOp(everyone, seq, age_s=at - t0 + 0.5)])
        if pid is not None:
            record.resource = {**record.resource, schema.RES_PROCESS_PID: pid}
        return record

    graphs = []
    for k in range(14):
        at = t0 + 0.5 * k
        silent = {5} if 6 <= k < 11 else set()
        engine.ingest([beat(r, at, k, pid=7777 if r == 5 and k >= 11 else None)
                       for r in world if r not in silent], at)
        job = engine.jobs["job"]
        status = statuses(job, at, cfg)
        hung = hung_ranks(job, status, at, hang_threshold(job, cfg), cfg)
        if not hung:
            continue
        fresh_after = at - max(hung.values())
        plain = wfg.build(job, status, hung, at, cfg, fresh_after)
        # the graph takes the trigger's ranks: of the per-rank sweep, or of the rank table (with shape epochs)
        table = rank_table(job)
        sweep = [None, hang_sweep(job, status, at, hang_threshold(job, cfg), cfg),
                 table.hang_sweep(job, table.statuses(job, at, cfg), at, hang_threshold(job, cfg), cfg)][
            k % 3 if sweeps == "mixed" else 2]
        memo = wfg.wait_for(job, status, hung, at, cfg, fresh_after, sweep)
        assert _graph_facts(*memo) == _graph_facts(plain, wfg.sinks(plain)), k
        causes = [{"rank": s.nodes[0][1], "kind": "x"} for s in memo[1] if s.nodes[0][0] == "r"]
        for _ in range(2):  # drawn from scratch, then from what was kept on the graph: the same drawing
            assert graph_view.hang_view(*memo, job, causes, at, fresh_after) == \
                graph_view.hang_view(plain, wfg.sinks(plain), job, causes, at, fresh_after), k
        graphs.append((k, memo[0].graph))
    built = {k: g for k, g in graphs}
    assert built[2] is built[3], "a hang that stands still reuses its graph"
    assert built[4] is not built[3], "rank 3 issued its op: rank 2's op has no blocker any more"
    assert built[8] is not built[7], "rank 4 is in another op: its edge changed"
    assert len({id(g) for g in built.values()}) >= 5, "rank 5's silence and restart change the graph"


def test_a_p2p_peer_that_issues_its_half_changes_the_memoized_graph() -> None:
    """Only the peer's frontier moves (its recv's span arrives; no heartbeat changes shape):
    the edge out of the p2p op is checked again and the graph rebuilt."""
    cfg = AnalysisConfig()
    engine = Engine(cfg)
    pair = Group("pp", (0, 1))
    sinks = {}
    for k in range(8):
        at = 50.0 + 0.5 * k
        send = InFlightOp(pair, 1, op=schema.OP_SEND, peer=1, age_s=0.5 * k + 0.5)
        records = [heartbeat("job", 0, 2, at, k, [pair], [0], [0], [send]),
                   heartbeat("job", 1, 2, at, k, [pair], [0], [0], idle_s=0.5 * k, stack="  File \"x.py\", line 1")]
        if k == 5:
            records.append(p2p("job", 1, 2, pair, schema.OP_RECV, 0, 1, at - 0.2, at - 0.1))
        engine.ingest(records, at)
        job = engine.jobs["job"]
        status = statuses(job, at, cfg)
        hung = hung_ranks(job, status, at, hang_threshold(job, cfg), cfg)
        if hung:
            fresh_after = at - max(hung.values())
            memo = wfg.wait_for(job, status, hung, at, cfg, fresh_after)
            plain = wfg.build(job, status, hung, at, cfg, fresh_after)
            assert _graph_facts(*memo) == _graph_facts(plain, wfg.sinks(plain)), k
            sinks[k] = [s.nodes for s in memo[1]]
    assert sinks[4] == [[("r", 1)]] and sinks[5] != sinks[4], sinks  # the receiver issued: not the sink any more


def _windows_agree(job: JobState, cfg: AnalysisConfig) -> int:
    """Every rank's window in the work table is the one work_window() computes (repr: exact, nan too)."""
    table = work_table(job, cfg)
    compared = 0
    for beats in sorted({cfg.straggle_fast_beats, cfg.slow_recent_beats, cfg.imbalance_beats, cfg.slow_link_beats}):
        windows = table.windows(beats)
        for row, rank in enumerate(table.ranks):
            expected = _work_window(rank, cfg, beats)
            assert repr(windows.window(row)) == repr(expected), (rank.rank, beats)
            compared += expected is not None
    return compared


def test_the_work_table_computes_every_ranks_window_as_work_window_does() -> None:
    """Refreshed pass after pass through awkward histories: ranks that join late, a restart, a rank
    whose ops count goes back to zero, one that stalls (no op completes), comm time that runs
    backwards or is not a number, and more samples between two refreshes than a deque holds."""
    cfg = AnalysisConfig()
    engine = Engine(cfg)
    job = StepJob("job", 6)
    rng = random.Random(7)
    compared = 0
    comm = dict.fromkeys(range(6), 0.0)
    ops = dict.fromkeys(range(6), 0)
    for k in range(90):
        at = 100.0 + k
        records = []
        for r in range(6):
            if r == 5 and k < 12:
                continue  # joins late
            pid = 4242 if r == 4 and k >= 30 else None  # restarts: a new RankState, frontiers start over
            if r == 4 and k == 30:
                comm[r], ops[r] = 0.0, 0
            step = 0.0 if r == 2 and 20 <= k < 26 else rng.uniform(0.1, 0.9)  # rank 2 stalls a while
            comm[r] += step * (3.0 if r == 1 and k > 40 else 1.0)  # rank 1 waits more: its share falls
            ops[r] += 0 if (r == 2 and 20 <= k < 26) or k < 2 else rng.randint(5, 15)
            value: float = comm[r]
            if r == 3 and k in (50, 51):
                value = comm[r] - 5.0 if k == 50 else math.nan  # runs backwards, then is not a number
            done = 0 if r == 0 and 60 <= k < 63 else ops[r]  # rank 0's count goes back to 0 for a while
            record = heartbeat("job", r, 6, at, k, [job.group], [job.seq], [job.seq], interval=1.0)
            record.attributes[schema.ATTR_HB_COMM_S] = value
            record.attributes[schema.ATTR_HB_OPS_DONE] = done
            if pid is not None:
                record.resource = {**record.resource, schema.RES_PROCESS_PID: pid}
            records.append(record)
        engine.ingest(records, at)
        if k % 3 == 0 or k > 84 or 40 < k < 45 or (64 < k < 80 and k % 2 == 0):  # 1, 2 and 3 new samples
            compared += _windows_agree(engine.jobs["job"], cfg)
        if k == 45:
            for burst in range(45):  # 45 more samples of rank 5 before the next refresh: its deque turned over
                extra = heartbeat("job", 5, 6, at + 0.01 * (burst + 1), 1000 + burst, [job.group], [job.seq],
                                  [job.seq], interval=1.0)
                extra.attributes[schema.ATTR_HB_COMM_S] = comm[5] + 0.001 * burst
                extra.attributes[schema.ATTR_HB_OPS_DONE] = ops[5] + burst
                extra.end_ns = int((at + 0.01 * (burst + 1)) * 1e9)
                engine.ingest([extra], at + 0.01 * (burst + 1))
    assert compared > 500  # most ranks had windows most of the time
    table = engine.jobs["job"].memo["work_table"]
    assert table.rows[0].irregular and not table.rows[1].irregular


def test_a_clean_seq_that_gains_a_divergent_heartbeat_signature_is_a_mismatch() -> None:
    """Heartbeats add members' signatures to a seq found clean: only the new ones are compared, and
    a divergent one among them is still found (and the agreeing ones keep it clean)."""
    engine = Engine()
    group = Group("g", (0, 1, 2, 3))

    def beat(r: int, op: str, at: float) -> SpanRecord:
        return heartbeat("job", r, 4, at, int(at), [group], [5], [4], [InFlightOp(group, 5, op=op, age_s=0.1)])

    engine.ingest([beat(0, schema.OP_ALL_REDUCE, 1.0), beat(1, schema.OP_ALL_REDUCE, 1.0)], 1.0)
    state = engine.jobs["job"]
    rec = state.groups[group.id].seqs[5]
    assert find_mismatches(state) == [] and rec.clean == (rec.version, 2, 0, 0)
    engine.ingest([beat(2, schema.OP_ALL_REDUCE, 2.0)], 2.0)
    assert find_mismatches(state) == [] and rec.clean == (rec.version, 3, 0, 0)  # the new one agreed
    engine.ingest([beat(3, schema.OP_BROADCAST, 3.0)], 3.0)
    found = find_mismatches(state)
    assert [sorted(m.minority) for m in found] == [[3]] and found[0].field == "op"


def _mismatch_facts(found: list) -> list:  # type: ignore[type-arg]
    return sorted((m.group_id, m.seq, sorted(m.minority), m.field, m.basis) for m in found)


@pytest.mark.parametrize("seed", range(12))
def test_the_incremental_mismatch_check_finds_what_a_fresh_one_finds(seed: int) -> None:
    """Heartbeat signatures and op spans (sampled: some members only, some twice, some failed, some
    with another size / dtype / op than their heartbeat said) land on a few seqs between passes;
    after every batch the memoized check says what a check with every memo cleared says."""
    rng = random.Random(seed)
    engine = Engine()
    group = Group("g", tuple(range(6)))
    at, checked = 1.0, 0
    for _ in range(40):
        records: list[SpanRecord] = []
        for _ in range(rng.randint(1, 4)):
            r, seq = rng.randrange(6), rng.randint(1, 3)
            op = schema.OP_BROADCAST if rng.random() < 0.08 else schema.OP_ALL_REDUCE
            nbytes = 999 if rng.random() < 0.08 else 4096
            dtype = "float64" if rng.random() < 0.08 else "float32"
            if rng.random() < 0.5:
                records.append(heartbeat("job", r, 6, at, int(at * 100), [group], [seq], [seq - 1],
                                         [InFlightOp(group, seq, op=op, age_s=0.1)]))
            else:
                state = rng.choice([schema.STATE_COMPLETED] * 8 + [schema.STATE_ERROR, schema.STATE_TIMEOUT])
                records.append(collective("job", r, 6, group, seq, at - 0.1, at, op=op, nbytes=nbytes, dtype=dtype,
                                          state=state))
            at += 0.01
        engine.ingest(records, at)
        kept = engine.jobs["job"]
        fresh = copy.deepcopy(kept)
        memoized = _mismatch_facts(find_mismatches(kept))  # its memos carry on from pass to pass
        for gs in fresh.groups.values():
            for rec in gs.seqs.values():
                rec.clean = None
        fresh.memo.clear()
        assert memoized == _mismatch_facts(find_mismatches(fresh)), (seed, at)
        checked += bool(memoized)
    assert checked  # some mismatches were there to find


def test_a_clean_seq_whose_only_member_then_fails_there_is_read_again() -> None:
    """Rank 0's heartbeat put its broadcast at seq 5 (one signature: clean); its op span then says
    that broadcast failed, nothing else changed: a failure this group's history never saw."""
    engine = Engine()
    group = Group("g", (0, 1))
    engine.ingest([collective("job", r, 2, group, seq, seq - 0.1, seq, dtype="") for seq in range(1, 5)
                   for r in (0, 1)], 4.5)
    engine.ingest([heartbeat("job", 0, 2, 5.0, 5, [group], [5], [4],
                             [InFlightOp(group, 5, op=schema.OP_BROADCAST, age_s=0.1)])], 5.0)
    state = engine.jobs["job"]
    assert find_mismatches(state) == [] and state.groups[group.id].seqs[5].clean is not None
    engine.ingest([collective("job", 0, 2, group, 5, 4.9, 5.1, op=schema.OP_BROADCAST, dtype="",
                              state=schema.STATE_ERROR)], 5.2)
    found = find_mismatches(state)
    assert [(m.seq, sorted(m.minority), m.basis) for m in found] == [(5, [0], "history")], found


def test_the_fold_replaces_ops_in_flight_and_appends_work_samples() -> None:
    """What the analysis memos rely on (graph.wait_for, work_table.WorkTable): every folded
    heartbeat gives a rank a new in-flight list (never one changed in place), and its work
    samples are appended to the same deque."""
    engine = Engine()
    group = Group("g", (0, 1))
    lists, deques = [], []
    for k in range(3):  # the same heartbeat content each time
        record = heartbeat("job", 0, 2, 10.0 + k, k, [group], [5], [4], [InFlightOp(group, 5, age_s=0.2)])
        record.attributes[schema.ATTR_HB_COMM_S] = 0.5 * k
        record.attributes[schema.ATTR_HB_OPS_DONE] = 3 * k + 1
        engine.ingest([record], 10.0 + k)
        rank = engine.jobs["job"].ranks[0]
        lists.append(rank.inflight)
        deques.append(rank.work)
    assert len({id(x) for x in lists}) == 3 and [len(x) for x in lists] == [1, 1, 1]
    assert deques[0] is deques[2] and len(deques[2]) == 3


def _sweeps_agree(job: JobState, now: float, cfg: AnalysisConfig) -> tuple[int, bool]:
    """The rank table's statuses and hang sweep are the reference's (triggers.py)."""
    table = rank_table(job)
    status = table.statuses(job, now, cfg)
    assert status == statuses(job, now, cfg)
    threshold = hang_threshold(job, cfg)
    mine = table.hang_sweep(job, status, now, threshold, cfg, with_ages=True)
    theirs = hang_sweep(job, status, now, threshold, cfg)
    assert mine.hung is not None and theirs.hung is not None
    assert mine.hung == theirs.hung and repr(list(mine.hung.values())) == repr(list(theirs.hung.values()))
    assert mine.waiting == theirs.waiting and mine.oldest == theirs.oldest
    assert (mine.watched is None) == (theirs.watched is None)
    if mine.watched is not None and theirs.watched is not None:
        assert [r.rank for r in mine.watched] == [r.rank for r in theirs.watched]
        assert mine.oldest_heartbeat == theirs.oldest_heartbeat
    return len(mine.hung), mine.watched is not None


def test_the_rank_table_sweeps_as_the_per_rank_triggers_do() -> None:
    """Pass after pass (several per heartbeat) through random heartbeats: ranks that go silent,
    exit, restart, join late, have several ops or none in flight, young and old, an age that is
    not a number, and op spans that retire ops between heartbeats."""
    cfg = AnalysisConfig()
    hung_seen = watched_seen = 0
    for seed in range(6):
        rng = random.Random(seed)
        engine = Engine(cfg)
        world = 8
        groups = [Group(f"tp{i}", (2 * i, 2 * i + 1)) for i in range(4)]
        everyone = Group("all", tuple(range(world)))
        silent: set[int] = set()
        for k in range(40):
            at = 200.0 + k
            records = []
            for r in range(world):
                if r in silent or (r == 7 and k < 5):
                    continue
                if rng.random() < 0.04:
                    silent.add(r)  # goes quiet (late after 1.2 intervals, lost after 2.5)
                ops = []
                for g in rng.sample([groups[r // 2], everyone], rng.choice([0, 1, 1, 2])):
                    age = rng.choice([0.01, 0.25] if k % 4 == 0 else [0.26, 0.3, 1.5, 0.5 * k])  # young: every 4th beat
                    age = math.nan if rng.random() < 0.02 else age
                    ops.append(InFlightOp(g, 10 + k // 8, age_s=age))
                record = heartbeat("job", r, world, at, k, [groups[r // 2], everyone], [10 + k // 8] * 2,
                                   [9 + k // 8] * 2, ops, final=rng.random() < 0.01, interval=1.0)
                if r == 3 and k == 20:
                    record.resource = {**record.resource, schema.RES_PROCESS_PID: 999}  # a restart
                records.append(record)
            if rng.random() < 0.3:  # an op span retires an op between heartbeats
                r = rng.randrange(world)
                records.append(collective("job", r, world, everyone, 10 + k // 8, at - 0.3, at - 0.1))
            engine.ingest(records, at)
            if k == 30:
                silent.clear()
            for dt in (0.0, 0.4, 0.9):  # past 3/4 of the threshold after the heartbeat: the extrapolation is capped
                hung, watched = _sweeps_agree(engine.jobs["job"], at + dt, cfg)
                hung_seen += hung
                watched_seen += watched
    assert hung_seen > 100 and watched_seen > 20, (hung_seen, watched_seen)  # both ways out of the sweep ran


def test_the_newest_seqs_of_a_window_follow_it_as_the_fold_moves_it() -> None:
    """find_mismatches' newest seqs, kept from pass to pass, are sorted(window)[-4:] as the fold
    fills its windows: new seqs at the end (mostly increasing, some late ones out of order),
    the oldest dropped beyond the window's size."""
    rng = random.Random(3)
    seqs: dict[int, SeqRecord] = {}
    known = None
    top = 0
    for step in range(3000):
        for _ in range(rng.choice([0, 1, 1, 2, 5])):
            top += 1
            seq = top if rng.random() > 0.1 else max(1, top - rng.randint(1, 30))  # some arrive late
            if seq not in seqs:
                seqs[seq] = SeqRecord()
                if len(seqs) > 16:
                    del seqs[min(seqs)]
        if not seqs:
            continue
        last = next(reversed(seqs))
        if known is None or known[0] != len(seqs) or known[1] != last:
            known = (len(seqs), last, _newest_seqs(seqs, 4, known))
        assert known[2] == sorted(seqs)[-4:], step


@pytest.mark.parametrize("seed", range(4))
def test_the_complete_seqs_follow_the_fold_as_a_fresh_search_finds_them(seed: int) -> None:
    """find_slowdowns' complete seqs, kept while no op span lands, are _complete_seqs' answer as
    heartbeats add seqs, op spans complete them, the window drops the oldest and late beats
    make dropped seqs again (new, empty records)."""
    rng = random.Random(seed)
    cfg = AnalysisConfig(max_seqs_per_group=24)
    job = JobState("j")
    members = Group("g", (0, 1, 2))
    group = job.groups[members.id] = GroupState(members.id, ranks=members.ranks)
    known = None
    top = 0
    for step in range(1500):
        for _ in range(rng.choice([0, 1, 2])):  # heartbeats: a new seq in flight, or a late one
            top += 1
            _seq_record(group, top if rng.random() > 0.1 else max(1, top - rng.randint(20, 40)), cfg)
        if rng.random() < 0.3 and top:  # an op span of one member at a recent seq
            seq = max(1, top - rng.randint(0, 6))
            member = rng.randrange(3)
            record = collective("j", member, 3, members, seq, float(seq), seq + rng.uniform(0.001, 0.01))
            rank = job.ranks.setdefault(member, RankState(rank=member))
            _apply_op_span(job, rank, record, float(seq), cfg)
        known = _complete_seqs_since(group, known)
        assert known[1] == _complete_seqs(group) == _every_complete_seq(group), step


def _every_complete_seq(group: GroupState) -> list[tuple[int, float, dict[int, float], float]]:
    """The definition, over the whole window (not only the seqs op spans wrote)."""
    out = []
    for seq in sorted(group.seqs):
        rec = group.seqs[seq]
        if group.size >= 2 and len(rec.ends) >= group.size and len(rec.starts) >= group.size:
            durations = [rec.ends[r] - rec.starts[r] for r in rec.ends if r in rec.starts]
            out.append((seq, max(rec.ends.values()), rec.starts, min(durations) if durations else 0.0))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_minimal_groups_are_the_all_pairs_answer(seed: int) -> None:
    """slowness._minimal compares a group only with the groups whose smallest member is in it."""
    rng = random.Random(seed)
    groups = {frozenset(rng.sample(range(40), rng.randint(1, 12))) for _ in range(60)}
    groups |= {g | {99} for g in list(groups)[:10]}  # strict supersets of some
    by_size = sorted(groups, key=len)
    expected = {g for i, g in enumerate(by_size) if not any(o < g for o in by_size[:i])}
    found = slowness._minimal(groups)
    assert set(found) == expected and len(found) == len(expected)
    assert [len(g) for g in found] == sorted(len(g) for g in found)


def test_flow_classification_is_kept_only_while_every_ranks_flows_are_the_same(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stalled op's flow classification is reused while its node and every rank's flows are the
    same objects; a heartbeat (new flows) makes it classify again, and the answers are a fresh one's."""
    from mycroft.rca_service.analysis import verdict

    from mycroft.faults.bigjob import BigJob, Layout
    from mycroft.faults.simfaults import plan

    p = plan("nic_down", 64, 8, seed=2, rank=17)
    job = BigJob("j", Layout(64, tp=8), ops_per_s=10, fault=p, fault_at=1003.5)
    engine, cache = Engine(), DecodeCache()
    fresh = verdict._classify_flows_now
    calls = []
    monkeypatch.setattr(verdict, "_classify_flows_now", lambda *a: calls.append(1) or fresh(*a))
    for k in range(8):
        job.tick(1000.0 + k)
        engine.ingest(cache.decode(job.heartbeat_bytes(list(range(64)), 1000.0 + k)), 1000.01 + k)
    state = engine.jobs["j"]
    dp = next(g for g in state.groups.values() if 17 in g.ranks and len(g.ranks) == 8 and g.name.startswith("dp"))
    node = ("c", dp.group_id, max(r.issued.get(dp.group_id, 0) for r in state.ranks.values()))
    per_rank = {r.rank: r.flows for r in state.ranks.values() if r.flows}
    assert per_rank, "the stalled ring carries flows"
    first = verdict._classify_flows(state, node)
    assert first == fresh(state, node, per_rank) and first.get("rank") == 17
    first["flows"].clear()  # a caller's changes do not reach the kept answer
    assert verdict._classify_flows(state, node) == fresh(state, node, per_rank)
    assert len(calls) == 1
    job.tick(1008.0)
    engine.ingest(cache.decode(job.heartbeat_bytes([17], 1008.0)), 1008.01)  # one rank's new flows
    again = verdict._classify_flows(state, node)
    assert len(calls) == 2
    assert again == fresh(state, node, {r.rank: r.flows for r in state.ranks.values() if r.flows})
