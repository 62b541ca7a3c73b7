"""The pure analysis core on synthetic span records: state in, findings out."""

from __future__ import annotations

import dataclasses

import pytest
from mycroft.rca_service.analysis.verdict import analyze_job
from mycroft.rca_service.config import AnalysisConfig
from mycroft.rca_service.incidents.engine import Engine
from mycroft.rca_service.ingest.state import JobState, apply_records

from mycroft import schema
from mycroft.faults.made_up_job import Group, InFlightOp, StepJob, collective, heartbeat
from mycroft.otlp import SpanRecord

CFG = AnalysisConfig()


def _run(engine: Engine, job: StepJob, seconds: float, tick: float = 0.25, **hb: object) -> list:
    """Heartbeat every 0.5 s (tick granularity) from job.now on; returns every event."""
    events = []
    t = job.now
    next_hb = t
    end = job.now + seconds
    while t <= end:
        if t >= next_hb:
            engine.ingest(job.heartbeats(t, **hb), t)  # type: ignore[arg-type]
            next_hb += 0.5
        events.extend(engine.step(t))
        t += tick
    return events


def _healthy(world: int = 4, steps: int = 30) -> tuple[Engine, StepJob]:
    engine = Engine()
    job = StepJob("job", world)
    for _ in range(steps):
        spans = job.steps(1)
        engine.ingest(spans, job.now)
        engine.ingest(job.heartbeats(job.now, not_entered=range(world), stack=""), job.now)
        assert engine.step(job.now) == []
    return engine, job


def test_healthy_job_raises_nothing() -> None:
    engine, job = _healthy()
    assert not engine.tracker.active
    summary = engine.jobs_summary(job.now)[0]
    assert summary["ranks_seen"] == 4 and summary["groups"][0]["completed_min"] == 30


def test_rank_that_never_enters_is_the_root_cause_with_its_stack() -> None:
    engine, job = _healthy()
    events = _run(engine, job, 3.0, not_entered=[2])
    fired = [e for e in events if e.action == "fired"]
    assert len(fired) == 1
    incident = fired[0].incident
    assert incident.kind == "hang"
    top = incident.root_causes[0]
    assert top["rank"] == 2 and top["kind"] == "not_entered"
    assert "time.sleep" in top["evidence"]["stack"]
    assert top["evidence"]["blocked_ranks"] == 3
    # detected once the in-flight age passes the 1 s floor, not before
    assert 1.0 <= incident.detected_at - job.now <= 1.6
    assert incident.graph["waiting_ranks"] == 3


def test_silent_rank_is_lost_not_merely_idle() -> None:
    engine, job = _healthy()
    events = _run(engine, job, 3.0, not_entered=[1], silent=[1])
    incident = next(e.incident for e in events if e.action == "fired")
    assert incident.kind == "hang"
    assert incident.root_causes[0]["rank"] == 1
    assert incident.root_causes[0]["kind"] == "process_lost"


def test_crash_names_the_rank_that_vanished_without_a_goodbye() -> None:
    engine, job = _healthy()
    t = job.now + 0.2
    finals = [heartbeat("job", r, 4, t, 99, [job.group], [job.seq], [job.seq], final=True, exit_reason="exit")
              for r in (0, 1, 3)]
    engine.ingest(finals, t)
    events = []
    for k in range(12):
        events += engine.step(t + 0.25 * k)
    incident = next(e.incident for e in events if e.action == "fired")
    assert incident.kind == "crash"
    assert [c["rank"] for c in incident.root_causes] == [2]
    assert incident.root_causes[0]["kind"] == "process_lost"


def test_a_rank_killed_before_its_first_heartbeat_is_named_when_the_launcher_tears_the_job_down() -> None:
    """Killed moments after init_process_group, rank 1 sends nothing; torchrun SIGTERMs the others,
    whose final heartbeats are all the RCA gets: a crash naming the rank that never reported, once
    the job is older than a rank may take to be lost. Not when the others exited normally, not
    when every rank reported, not while the job is too young to tell a slow start."""
    group = Group("world", tuple(range(4)))

    def findings(reason: str, ranks: tuple[int, ...], age_s: float) -> list:
        state: dict[str, JobState] = {}
        t0 = 100.0
        for k, at in enumerate((t0, t0 + 0.3)):
            beats = [heartbeat("torn", r, 4, at, k, [group], [0], [0], final=k == 1, exit_reason=reason)
                     for r in ranks]
            apply_records(state, beats, at, CFG)
        return analyze_job(state["torn"], t0 + age_s, CFG)

    crash = findings("SIGTERM", (0, 2, 3), 3.0)
    assert [f.kind for f in crash] == ["crash"]
    assert [(c.rank, c.kind) for c in crash[0].root_causes] == [(1, "process_lost")]
    assert "never reported" in crash[0].summary
    assert findings("exit", (0, 2, 3), 3.0) == []
    assert findings("SIGTERM", (0, 1, 2, 3), 3.0) == []
    assert findings("SIGTERM", (0, 2, 3), 0.5) == []


def test_mismatch_minority_and_history_tie_break() -> None:
    engine, job = _healthy(world=2)
    nxt = job.seq + 1
    t = job.now + 0.1
    hbs = [
        heartbeat("job", 0, 2, t, 500, [job.group], [nxt], [job.seq], [InFlightOp(job.group, nxt, age_s=0.05)]),
        heartbeat("job", 1, 2, t, 500, [job.group], [nxt], [job.seq],
                  [InFlightOp(job.group, nxt, op=schema.OP_BROADCAST, age_s=0.05)]),
    ]
    engine.ingest(hbs, t)
    events = engine.step(t)
    assert events and events[0].incident.kind == "mismatch"
    causes = events[0].incident.root_causes
    # two ranks, one each: history (all_reduce every step) says rank 1 diverged
    assert [c["rank"] for c in causes] == [1]
    assert causes[0]["evidence"]["field"] == "op"
    assert causes[0]["evidence"]["expected"]["op"] == schema.OP_ALL_REDUCE


def test_size_mismatch_from_spans() -> None:
    engine, job = _healthy()
    job.seq += 1
    spans = [collective("job", r, 4, job.group, job.seq, job.now, job.now + 0.01,
                        nbytes=8192 if r == 3 else 4096, state=schema.STATE_ERROR) for r in range(4)]
    engine.ingest(spans, job.now)
    incident = engine.step(job.now + 0.1)[0].incident
    assert incident.kind == "mismatch"
    assert incident.root_causes[0]["rank"] == 3 and incident.root_causes[0]["evidence"]["field"] == "bytes"


def _two_group_job() -> tuple[JobState, Group, Group, Group, Group]:
    tp0, tp1 = Group("1", (0, 1)), Group("2", (2, 3))
    dp0, dp1 = Group("3", (0, 2)), Group("4", (1, 3))
    return JobState("job"), tp0, tp1, dp0, dp1


def test_hang_chains_across_tp_and_dp_groups() -> None:
    jobs: dict[str, JobState] = {}
    _, tp0, tp1, dp0, dp1 = _two_group_job()
    t = 100.0
    s = 7  # every group completed seq 6; seq 7 is where it sticks
    hb = [
        # rank 0 finished TP, waits in DP(0,2) for rank 2
        heartbeat("job", 0, 4, t, 1, [tp0, dp0], [s, s], [s, s - 1], [InFlightOp(dp0, s, age_s=5.0)]),
        heartbeat("job", 1, 4, t, 1, [tp0, dp1], [s, s], [s, s - 1], [InFlightOp(dp1, s, age_s=5.0)]),
        # rank 2 waits in TP(2,3) for rank 3
        heartbeat("job", 2, 4, t, 1, [tp1, dp0], [s, s - 1], [s - 1, s - 1], [InFlightOp(tp1, s, age_s=5.2)]),
        # rank 3 is outside communication
        heartbeat("job", 3, 4, t, 1, [tp1, dp1], [s - 1, s - 1], [s - 1, s - 1], idle_s=5.3,
                  stack='File "train.py", line 3, in load_batch'),
    ]
    apply_records(jobs, hb, t, CFG)
    findings = analyze_job(jobs["job"], t + 0.1, CFG)
    assert findings[0].kind == "hang"
    top = findings[0].root_causes[0]
    assert top.rank == 3 and top.kind == "not_entered"
    assert top.evidence["blocked_ranks"] == 3
    chains = findings[0].graph["longest_chains"]
    assert chains == ["rank 0 -> [group 3 seq 7] -> rank 2 -> [group 2 seq 7] -> rank 3"]


def test_p2p_cycle_is_a_deadlock() -> None:
    jobs: dict[str, JobState] = {}
    world = Group("0", (0, 1, 2, 3))
    t = 50.0
    hb = [
        heartbeat("job", 0, 4, t, 1, [world], [10], [10], [InFlightOp(world, 3, op=schema.OP_RECV, peer=1, age_s=4)]),
        heartbeat("job", 1, 4, t, 1, [world], [10], [10], [InFlightOp(world, 3, op=schema.OP_RECV, peer=0, age_s=4)]),
        heartbeat("job", 2, 4, t, 1, [world], [11], [10], [InFlightOp(world, 11, age_s=3.5)]),
        heartbeat("job", 3, 4, t, 1, [world], [11], [10], [InFlightOp(world, 11, age_s=3.5)]),
    ]
    apply_records(jobs, hb, t, CFG)
    finding = analyze_job(jobs["job"], t + 0.1, CFG)[0]
    assert finding.kind == "deadlock"
    assert {rc.rank for rc in finding.root_causes} == {0, 1}
    assert not any(rc.evidence["crossed_order"] for rc in finding.root_causes)  # both sent first: alike
    assert finding.graph["cycles"]


def test_a_deadlock_names_the_rank_that_took_the_crossed_order_first() -> None:
    """Rank 2 went to the world all-reduce before its TP one: its TP peers wait for it there,
    it waits for them in world. The cycle holds 0-3; 2 is its one rank in another op."""
    jobs: dict[str, JobState] = {}
    tp, world = Group("tp", (0, 1, 2, 3)), Group("w", tuple(range(8)))
    t = 50.0
    hb = []
    for r in range(8):
        if r in (0, 1, 3):
            hb.append(heartbeat("job", r, 8, t, 1, [tp, world], [11, 4], [10, 4], [InFlightOp(tp, 11, age_s=4)]))
        elif r == 2:
            hb.append(heartbeat("job", r, 8, t, 1, [tp, world], [10, 5], [10, 4], [InFlightOp(world, 5, age_s=4)]))
        else:
            hb.append(heartbeat("job", r, 8, t, 1, [world], [5], [4], [InFlightOp(world, 5, age_s=4)]))
    apply_records(jobs, hb, t, CFG)
    finding = analyze_job(jobs["job"], t + 0.1, CFG)[0]
    assert finding.kind == "deadlock"
    assert [rc.rank for rc in finding.root_causes] == [2, 0, 1, 3]
    top = finding.root_causes[0]
    assert top.evidence["crossed_order"] is True and "another order" in top.evidence["text"]
    assert not any(rc.evidence["crossed_order"] for rc in finding.root_causes[1:])


def test_everyone_issued_but_nothing_moves_is_a_link_problem() -> None:
    engine, job = _healthy()
    events = _run(engine, job, 2.0)
    incident = next(e.incident for e in events if e.action == "fired")
    assert incident.kind == "hang"
    assert incident.root_causes[0]["rank"] is None and incident.root_causes[0]["kind"] == "link"


@pytest.mark.parametrize("reports_work", [True, False], ids=["with-comm-time", "spans-only"])
def test_straggler_is_the_rank_that_arrives_last(reports_work: bool) -> None:
    """Real ranks report their time in communication (comm_s): the work rule names the rank that
    computes longest; without it (spans only) the arrival rule names the one that arrives last."""
    engine = Engine()
    job = StepJob("job", 4, reports_work=reports_work)
    for _ in range(20):
        engine.ingest(job.steps(1), job.now)
        engine.ingest(job.heartbeats(job.now, not_entered=range(job.world), stack=""), job.now)
        assert engine.step(job.now) == []
    events = []
    for _ in range(12):
        engine.ingest(job.steps(1, slow_rank=1, slow_extra_s=0.15), job.now)
        # the ranks keep heartbeating (a slowness verdict waits for a rank that missed its heartbeat)
        engine.ingest(job.heartbeats(job.now, not_entered=range(job.world), stack=""), job.now)
        events += engine.step(job.now)
    incident = next(e.incident for e in events if e.action == "fired")
    assert incident.kind == "slowdown"
    top = incident.root_causes[0]
    assert top["rank"] == 1 and top["kind"] == "straggler"
    if reports_work:  # 0.23 s of compute per step against 0.08 s
        assert top["evidence"]["mode"] == "imbalance" and top["evidence"]["excess_share"] > 0.5, top["evidence"]
        assert top["evidence"]["peers"] == [0, 2, 3]
    else:
        assert top["evidence"]["slowdown_ratio"] > 1.6, top["evidence"]


def test_random_arrival_order_jitter_is_not_a_straggler() -> None:
    engine, _job = _healthy(steps=80)
    assert not engine.tracker.active


def test_incident_resolves_when_progress_resumes_and_is_not_refired() -> None:
    engine, job = _healthy()
    events = _run(engine, job, 2.0, not_entered=[2])
    # a warning, then critical once rank 2 has been out of communication for page_idle_min_s
    assert [e.action for e in events] == ["fired", "updated"] and events[-1].incident.severity == "critical"
    # rank 2 arrives: the collective completes, the job moves on
    job.now += 2.0
    events = []
    for _ in range(40):  # 4 s of progress > resolve_after_s
        engine.ingest(job.steps(1), job.now)
        engine.ingest(job.heartbeats(job.now, not_entered=range(4), stack=""), job.now)
        events += engine.step(job.now)
    assert [e.action for e in events] == ["resolved"]
    assert not engine.tracker.active


def test_foreign_and_summary_spans_are_ignored_safely() -> None:
    jobs: dict[str, JobState] = {}
    junk = [
        SpanRecord(1, 1, "GET /", 0, 1),
        SpanRecord(2, 2, schema.SPAN_COLLECTIVE_SUMMARY, 0, 1,
                   attributes={schema.ATTR_SPAN_KIND: schema.KIND_COLLECTIVE_SUMMARY}),
        SpanRecord(3, 3, "all_reduce", 0, 1, attributes={schema.ATTR_SPAN_KIND: schema.KIND_COLLECTIVE,
                                                          schema.ATTR_SEQ: "x", schema.ATTR_GROUP_RANKS: "0-a"},
                   resource={schema.RES_RANK: 0, schema.RES_JOB_ID: "j"}),
        SpanRecord(4, 4, schema.SPAN_HEARTBEAT, 0, 1, attributes={
            schema.ATTR_SPAN_KIND: schema.KIND_HEARTBEAT, schema.ATTR_HB_GROUP_IDS: ["g"],
            schema.ATTR_HB_INFLIGHT_GROUP_IDS: ["g", "h"], schema.ATTR_HB_INFLIGHT_SEQS: ["bad"]},
            resource={schema.RES_RANK: "1", schema.RES_JOB_ID: "j"}),
    ]
    rejected: dict[str, int] = {}
    assert apply_records(jobs, junk, 1.0, CFG, rejected=rejected) == 1
    assert rejected == {"bad_group_ranks": 1}  # "0-a" is refused (and counted), not folded with no members
    # the junk in-flight entries ("bad" seq, a group the rank never listed) are not a hang
    assert analyze_job(jobs["j"], 2.0, CFG) == []
    # the one valid record (rank 1's heartbeat) still counts: its silence is a lost rank
    late = analyze_job(jobs["j"], 100.0, CFG)
    assert [f.kind for f in late] == ["crash"] and late[0].evidence["lost_ranks"] == [1], late


def test_memory_is_bounded() -> None:
    cfg = dataclasses.replace(CFG, max_seqs_per_group=16, max_jobs=3)
    jobs: dict[str, JobState] = {}
    group = Group("0", (0, 1))
    for seq in range(1, 200):
        apply_records(jobs, [collective("a", r, 2, group, seq, seq, seq + 0.1) for r in (0, 1)], seq, cfg)
    assert len(jobs["a"].groups[group.id].seqs) == 16
    assert min(jobs["a"].groups[group.id].seqs) == 184
    for k in range(10):
        apply_records(jobs, [collective(f"job{k}", 0, 2, group, 1, 0, 1)], 1000.0 + k, cfg)
    assert len(jobs) == 3


def test_restarted_rank_starts_over() -> None:
    jobs: dict[str, JobState] = {}
    group = Group("0", (0, 1))
    apply_records(jobs, [collective("a", 0, 2, group, 50, 1, 2)], 2.0, CFG)
    assert jobs["a"].ranks[0].completed[group.id] == 50
    again = collective("a", 0, 2, group, 1, 3, 4)
    again.resource[schema.RES_PROCESS_PID] = 4242
    apply_records(jobs, [again], 4.0, CFG)
    assert jobs["a"].ranks[0].completed[group.id] == 1


def _flows(peer: int, send: bool, posted: int, g: int, t: int, d: int) -> dict[str, object]:
    return {schema.ATTR_HB_FLOW_COMMS: ["00000000000000aa"], schema.ATTR_HB_FLOW_SEQS: [7],
            schema.ATTR_HB_FLOW_CHANNELS: [0], schema.ATTR_HB_FLOW_PEERS: [peer], schema.ATTR_HB_FLOW_SENDS: [send],
            schema.ATTR_HB_FLOW_STEPS: [8], schema.ATTR_HB_FLOW_POSTED: [posted], schema.ATTR_HB_FLOW_GPU_READY: [g],
            schema.ATTR_HB_FLOW_TRANSMITTED: [t], schema.ATTR_HB_FLOW_DONE: [d], schema.ATTR_HB_FLOW_AGES_S: [3.0]}


def test_native_flow_counters_localise_a_data_stall() -> None:
    """Everyone issued; the sender has data the receiver never posted a buffer for: the receiver."""
    jobs: dict[str, JobState] = {}
    pair = Group("0", (0, 1))
    t = 20.0
    hbs = [heartbeat("job", r, 2, t, 1, [pair], [7], [6], [InFlightOp(pair, 7, age_s=3.0)]) for r in (0, 1)]
    hbs[0].attributes.update(_flows(1, True, 3, 3, 2, 2))
    hbs[1].attributes.update(_flows(0, False, 2, 2, 2, 2))
    apply_records(jobs, hbs, t, CFG)
    finding = analyze_job(jobs["job"], t + 0.1, CFG)[0]
    top = finding.root_causes[0]
    assert finding.kind == "hang" and top.kind == "link"
    assert top.rank == 1 and top.evidence["suspect_side"] == "recv"
    assert "receiver not ready" in top.evidence["text"]


def test_a_dead_ranks_stale_in_flight_op_is_not_a_link_stall() -> None:
    """SIGKILL right after a heartbeat that showed an op in flight which the others then completed."""
    jobs: dict[str, JobState] = {}
    world = Group("0", (0, 1, 2, 3))
    t = 30.0
    hbs = [heartbeat("job", r, 4, t, 1, [world], [18], [18]) for r in (0, 2, 3)]
    hbs.append(heartbeat("job", 1, 4, t, 1, [world], [18], [17], [InFlightOp(world, 18, age_s=0.7)]))
    apply_records(jobs, hbs, t, CFG)
    later = [heartbeat("job", r, 4, t + 0.5, 2, [world], [18], [18]) for r in (0, 2, 3)]
    apply_records(jobs, later, t + 0.5, CFG)
    # 0.9 s on, the extrapolated age passes 1 s, but rank 1 is late: no verdict on a stale snapshot
    assert analyze_job(jobs["job"], t + 0.9, CFG) == []
    apply_records(jobs, [heartbeat("job", r, 4, t + 1.5, 3, [world], [18], [18]) for r in (0, 2, 3)], t + 1.5, CFG)
    [finding] = analyze_job(jobs["job"], t + 1.6, CFG)
    assert finding.kind == "crash" and finding.root_causes[0].rank == 1
    assert finding.root_causes[0].kind == "process_lost"


def test_silent_jobs_expire_and_their_incidents_resolve() -> None:
    engine = Engine(dataclasses.replace(CFG, job_ttl_s=60.0))
    job = StepJob("gone", 4)
    engine.ingest(job.steps(20), job.now)
    events = _run(engine, job, 3.0, not_entered=[1])
    assert [e.action for e in events] == ["fired", "updated"]  # warning, then critical (page_idle_min_s)
    later = engine.step(job.now + 3.0 + 61.0)
    assert [(e.action, e.incident.evidence["resolved_because"]) for e in later] == [("resolved", "job expired")]
    assert "gone" not in engine.jobs


def test_a_cut_off_rank_with_a_stale_in_flight_op_is_lost_not_a_link() -> None:
    """Link down right after a heartbeat that showed rank 1 inside seq 26; the others wait in seq 31."""
    jobs: dict[str, JobState] = {}
    world = Group("0", (0, 1, 2))
    t = 40.0
    apply_records(jobs, [heartbeat("job", 1, 3, t, 5, [world], [26], [25], [InFlightOp(world, 26, age_s=0.01)])],
                  t, CFG)
    for k, at in enumerate((t + 0.5, t + 1.0, t + 1.5)):
        apply_records(jobs, [heartbeat("job", r, 3, at, k, [world], [31], [30],
                                       [InFlightOp(world, 31, age_s=at - t + 0.1)]) for r in (0, 2)], at, CFG)
    assert analyze_job(jobs["job"], t + 1.05, CFG) == []  # rank 1 is late: dead or cut off? wait
    [finding] = analyze_job(jobs["job"], t + 1.2, CFG)
    assert finding.kind == "hang"
    assert (finding.root_causes[0].rank, finding.root_causes[0].kind) == (1, "process_lost")


def test_incidents_of_jobs_that_never_come_back_after_a_restart_resolve() -> None:
    from mycroft.rca_service.incidents.tracker import Incident

    old = Incident(id="x", job="gone", kind="hang", status="firing", detected_at=0.0, summary="", root_causes=[],
                   graph={}, evidence={}, updated_at=0.0, last_seen_at=0.0)
    engine = Engine(dataclasses.replace(CFG, job_ttl_s=100.0), firing=[old])
    assert engine.step(50.0) == []
    [event] = engine.step(150.0)
    assert event.action == "resolved" and event.incident.id == "x"


def test_no_not_entered_verdict_from_a_heartbeat_older_than_the_wait() -> None:
    """1 s heartbeats: rank 3 reported just before the others began to wait, then froze (SIGSTOP)."""
    jobs: dict[str, JobState] = {}
    world = Group("0", (0, 1, 2, 3))
    t = 60.0
    apply_records(jobs, [heartbeat("job", 3, 4, t, 7, [world], [9], [9], interval=1.0)], t, CFG)
    for at in (t + 0.2, t + 1.2):
        apply_records(jobs, [heartbeat("job", r, 4, at, 8, [world], [10], [9],
                                       [InFlightOp(world, 10, age_s=at - t - 0.1)], interval=1.0)
                             for r in (0, 1, 2)], at, CFG)
    assert analyze_job(jobs["job"], t + 1.25, CFG) == []  # undecided: alive elsewhere, or frozen?
    [finding] = analyze_job(jobs["job"], t + 2.2, CFG)
    assert (finding.root_causes[0].rank, finding.root_causes[0].kind) == (3, "process_lost")
    # had it reported after the wait began, it would be convicted as alive and elsewhere
    apply_records(jobs, [heartbeat("job", 3, 4, t + 1.3, 8, [world], [9], [9], idle_s=1.2, interval=1.0)],
                  t + 1.3, CFG)
    [finding] = analyze_job(jobs["job"], t + 1.35, CFG)
    assert (finding.root_causes[0].rank, finding.root_causes[0].kind) == (3, "not_entered")


def test_a_completed_span_retires_the_heartbeats_in_flight_op() -> None:
    """1 s heartbeats: the snapshot said "in seq 33"; the span says it completed 60 ms later."""
    jobs: dict[str, JobState] = {}
    world = Group("0", (0, 1))
    t = 70.0
    apply_records(jobs, [heartbeat("job", r, 2, t, 1, [world], [33], [32], [InFlightOp(world, 33, age_s=0.05)],
                                   interval=1.0) for r in (0, 1)], t, CFG)
    apply_records(jobs, [collective("job", r, 2, world, 33, t - 0.05, t + 0.01) for r in (0, 1)], t + 0.2, CFG)
    assert sorted(jobs["job"].ranks) == [0, 1]
    assert all(not rank.inflight for rank in jobs["job"].ranks.values())
    assert analyze_job(jobs["job"], t + 0.99, CFG) == []
