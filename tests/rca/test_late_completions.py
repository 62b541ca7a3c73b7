"""Ops that read as in flight after their peers finished them are no wait.

A rank's completion can arrive late or never: funcol's all_reduce is waited in C++
(wait_tensor), where the Python layer cannot see it end, and gloo's Flight Recorder may not
mark it completed for seconds; a pipeline's send completes in C++ after the receiver got the
data. Seen in real jobs (tests/instrumentation/test_frameworks.py tp_eager, pipelining ZBV):
the stale op became a "data sink" (everyone issued it, it does not complete), whose verdict
waited for completions "on the way" forever, and the rank that really blocked was never named.
"""

from __future__ import annotations

import pytest
from mycroft.rca_service.analysis import graph as wfg
from mycroft.rca_service.analysis.triggers import hang_sweep, hang_threshold, statuses
from mycroft.rca_service.analysis.verdict import analyze_job
from mycroft.rca_service.config import AnalysisConfig
from mycroft.rca_service.ingest.state import JobState, apply_records

from mycroft import schema
from mycroft.faults.made_up_job import Group, InFlightOp, collective, heartbeat, p2p

CFG = AnalysisConfig()
STACK = 'File "train.py", line 3, in load_batch'
USER_STACK = "train.py:40 in <module>\ntrain.py:22 in step\ntrain.py:9 in wait_for_the_other_job"
CHECKPOINT_STACK = ("train.py:40 in <module>\ntrain.py:31 in save_checkpoint\n"
                    "/venv/lib/python3.11/site-packages/torch/serialization.py:650 in save")


def _tp_job(t: float, stale_on: tuple[int, ...] = (1,), behind: int | None = None) -> JobState:
    """4 ranks, one group. Ranks 0 and 2 wait in seq 8; rank 3 completed 7 and never issued 8;
    the ranks in `stale_on` also still show seqs 5-7 in flight, which every other member completed
    (but `behind`, still in seq 7)."""
    jobs: dict[str, JobState] = {}
    g = Group("tp", (0, 1, 2, 3))
    hb = []
    for r in range(4):
        if r == 3:
            hb.append(heartbeat("job", r, 4, t, 1, [g], [7], [7], idle_s=6.0, stack=STACK))
            continue
        stale = [InFlightOp(g, s, age_s=6.0 + 0.01 * (8 - s)) for s in (5, 6, 7)] if r in stale_on else []
        if r == behind:
            stale = [InFlightOp(g, 7, age_s=6.1)]
        completed = 4 if r in stale_on else 6 if r == behind else 7
        hb.append(heartbeat("job", r, 4, t, 1, [g], [8], [completed], [*stale, InFlightOp(g, 8, age_s=5.9)]))
    apply_records(jobs, hb, t, CFG)
    return jobs["job"]


def test_a_rank_with_late_completions_does_not_hide_the_rank_that_never_entered() -> None:
    t = 100.0
    for stale_on in ((1,), (1, 2)):  # one rank's completions late, or two ranks' of the same seqs
        findings = analyze_job(_tp_job(t, stale_on), t + 0.1, CFG)
        assert findings, stale_on
        top = findings[0].root_causes[0]
        assert (findings[0].kind, top.rank, top.kind) == ("hang", 3, "not_entered"), (stale_on, findings[0].text)
        assert all(rc.kind != "link" for rc in findings[0].root_causes), findings[0].text


def test_a_blocked_rank_whose_last_op_reads_in_flight_is_still_named() -> None:
    """Rank 1 blocked after an op its peers all finished, and its own completion never came: its
    peers wait in seq 8, which it never issued; it waits on nothing."""
    jobs: dict[str, JobState] = {}
    g = Group("dp", (0, 1, 2, 3))
    t = 200.0
    hb = [heartbeat("job", r, 4, t, 1, [g], [8], [7], [InFlightOp(g, 8, age_s=5.0)]) for r in (0, 2, 3)]
    hb.append(heartbeat("job", 1, 4, t, 1, [g], [7], [6], [InFlightOp(g, 7, age_s=5.3)]))
    apply_records(jobs, hb, t, CFG)
    findings = analyze_job(jobs["job"], t + 0.1, CFG)
    assert findings
    top = findings[0].root_causes[0]
    assert (top.rank, top.kind) == (1, "not_entered"), findings[0].text
    assert top.evidence["blocked_ranks"] == 3


def _ddp_lazy_job(t: float, returned: bool) -> JobState:
    """DDP with find_unused_parameters on gloo (framework matrix, ddp_unused: 2 of 6 blocks unnamed): the
    unused-parameter all-reduce (seq 8, issued from C++, waited lazily) reads in flight on ranks 0, 1, 3
    long after rank 2 completed it; rank 1 then blocked before its optimizer step, ranks 0 and 3 wait in
    the next forward's buffer broadcast (seq 9), rank 2 went on to seq 10."""
    jobs: dict[str, JobState] = {}
    g = Group("dp", (0, 1, 2, 3))
    lazy = InFlightOp(g, 8, age_s=8.3, returned=returned)
    hb = [heartbeat("job", r, 4, t, 1, [g], [9], [7], [lazy, InFlightOp(g, 9, op=schema.OP_BROADCAST, age_s=8.2)])
          for r in (0, 3)]
    hb.append(heartbeat("job", 1, 4, t, 1, [g], [8], [7], [lazy], stack=USER_STACK))
    hb.append(heartbeat("job", 2, 4, t, 1, [g], [10], [9], [InFlightOp(g, 10, age_s=8.1, returned=True)]))
    apply_records(jobs, hb, t, CFG)
    return jobs["job"]


def test_an_op_a_member_completed_and_whose_call_returned_is_no_wait() -> None:
    t = 250.0
    findings = analyze_job(_ddp_lazy_job(t, returned=True), t + 0.1, CFG)
    assert findings
    top = findings[0].root_causes[0]
    assert (findings[0].kind, top.rank, top.kind) == ("hang", 1, "not_entered"), findings[0].text


def test_an_op_a_member_completed_still_holds_a_rank_inside_the_call() -> None:
    """The same op, but the ranks are inside its call (a sync collective: the call has not returned):
    they wait in it, whoever finished it, and rank 1 is no sink."""
    t = 260.0
    job = _ddp_lazy_job(t, returned=False)
    status = statuses(job, t + 0.1, CFG)
    wf = wfg.build(job, status, [0, 1, 3], t + 0.1, CFG)
    assert wf.graph.has_edge(wfg.rank_node(1), ("c", job.ranks[1].inflight[0].group_id, 8))


def test_a_send_the_receiver_completed_is_no_wait() -> None:
    """Pipelining: rank 0's send of seq 3 reads in flight after rank 1 received it; rank 0 then
    blocked before its send of seq 4, in which rank 1 waits."""
    jobs: dict[str, JobState] = {}
    pp = Group("pp", (0, 1))
    t = 300.0
    records = [
        p2p("job", 1, 2, pp, schema.OP_RECV, 0, 3, t - 6.0, t - 5.9),
        heartbeat("job", 0, 2, t, 1, [pp], [0], [0], [InFlightOp(pp, 3, op=schema.OP_SEND, peer=1, age_s=6.0)]),
        heartbeat("job", 1, 2, t, 1, [pp], [0], [0], [InFlightOp(pp, 4, op=schema.OP_RECV, peer=0, age_s=5.8)]),
    ]
    apply_records(jobs, records, t, CFG)
    findings = analyze_job(jobs["job"], t + 0.1, CFG)
    assert findings
    top = findings[0].root_causes[0]
    assert (top.rank, top.kind) == (0, "not_entered"), findings[0].text


def test_a_recv_whose_send_completed_still_waits() -> None:
    """A completed send says the data left, not that it arrived (it may sit in a buffer): the
    receiver still waits in its recv, and the stalled transfer is the link's."""
    jobs: dict[str, JobState] = {}
    pp = Group("pp", (0, 1))
    t = 400.0
    records = [
        p2p("job", 0, 2, pp, schema.OP_SEND, 1, 3, t - 6.0, t - 5.9),
        heartbeat("job", 0, 2, t, 1, [pp], [0], [0], idle_s=6.0, stack=STACK),
        heartbeat("job", 1, 2, t, 1, [pp], [0], [0], [InFlightOp(pp, 3, op=schema.OP_RECV, peer=0, age_s=6.0)]),
    ]
    apply_records(jobs, records, t, CFG)
    job = jobs["job"]
    status = statuses(job, t + 0.1, CFG)
    wf = wfg.build(job, status, [1], t + 0.1, CFG)
    assert wf.graph.has_edge(wfg.rank_node(1), ("p", job.ranks[1].inflight[0].group_id, 0, 1, 3))


def _edges(wf: wfg.WaitForGraph) -> set[tuple[wfg.Node, wfg.Node]]:
    return set(wf.graph.edges)


def test_the_memoized_graph_drops_the_edge_when_the_last_peer_finishes() -> None:
    """The pass-to-pass memo (graph.wait_for) must see a peer's completion that turns an op into
    one every other member finished, though the waiting rank's ops in flight did not change."""
    t = 500.0
    job = _tp_job(t, behind=2)  # rank 2 has not completed seq 7 yet: rank 1's seq 7 is still a wait
    g = Group("tp", (0, 1, 2, 3))

    def passes(now: float) -> tuple[set[tuple[wfg.Node, wfg.Node]], set[tuple[wfg.Node, wfg.Node]]]:
        status = statuses(job, now, CFG)
        sweep = hang_sweep(job, status, now, hang_threshold(job, CFG), CFG)
        memo, _ = wfg.wait_for(job, status, sweep.waiting, now, CFG, now - sweep.oldest, sweep)
        fresh = wfg.build(job, status, sweep.waiting, now, CFG, now - sweep.oldest)
        return _edges(memo), _edges(fresh)

    memo, fresh = passes(t + 0.3)
    assert memo == fresh and (wfg.rank_node(1), ("c", g.id, 7)) in memo
    # rank 2's span completes seq 7: rank 1 is now the only member still showing it
    apply_records({"job": job}, [collective("job", 2, 4, g, 7, t - 6.1, t + 0.35)], t + 0.4, CFG)
    memo, fresh = passes(t + 0.45)
    assert memo == fresh, memo ^ fresh
    assert (wfg.rank_node(1), ("c", g.id, 7)) not in memo


def test_ends_the_flight_recorder_noticed_late_do_not_raise_the_hang_threshold() -> None:
    """Compiled collectives on gloo end when the Flight Recorder's frontier says so, seconds late:
    the adaptive threshold learned 6 s from them, and a blocked rank was named after 5-6 s."""
    from mycroft.rca_service.analysis.triggers import hang_threshold

    g = Group("tp", (0, 1))
    t = 600.0
    lagged = []
    for seq in range(1, 41):
        for r in (0, 1):
            span = collective("job", r, 2, g, seq, t + seq, t + seq + 1.5)  # the frontier saw it 1.5 s on
            span.attributes[schema.ATTR_TIMING] = schema.TIMING_FLIGHT_RECORDER
            lagged.append(span)
    jobs: dict[str, JobState] = {}
    apply_records(jobs, lagged, t + 50, CFG)
    assert hang_threshold(jobs["job"], CFG) == CFG.hang_min_s
    exact = [collective("job", r, 2, g, seq, t + seq, t + seq + 0.5) for seq in range(41, 81) for r in (0, 1)]
    apply_records(jobs, exact, t + 90, CFG)
    assert hang_threshold(jobs["job"], CFG) == pytest.approx(CFG.hang_factor * 0.5)  # from the exact ends only


def _pipeline(t: float, posted_rank: int | None) -> JobState:
    """Three pipeline stages 0 -> 1 -> 2 (a p2p group). Rank 1 posted its send of seq 5 to rank 2 and
    its recv of seq 6 from rank 0, and blocked in its own code (posted_only when `posted_rank` is 1);
    rank 0 posted send 6 to rank 1 and waits in recv 5 from rank 1 (never sent); rank 2 waits in
    recv 5 from rank 1, whose send reads in flight (gloo completes a posted send only in wait())."""
    jobs: dict[str, JobState] = {}
    pp = Group("pp", (0, 1, 2))
    hb0 = heartbeat("job", 0, 3, t, 1, [pp], [0], [0], [InFlightOp(pp, 6, op=schema.OP_SEND, peer=1, age_s=5.0),
                                                        InFlightOp(pp, 5, op=schema.OP_RECV, peer=1, age_s=5.0)])
    hb1 = heartbeat("job", 1, 3, t, 1, [pp], [0], [0], [InFlightOp(pp, 5, op=schema.OP_SEND, peer=2, age_s=5.0),
                                                        InFlightOp(pp, 6, op=schema.OP_RECV, peer=0, age_s=5.0)],
                    idle_s=5.0, stack=STACK)
    if posted_rank == 1:
        hb1.attributes[schema.ATTR_HB_POSTED_ONLY] = True
    hb2 = heartbeat("job", 2, 3, t, 1, [pp], [0], [0], [InFlightOp(pp, 5, op=schema.OP_RECV, peer=1, age_s=5.0)])
    apply_records(jobs, [hb0, hb1, hb2], t, CFG)
    return jobs["job"]


def test_a_rank_that_posted_its_ops_and_went_on_is_named_not_a_link() -> None:
    t = 700.0
    findings = analyze_job(_pipeline(t, posted_rank=1), t + 0.1, CFG)
    assert findings
    top = findings[0].root_causes[0]
    assert (top.rank, top.kind) == (1, "not_entered"), findings[0].text
    assert all(rc.kind != "link" for rc in findings[0].root_causes), findings[0].text
    assert top.evidence.get("stack") == STACK


def test_without_the_posted_flag_the_same_picture_is_a_stalled_transfer() -> None:
    """An older client (no posted_only): every rank reads as in a transfer both sides issued: a link
    (what a real stalled link between 1 and 2 looks like too; the flag is what tells them apart)."""
    t = 800.0
    findings = analyze_job(_pipeline(t, posted_rank=None), t + 0.1, CFG)
    assert findings and findings[0].root_causes[0].kind == "link", findings[0].text if findings else None


def _held_by_a_rank_with_a_stale_op(t: float, waited_s: float, stack: str) -> JobState:
    """Rank 1 blocked after an op its peers finished; its heartbeat still lists that op (idle 0),
    with `stack` (empty: a rank whose instrumentation sends no stack while ops are in flight)."""
    jobs: dict[str, JobState] = {}
    g = Group("dp", (0, 1, 2, 3))
    hb = [heartbeat("job", r, 4, t, 1, [g], [8], [7], [InFlightOp(g, 8, age_s=waited_s)]) for r in (0, 2, 3)]
    hb.append(heartbeat("job", 1, 4, t, 1, [g], [7], [6], [InFlightOp(g, 7, age_s=waited_s + 0.3)], stack=stack))
    apply_records(jobs, hb, t, CFG)
    return jobs["job"]


def test_a_holder_that_reads_busy_pages_once_its_peers_waited_long_enough() -> None:
    """megatron_coalescing / tp_eager in benchmarks/framework_matrix.py: the blocked rank's heartbeat
    lists an op its peers finished, so its idle read 0 for ever: the hang stayed a warning "waiting for
    the stack" and never paged. How long its peers have waited is how long it has been out."""
    t = 400.0
    young = analyze_job(_held_by_a_rank_with_a_stale_op(t, 1.2, ""), t + 0.05, CFG)
    assert young and young[0].severity == "warning", young
    for stack in ("", USER_STACK):
        held = analyze_job(_held_by_a_rank_with_a_stale_op(t, 3.0, stack), t + 0.05, CFG)
        assert held and held[0].root_causes[0].rank == 1, held
        assert held[0].severity == "critical", (stack, held[0].severity_reason)
    # its stack in a checkpoint: a normal pause, not a page
    paused = analyze_job(_held_by_a_rank_with_a_stale_op(t, 3.0, CHECKPOINT_STACK), t + 0.05, CFG)
    assert paused and paused[0].severity == "info", paused[0].severity_reason


def test_a_holder_whose_idle_reads_0_for_ops_it_completed_pages_too() -> None:
    """8-rank tp_eager: funcol records the instrumentation lost track of stayed in the blocked rank's
    heartbeat (seqs its own frontier had completed), so it reported idle 0 and its idle restarted at
    every heartbeat: "outside communication for less than 2 s" for ever, never a page."""
    t = 500.0
    jobs: dict[str, JobState] = {}
    g = Group("tp", (0, 1, 2, 3))
    hb = [heartbeat("job", r, 4, t, 1, [g], [8], [7], [InFlightOp(g, 8, age_s=3.0)]) for r in (0, 2, 3)]
    hb.append(heartbeat("job", 1, 4, t, 1, [g], [7], [7], [InFlightOp(g, 3, age_s=30.0), InFlightOp(g, 5, age_s=20.0)],
                        idle_s=0.0, stack=USER_STACK))
    apply_records(jobs, hb, t, CFG)
    job = jobs["job"]
    assert not job.ranks[1].inflight and job.ranks[1].idle_s == 0.0  # the stale ops are known done
    held = analyze_job(job, t + 0.05, CFG)
    assert held and held[0].root_causes[0].rank == 1, held
    assert held[0].severity == "critical", held[0].severity_reason


def _ddp_lazy_everywhere_job(t: float, returned: bool = True) -> JobState:
    """HF Trainer's DDP (find_unused_parameters=True): the unused-parameter all-reduce of the last step
    (seq 17) is waited only in the next backward, so it reads in flight on every rank, none completed it.
    Rank 2 then blocked between forward and backward; ranks 0, 1, 3 went on to the backward's bucket
    all-reduces (seq 18, 19) and wait there. It read as a link (everyone issued 17, it does not complete)."""
    jobs: dict[str, JobState] = {}
    g = Group("world", (0, 1, 2, 3))
    lazy = InFlightOp(g, 17, age_s=6.0, returned=returned)
    later = [InFlightOp(g, 18, age_s=5.9, returned=True), InFlightOp(g, 19, age_s=5.9, returned=True)]
    hb = [heartbeat("job", r, 4, t, 1, [g], [19], [16], [lazy, *later]) for r in (0, 1, 3)]
    hb.append(heartbeat("job", 2, 4, t, 1, [g], [17], [16], [lazy], stack=USER_STACK))
    apply_records(jobs, hb, t, CFG)
    return jobs["job"]


def test_an_op_whose_call_returned_is_no_wait_once_a_member_issued_a_later_one() -> None:
    t = 270.0
    findings = analyze_job(_ddp_lazy_everywhere_job(t), t + 0.1, CFG)
    assert findings
    top = findings[0].root_causes[0]
    assert (findings[0].kind, top.rank, top.kind) == ("hang", 2, "not_entered"), findings[0].text


def test_a_link_stalled_under_async_ops_is_still_a_link() -> None:
    """Every member issued seq 17, 18 and 19 (async) and none completes: the data does not move. The
    later ops stand for the stalled ones; the verdict is still the link."""
    jobs: dict[str, JobState] = {}
    g = Group("world", (0, 1, 2, 3))
    t = 280.0
    ops = [InFlightOp(g, seq, age_s=6.0, returned=True) for seq in (17, 18, 19)]
    apply_records(jobs, [heartbeat("job", r, 4, t, 1, [g], [19], [16], ops) for r in range(4)], t, CFG)
    findings = analyze_job(jobs["job"], t + 0.1, CFG)
    assert findings and findings[0].root_causes[0].kind == "link", [f.text for f in findings]


def test_a_groups_first_collectives_do_not_raise_the_hang_threshold() -> None:
    """A compiled TP job's only Python-timed ops were its start-up ones (ranks still arriving and
    compiling: waits of up to ~0.4 s); the threshold learned 2.5 s from them and its blocked rank was
    named after 2.6-2.9 s. The first hang_warmup_seqs of a group teach nothing; later ones do."""
    from mycroft.rca_service.analysis.triggers import hang_threshold

    g = Group("tp", (0, 1, 2, 3))
    t = 900.0
    start_up = [collective("job", r, 4, g, seq, t + seq, t + seq + 0.1 * r)  # rank r waited 0.1 * r s
                for seq in range(1, CFG.hang_warmup_seqs + 1) for r in range(4)]
    jobs: dict[str, JobState] = {}
    apply_records(jobs, start_up, t + 30, CFG)
    assert hang_threshold(jobs["job"], CFG) == CFG.hang_min_s
    steady = [collective("job", r, 4, g, seq, t + seq, t + seq + 0.4)
              for seq in range(CFG.hang_warmup_seqs + 1, CFG.hang_warmup_seqs + 5) for r in range(4)]
    apply_records(jobs, steady, t + 60, CFG)
    assert hang_threshold(jobs["job"], CFG) == pytest.approx(CFG.hang_factor * 0.4)
