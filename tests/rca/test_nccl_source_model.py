"""Issue 44: the RCA on a second model of NCCL, written from NCCL's source (mycroft/faults/nccl_model).

The model's mechanics first (the step window, clear-to-send, a dead NIC, backpressure), then each
rule mechanism the issue asked for, on model runs fed to the engine through the OTLP wire on the
model's clock (drive.py). Every rule test here failed on the rules before issue 44 (checked by
running this file against a `git archive` of 07d46e4): the dead NIC named its upstream sender or a
rank that had finished the collective, the verdict changed 40 times, a slowed collective with
heartbeats only was a hang, healthy-ring slack and late-kernel backlog named the wrong rank.
"""

from __future__ import annotations

import math
from typing import Any

from mycroft.rca_service.analysis.findings import RC_LINK, SLOWDOWN, Finding, RootCause
from mycroft.rca_service.incidents.tracker import IncidentTracker

from mycroft.faults.nccl_model.cluster import Cluster, Plan, plan
from mycroft.faults.nccl_model.drive import run_model
from mycroft.faults.nccl_model.progress import INF, NCCL_STEPS, Hop, RankSide, ring_allreduce_channel


# ------------------------------------------------------------------ the model's mechanics (progress.py)
def _ring(n: int = 4, loops: int = 2, wire: float = 1e-3, nic_up: dict[int, Any] | None = None,
          kernel: dict[int, float] | None = None) -> object:
    sides = {r: RankSide(launch=0.0, kernel=(kernel or {}).get(r, 0.0), gpu_step_s=1e-4, proxy_lag_s=1e-5,
                         flush_s=1e-5, nic_up=(nic_up or {}).get(r, lambda t: t))
             for r in range(n)}
    return ring_allreduce_channel(list(range(n)), 0, loops, sides, lambda a, b: Hop(True, lambda t: wire, 1e-5))


def test_a_sender_never_runs_more_than_the_step_window_ahead_of_what_completed() -> None:
    run = _ring()
    for fl in run.flows:  # type: ignore[attr-defined]
        if not fl.send:
            continue
        for s in range(NCCL_STEPS, fl.steps):
            assert fl.posted[s] >= fl.done[s - NCCL_STEPS]  # sendProxyProgress: posted < done + maxDepth


def test_a_step_is_transmitted_only_after_the_receiver_posted_its_buffer() -> None:
    run = _ring()
    flows = {(f.rank, f.peer, f.send): f for f in run.flows}  # type: ignore[attr-defined]
    for (rank, peer, send), fl in flows.items():
        if send:
            recv = flows[(peer, rank, False)]
            assert all(fl.transmitted[s] >= recv.gpu_ready[s] for s in range(fl.steps))  # no CTS, no isend


def test_a_dead_nic_stops_the_ring_and_a_late_kernel_holds_what_arrived() -> None:
    dead = _ring(nic_up={2: lambda t: t if t < 0.004 else INF})
    assert all(math.isinf(e) for e in dead.end.values())  # type: ignore[attr-defined]
    late = _ring(kernel={2: 0.05})
    into_2 = next(f for f in late.flows if f.rank == 2 and not f.send)  # type: ignore[attr-defined]
    # before its kernel runs, rank 2's proxy posted NCCL_STEPS buffers (CTS sent); the n - 1 steps that do not
    # need rank 2's own data arrived; nothing was consumed
    assert into_2.counters(0.04) == (NCCL_STEPS, NCCL_STEPS, 3, 0)


def test_the_cluster_is_8_hosts_of_4_gpus_with_flows_only_on_inter_node_hops() -> None:
    c = Cluster(layout="dp", fault=Plan("none", -1, INF), seconds=3.0, seed=3)
    assert c.world == 32 and len(c.ops[0]) >= 3
    assert all(fl.rank // 4 != fl.peer // 4 for _, _, fl in c.flows)  # NET only: NVLink hops emit no flows


# ------------------------------------------------------------------ the rules, on model runs
def test_a_dead_nic_is_named_on_its_rank_not_its_upstream_sender_and_the_verdict_holds() -> None:
    # before: rank 4 (the sender into the dead NIC: "data ready, not transmitted: sender NIC"), 40 changes
    out = run_model("nic_down", 1, layout="tp4dp8", hb_only=True)
    assert out.right, out
    assert out.verdict == "hang" and out.root_cause == ("link", 8)
    assert out.max_changes <= 3


def test_a_nic_dying_mid_collective_on_nccl_is_a_link_hang_not_a_rank_that_finished_it() -> None:
    # before: downstream ranks had every chunk and started the next step; one still computing was
    # named "not entered" while the rest were stuck in the dead collective
    out = run_model("nic_down", 2, layout="dp", hb_only=True)
    assert out.right, out
    assert out.root_cause == ("link", plan("nic_down", 2).rank)


def test_a_slowed_collective_with_heartbeats_only_is_slow_not_hung() -> None:
    # a power-capped GPU delays every all-reduce past the 1 s floor; before: hang "not_entered" warnings
    out = run_model("gpu_power_cap", 2, layout="dp", hb_only=True)
    assert not any(kind == "hang" for kind, *_ in out.incidents), out.incidents
    assert out.loud_before == 0


def test_a_link_slow_one_way_is_named_on_its_sender_from_flows_compared_over_the_same_steps() -> None:
    out = run_model("slow_link_one_way", 1, layout="dp", hb_only=True)
    assert out.right, out
    assert out.max_changes <= 3


def test_a_healthy_ring_names_nobody() -> None:
    for seed in (1, 2):
        out = run_model("none", seed, layout="dp", hb_only=True)
        assert out.right and out.loud == 0, out.incidents


# ------------------------------------------------------------------ the ledger (flow_deps.py), hand-built
def _sample(rank: int, flows: list[tuple[int, int, bool, int, int, int, int, int]]) -> dict[str, object]:
    """flows: (channel, peer, is_send, steps, posted, G, T, D)."""
    return {
        "mycroft.hb.flow.comms": ["c0"] * len(flows), "mycroft.hb.flow.seqs": [1] * len(flows),
        "mycroft.hb.flow.channels": [f[0] for f in flows], "mycroft.hb.flow.peers": [f[1] for f in flows],
        "mycroft.hb.flow.sends": [f[2] for f in flows], "mycroft.hb.flow.steps": [f[3] for f in flows],
        "mycroft.hb.flow.posted": [f[4] for f in flows], "mycroft.hb.flow.gpu_ready": [f[5] for f in flows],
        "mycroft.hb.flow.transmitted": [f[6] for f in flows], "mycroft.hb.flow.done": [f[7] for f in flows],
        "mycroft.hb.flow.ages_s": [0.001] * len(flows), "mycroft.hb.flow.ranks": [rank] * len(flows),
        "mycroft.hb.flow.proxy_states": [""] * len(flows),
    }


def _ledger(beats: int, special: dict[int, list[tuple[int, int, bool, int, int, int, int, int]]]) -> Any:
    """A 6-host ring on channel 0 (one rank per host), every rank sampled mid-collective in each beat."""
    from mycroft.rca_service.analysis import flow_deps  # imported here: the file also runs on older rules

    led = flow_deps.Ledger()
    n, steps = 6, 40
    for _ in range(beats):
        for r in range(n):
            healthy = [(0, (r + 1) % n, True, steps, 22, 21, 21, 20), (0, (r - 1) % n, False, steps, 28, 28, 21, 20)]
            flow_deps._fold(led, r, _sample(r, special.get(r, healthy)))
    return led


def test_a_receive_backlog_behind_a_blocked_next_hop_is_backpressure_not_the_cause() -> None:
    from mycroft.rca_service.analysis import flow_deps

    steps = 40
    # rank 3's link to 4 is slow: its window sits on the wire; rank 2 cannot forward into 3 (no CTS, 3's
    # buffers are full), so what rank 2 receives backs up -- rank 2 is a victim
    special = {
        3: [(0, 4, True, steps, 28, 28, 28, 20), (0, 2, False, steps, 28, 28, 28, 20)],
        2: [(0, 3, True, steps, 28, 28, 20, 20), (0, 1, False, steps, 28, 28, 28, 20)],
    }
    found = flow_deps.judge(_ledger(8, special), {r: f"h{r}" for r in range(6)})
    assert found is not None and found.rank == 3 and found.locus == flow_deps.LOCUS_NIC, found


def test_a_missing_clear_to_send_is_read_as_the_receivers_side() -> None:
    from mycroft.rca_service.analysis import flow_deps

    steps = 40
    # rank 4 posts no receive buffer (its GPU has not consumed anything of the collective yet: a late
    # kernel) while rank 3 has data ready: the receiver's side, not rank 3's NIC
    special = {
        3: [(0, 4, True, steps, 8, 8, 0, 0), (0, 2, False, steps, 8, 8, 8, 0)],
        4: [(0, 5, True, steps, 8, 0, 0, 0), (0, 3, False, steps, 8, 8, 8, 0)],
    }
    for r in (0, 1, 2, 5):  # the others wait on the ring at its start too
        special[r] = [(0, (r + 1) % 6, True, steps, 8, 0, 0, 0), (0, (r - 1) % 6, False, steps, 8, 8, 0, 0)]
    special[3] = [(0, 4, True, steps, 8, 8, 0, 0), (0, 2, False, steps, 8, 8, 0, 0)]
    found = flow_deps.judge(_ledger(8, special), {r: f"h{r}" for r in range(6)})
    assert found is not None and found.rank == 4 and found.locus == flow_deps.LOCUS_RECV, found


def test_one_beat_of_backlog_names_nobody_the_ledger_wants_evidence_across_heartbeats() -> None:
    from mycroft.rca_service.analysis import flow_deps

    steps = 40
    special = {3: [(0, 4, True, steps, 28, 28, 28, 20), (0, 2, False, steps, 28, 28, 21, 20)]}
    assert flow_deps.judge(_ledger(2, special), {r: f"h{r}" for r in range(6)}) is None


# ------------------------------------------------------------------ one verdict (tracker)
def _slow(rank: int, severity: str = "warning") -> Finding:
    return Finding("job", SLOWDOWN, f"slow link at {rank}", [RootCause(rank, RC_LINK, {"text": "x"})], {}, {},
                   severity, "")


def test_a_verdict_changes_only_on_evidence_that_outweighs_it_and_each_change_is_recorded() -> None:
    tracker = IncidentTracker(resolve_after_s=3.0, verdict_hold_s=5.0)
    t = 100.0
    tracker.observe("job", [_slow(3)], t)
    for i in range(40):  # a snapshot rule alternating between the rank and its neighbour, 10 s
        t += 0.25
        tracker.observe("job", [_slow(4 if i % 2 else 3)], t)
    incident = tracker.active["job/slowdown"]
    assert incident.root_causes[0]["rank"] == 3 and incident.verdict_changes == []
    for _ in range(30):  # the neighbour named in every pass for 7.5 s: it outweighs the standing verdict
        t += 0.25
        tracker.observe("job", [_slow(4)], t)
    assert incident.root_causes[0]["rank"] == 4
    assert [(c["from"], c["to"]) for c in incident.verdict_changes] == [([3, "link"], [4, "link"])]
    assert "every pass" in incident.verdict_changes[0]["why"]
    assert incident.to_dict()["verdict_changes"] == incident.verdict_changes


def test_a_louder_finding_replaces_a_quieter_one_at_once() -> None:
    tracker = IncidentTracker(resolve_after_s=3.0)
    tracker.observe("job", [_slow(7, "info")], 10.0)
    tracker.observe("job", [_slow(2, "warning")], 10.25)
    incident = tracker.active["job/slowdown"]
    assert incident.root_causes[0]["rank"] == 2 and len(incident.verdict_changes) == 1


def test_a_deadlock_verdict_does_not_alternate_between_the_members_of_its_cycle() -> None:
    from mycroft.rca_service.analysis.findings import DEADLOCK, RC_DEADLOCK

    def cycle(first: int) -> Finding:
        ranks = [first, 1 - first]
        return Finding("job", DEADLOCK, "cycle", [RootCause(r, RC_DEADLOCK, {"text": "x"}) for r in ranks], {}, {},
                       "critical", "")

    tracker = IncidentTracker(resolve_after_s=3.0)
    for i in range(40):  # the simulator's 256-rank deadlock: the cycle's order flipped 22 times in 20 s
        tracker.observe("job", [cycle(i % 2)], 50.0 + 0.25 * i)
    incident = tracker.active["job/deadlock"]
    assert incident.root_causes[0]["rank"] == 0 and incident.verdict_changes == []
