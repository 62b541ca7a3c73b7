"""A rank still computing toward the collective is late, not a cause (verdict._late_why).

The issue's run (srun, a node loaded by other work): rank 2 blocked outside communication, rank 0
already waiting in DDP's bucket all-reduces, rank 1 still in backward (it posted the first buckets),
rank 3 still in forward (it issued none of the step's). Before the rule the hang named ranks 1, 2
and 3 as not_entered, critical at the 1 s threshold; only rank 2 holds the op.
"""

from __future__ import annotations

from mycroft.rca_service.incidents.engine import Engine

from mycroft.faults.made_up_job import InFlightOp, StepJob, heartbeat

BLOCKED = '  File "train.py", line 40, in main\n    sync_with_parameter_server()\n' \
          '  File "train.py", line 12, in sync_with_parameter_server\n    time.sleep(0.5)'


def _computing(beat: int) -> str:
    """A stack that moves from heartbeat to heartbeat: autograd at work."""
    return (f'  File "train.py", line 44, in main\n    loss.backward()\n'
            f'  File "torch/autograd/graph.py", line {800 + beat % 7}, in _engine_run_backward')


def _run(block: bool, seconds: float) -> list[tuple[str, str, list[int], str]]:
    engine = Engine()
    job = StepJob("late", 4, step_s=0.8)  # 0.64 s of compute a step, 0.16 s all-reduces: hang threshold 1 s
    for _ in range(20):
        engine.ingest(job.steps(1), job.now)
        engine.ingest(job.heartbeats(job.now, not_entered=range(4), stack=""), job.now)
        assert engine.step(job.now) == []
    g, s, t0 = job.group, job.seq, job.now
    events = []
    t, beat = t0, 0
    while t <= t0 + seconds:
        if abs((t - t0) / 0.25 - round((t - t0) / 0.25)) < 1e-6:  # a heartbeat every 0.25 s
            beat += 1
            age = t - t0
            # rank 0 waits in the step's three bucket all-reduces
            hbs = [heartbeat("late", 0, 4, t, job.counter + beat, [g], [s + 3], [s],
                             [InFlightOp(g, s + k, age_s=age) for k in (1, 2, 3)])]
            # rank 1 posted two buckets and computes the rest of its backward; waits in all three from 1.2 s
            if age < 1.2:
                hbs.append(heartbeat("late", 1, 4, t, job.counter + beat, [g], [s + 2], [s],
                                     [InFlightOp(g, s + k, age_s=age * 0.8, returned=True) for k in (1, 2)],
                                     idle_s=age, stack=_computing(beat)))
            else:
                hbs.append(heartbeat("late", 1, 4, t, job.counter + beat, [g], [s + 3], [s],
                                     [InFlightOp(g, s + k, age_s=age - 1.2) for k in (1, 2, 3)]))
            # rank 2: blocked (or, without the block, computing like rank 3)
            hbs.append(heartbeat("late", 2, 4, t, job.counter + beat, [g], [s], [s], idle_s=age,
                                 stack=BLOCKED if block else _computing(beat + 3)))
            # rank 3 computes its forward, none of the step's ops issued, for 1.25 s (a slow step, past the
            # hang threshold of 1 s, under 2 x its usual 0.64 s of compute); then it waits in the three too
            if age < 1.25:
                hbs.append(heartbeat("late", 3, 4, t, job.counter + beat, [g], [s], [s], idle_s=age,
                                     stack=_computing(beat + 1)))
            else:
                hbs.append(heartbeat("late", 3, 4, t, job.counter + beat, [g], [s + 3], [s],
                                     [InFlightOp(g, s + k, age_s=age - 1.25) for k in (1, 2, 3)]))
            engine.ingest(hbs, t)
        # what each event said when it happened (an incident is updated in place)
        events.extend((e.incident.kind, e.incident.severity, [c["rank"] for c in e.incident.root_causes],
                       e.incident.summary) for e in engine.step(t))
        t = round(t + 0.05, 6)
    return events


def test_only_the_blocked_rank_is_named_not_the_ranks_computing_toward_the_op() -> None:
    events = _run(block=True, seconds=4.0)
    hangs = [e for e in events if e[0] == "hang"]
    assert hangs, events
    # before: ranks 1, 2 and 3 (not_entered) at the threshold; rank 1 is behind rank 2 in the group
    assert not [ranks for _, _, ranks, _ in hangs if 1 in ranks], hangs
    # no page names a computing rank; the first one names the blocked rank alone
    assert [ranks for _, severity, ranks, _ in hangs if severity == "critical"][:1] == [[2]], hangs
    assert all(ranks == [2] for _, severity, ranks, _ in hangs if severity == "critical"), hangs
    # rank 3 is named beside it only while the analysis has not yet seen rank 2's stack stand still
    # (its first look at the hang: every stack reads as moving), as a warning, for 2.5 heartbeat intervals
    assert hangs[-1][2] == [2]


def test_ranks_all_computing_toward_the_op_page_nobody() -> None:
    """Nobody is blocked, the node is slow: within a step's compute no critical hang, whoever it names."""
    events = _run(block=False, seconds=1.2)
    assert not [e for e in events if e[1] == "critical"], events
    named = {rank for kind, _, ranks, _ in events if kind == "hang" for rank in ranks}
    assert 1 not in named, events  # behind ranks 2 and 3 in the group: late whatever its stack says
