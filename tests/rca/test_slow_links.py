"""slow_links.py: which rank's NIC / PCIe / proxy paces a moving ring, from heartbeats' flow counters.

Hand-built 6-rank rings (counters as the plugin reports them), independent of the simulator.
"""

from __future__ import annotations

from mycroft.rca_service.analysis import verdict
from mycroft.rca_service.analysis.slow_links import LOCUS_NETWORK, LOCUS_PCIE, LOCUS_PROXY, find_slow_link, flow_mark
from mycroft.rca_service.analysis.slowness import HELD_RATE, job_slowdown
from mycroft.rca_service.config import AnalysisConfig
from mycroft.rca_service.ingest.state import JobState, RankState

from mycroft import schema

CFG = AnalysisConfig()
N = 6
STEPS = 10


def _attrs(rank: int, flows: list[tuple[bool, int, int, int, int, float]]) -> dict[str, object]:
    """flows: (is_send, posted, G, T, D, age) of the rank's ring flows, channel 0."""
    peers = [(rank + 1) % N if send else (rank - 1) % N for send, *_ in flows]
    return {
        schema.ATTR_HB_FLOW_COMMS: ["c0ffee"] * len(flows), schema.ATTR_HB_FLOW_SEQS: [7] * len(flows),
        schema.ATTR_HB_FLOW_CHANNELS: [0] * len(flows), schema.ATTR_HB_FLOW_PEERS: peers,
        schema.ATTR_HB_FLOW_SENDS: [f[0] for f in flows], schema.ATTR_HB_FLOW_STEPS: [STEPS] * len(flows),
        schema.ATTR_HB_FLOW_POSTED: [f[1] for f in flows], schema.ATTR_HB_FLOW_GPU_READY: [f[2] for f in flows],
        schema.ATTR_HB_FLOW_TRANSMITTED: [f[3] for f in flows], schema.ATTR_HB_FLOW_DONE: [f[4] for f in flows],
        schema.ATTR_HB_FLOW_AGES_S: [f[5] for f in flows], schema.ATTR_HB_FLOW_RANKS: [rank] * len(flows),
        schema.ATTR_HB_FLOW_PROXY_STATES: [""] * len(flows),
    }


HEALTHY = [(True, 5, 5, 4, 4, 0.002), (False, 6, 6, 4, 4, 0.002)]  # one step in the pipe, buffers posted ahead


def _job(beats: list[dict[int, list[tuple[bool, int, int, int, int, float]]]]) -> JobState:
    job = JobState("ring")
    for r in range(N):
        job.ranks[r] = RankState(r)
    for beat in beats:
        for r in range(N):
            flows = beat.get(r, HEALTHY)
            job.ranks[r].flow_history.append([_attrs(r, flows) if flows else None, None])
    return job


def test_a_slow_nic_is_the_rank_whose_sends_sit_on_the_network() -> None:
    slow = {2: [(True, 8, 8, 8, 4, 0.03), (False, 6, 6, 4, 4, 0.002)]}  # 4 steps posted, not completed
    found = find_slow_link(_job([slow] * 3), CFG, slowdown=1.8)
    assert found is not None and (found.rank, found.locus, found.peer) == (2, LOCUS_NETWORK, 3)
    assert "NIC" in found.evidence["text"] and found.evidence["held"] == 4


def test_a_slow_pcie_link_is_the_rank_whose_receives_wait_to_be_flushed() -> None:
    slow = {4: [(True, 5, 5, 4, 4, 0.002), (False, 8, 8, 7, 4, 0.03)]}
    found = find_slow_link(_job([slow] * 3), CFG, slowdown=1.5)
    assert found is not None and (found.rank, found.locus, found.peer) == (4, LOCUS_PCIE, 3)


def test_a_late_proxy_has_nothing_pending_and_nothing_moving_while_its_victims_wait() -> None:
    # rank 1 posts late: counters equal, 60 ms since its last step; the others wait with
    # buffers posted (pending), as long
    waiting = [(True, 4, 4, 4, 4, 0.06), (False, 6, 6, 4, 4, 0.06)]
    beat = {r: waiting for r in range(N)} | {1: [(True, 4, 4, 4, 4, 0.06), (False, 4, 4, 4, 4, 0.06)]}
    found = find_slow_link(_job([beat] * 3), CFG, slowdown=2.0)
    assert found is not None and (found.rank, found.locus) == (1, LOCUS_PROXY)


def test_no_verdict_when_the_job_is_not_slower_or_the_backlog_does_not_persist() -> None:
    slow = {2: [(True, 8, 8, 8, 4, 0.03), (False, 6, 6, 4, 4, 0.002)]}
    assert find_slow_link(_job([slow] * 3), CFG, slowdown=1.05) is None  # not slower: a busy link is normal
    assert find_slow_link(_job([slow, {}, slow]), CFG, slowdown=1.8) is None  # one sampled beat without it
    assert find_slow_link(_job([slow] * 2), CFG, slowdown=1.8) is None  # too few beats
    # every rank equally network-bound: the ring's pace, nobody's fault
    bound = {r: [(True, 8, 8, 8, 4, 0.01), (False, 8, 8, 6, 6, 0.01)] for r in range(N)}
    assert find_slow_link(_job([bound] * 3), CFG, slowdown=1.8) is None


def test_heartbeats_without_flows_age_old_marks_out() -> None:
    slow = {2: [(True, 8, 8, 8, 4, 0.03), (False, 6, 6, 4, 4, 0.002)]}
    quiet = {r: [] for r in range(N)}
    job = _job([slow] * 3 + [quiet] * 8)  # the history holds 8 beats: the backlog is gone
    assert find_slow_link(job, CFG, slowdown=1.8) is None
    assert flow_mark(0, {}) is None


def test_sends_and_receives_lagging_on_one_rank_point_at_its_pcie_not_its_nic() -> None:
    slow = {3: [(True, 8, 8, 7, 4, 0.03), (False, 8, 8, 7, 4, 0.03)]}
    found = find_slow_link(_job([slow] * 3), CFG, slowdown=1.6)
    assert found is not None and (found.rank, found.locus) == (3, LOCUS_PCIE)


def test_one_sample_in_which_the_queue_drained_does_not_hide_the_slow_link() -> None:
    slow = {2: [(True, 8, 8, 8, 4, 0.03), (False, 6, 6, 4, 4, 0.002)]}
    found = find_slow_link(_job([slow, {}, slow, slow]), CFG, slowdown=1.8)  # oldest first: a dip, then 2 more
    assert found is not None and (found.rank, found.locus) == (2, LOCUS_NETWORK)
    assert find_slow_link(_job([slow, {}, {}, slow]), CFG, slowdown=1.8) is None  # two dips: not persistent


# ---------------------------------------------------------------------------- the held baseline
def _paced_job(ranks: int = 8) -> JobState:
    job = JobState("paced")
    for r in range(ranks):
        job.ranks[r] = RankState(r)
    return job


def _beat(job: JobState, at: float, ops_per_s: int) -> None:
    """One heartbeat interval of every rank: ops completed at this pace, 40% of the time in comm."""
    for rank in job.ranks.values():
        t, comm, ops = rank.work[-1] if rank.work else (at - 1.0, 0.0, 0)
        rank.work.append((at, comm + 0.4 * (at - t), ops + ops_per_s))
        job.heartbeats += 1  # as the fold counts them (the work table refreshes on it)
    job.last_seen = at


def test_a_slowdown_that_lasts_stays_a_slowdown_and_ends_when_the_pace_is_back() -> None:
    """The baseline window slides over slow intervals: without the held rate a job 1.5x slower is
    "not slower" ~6 intervals later (its NIC still capped), and its slow link goes unnamed."""
    job, at = _paced_job(), 100.0
    for _ in range(12):
        at += 1.0
        _beat(job, at, 30)
    assert job_slowdown(job, CFG, CFG.slow_link_beats) == 1.0
    seen = []
    for _ in range(25):
        at += 1.0
        _beat(job, at, 20)
        seen.append(job_slowdown(job, CFG, CFG.slow_link_beats))
    assert all(s >= 1.45 for s in seen[2:]), seen  # from the 3rd slow interval on, all along
    assert HELD_RATE in job.memo
    for _ in range(4):
        at += 1.0
        _beat(job, at, 30)
        back = job_slowdown(job, CFG, CFG.slow_link_beats)
    assert back < 1.05 and HELD_RATE not in job.memo, back  # back at its pace: nothing held


def test_the_held_rate_expires_and_a_faster_baseline_replaces_it() -> None:
    cfg = AnalysisConfig(slow_baseline_hold_s=6.0)
    job, at = _paced_job(), 100.0
    for _ in range(12):
        at += 1.0
        _beat(job, at, 30)
    seen = []
    for _ in range(20):
        at += 1.0
        _beat(job, at, 20)
        seen.append(job_slowdown(job, cfg, cfg.slow_link_beats))
    assert max(seen) >= 1.45 and seen[-1] < 1.05, seen  # the new pace is the baseline once the hold ran out
    job.memo[HELD_RATE] = (10.0, at)  # a held rate slower than the job's baseline is no reference
    at += 1.0
    _beat(job, at, 20)
    assert job_slowdown(job, cfg, cfg.slow_link_beats) < 1.05


def test_a_costly_slowness_search_is_held_at_most_two_intervals() -> None:
    """At 16k ranks a first search costs ~0.2 s (one-off work): held cost / 5% = 4 s, it hid a
    slow link for that long. The hold is capped at SLOWNESS_MAX_HOLD intervals."""
    job = _paced_job()
    held = object()
    job.memo["slowdown"] = (100.0, held, 0.2)
    assert verdict._slowdown_bounded(job, 100.0 + 0.9 * verdict.SLOWNESS_MAX_HOLD, CFG) is held
    assert verdict._slowdown_bounded(job, 100.0 + 1.1 * verdict.SLOWNESS_MAX_HOLD, CFG) is None  # searched again
    assert job.memo["slowdown"][1] is None


def test_a_nic_slow_from_the_start_is_named_on_its_flows_alone_on_stricter_evidence() -> None:
    """No baseline to be slower than (a bad cable before the launch): 6 sampled beats, 2x any other rank."""
    slow = {2: [(True, 8, 8, 8, 4, 0.03), (False, 6, 6, 4, 4, 0.002)]}
    found = find_slow_link(_job([slow] * 6), CFG, slowdown=1.0)
    assert found is not None and (found.rank, found.locus, found.peer, found.alone) == (2, LOCUS_NETWORK, 3, True)
    assert found.evidence["no_baseline"] is True and "since before" in found.evidence["text"]
    assert find_slow_link(_job([slow] * 5), CFG, slowdown=1.0) is None  # 3 beats do for a slower job, not here
    # the ranks at both ends of a network hop of a ring that is network-bound by design hold alike
    boundary = {1: slow[2], 4: slow[2]}
    assert find_slow_link(_job([boundary] * 6), CFG, slowdown=1.0) is None
    assert find_slow_link(_job([boundary] * 3), CFG, slowdown=1.8) is not None  # slower: the worst is named
    # another rank holds more than half as much: no outlier
    near = slow | {5: [(True, 7, 7, 7, 4, 0.02), (False, 6, 6, 4, 4, 0.002)]}
    assert find_slow_link(_job([near] * 6), CFG, slowdown=1.0) is None


def test_the_search_on_flows_alone_is_paced() -> None:
    slow = {2: [(True, 8, 8, 8, 4, 0.03), (False, 6, 6, 4, 4, 0.002)]}
    job = _job([slow] * 6)
    job.hb_interval, job.last_seen = 1.0, 100.0
    assert find_slow_link(job, CFG, slowdown=1.0) is not None
    for r in range(N):  # the backlog is gone ...
        job.ranks[r].flow_history.clear()
    job.last_seen = 102.0
    assert find_slow_link(job, CFG, slowdown=1.0) is not None  # ... but the last answer stands 3 intervals
    job.last_seen = 103.0
    assert find_slow_link(job, CFG, slowdown=1.0) is None
    assert find_slow_link(_job([slow] * 3), CFG, slowdown=1.8) is not None  # the slower-job search is not paced
