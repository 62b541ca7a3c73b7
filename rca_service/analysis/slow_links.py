"""Which rank's link makes a moving ring slow: the flow counters of heartbeats, over time.

A slower NIC, a downgraded PCIe link or a late proxy thread do not stop a ring, they pace
it: every rank waits more and none computes more, so the compute-share rule
(slowness.py) rightly names no straggler, and the hang path never runs. What differs is
where each rank's in-flight steps sit when its heartbeat samples them (the plugin's
per-flow counters, flow_state.py):

* send flow, transmitted - done: posted to the network, completion not seen: the
  sender's NIC / the wire drains slowly (NIC bandwidth limit, background traffic);
* receive flow, transmitted - done: arrived, not yet consumed / flushed to the GPU: the
  receiver's PCIe / GPU side (PCIe downgrade; when its sends lag too, the GPU<->NIC path
  both ways: PCIe rather than the NIC);
* nothing pending on any of the rank's flows, yet none moved for long: its proxy posts
  late (a victim always has something pending: receive buffers posted, waiting for data).

A rank holds a backlog at one of its own loci in the recent heartbeats that sampled its
flows (all of the last 3, or 3 of the last 4), well above what the ring's other ranks ever
hold there, while the job runs slower than its baseline: that rank's link is named.

A link that was slow from the job's first second leaves no baseline to be slower than (a
bad cable is there before the launch). Then the rank is named on its flows alone, on
stricter evidence: it holds the backlog in each of its last `slow_link_alone_beats` sampled
heartbeats, and `slow_link_alone_factor` times what any other rank holds (the two ranks at
a node boundary of a ring that is network-bound by design hold alike: nobody is named).
That search reads every rank's flows whatever the pace, so it runs at most every
`ALONE_EVERY_INTERVALS` heartbeat intervals and to about `ALONE_SHARE` of the time.
Functions of the job state (the paced search keeps its last answer in job.memo).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import AnalysisConfig
from ..ingest.state import JobState
from . import flow_state

LOCUS_NETWORK = "network"  # its sends are posted to the network and complete slowly
LOCUS_PCIE = "pcie"  # what it receives waits to be flushed / consumed by its GPU
LOCUS_PROXY = "proxy"  # nothing pending, nothing moving: its proxy posts late

_LOCUS_TEXT = {
    LOCUS_NETWORK: "its sends sit posted to the network, not completed (transmitted - done): its NIC or the "
                   "link drains slowly",
    LOCUS_PCIE: "what it receives sits arrived but not flushed to its GPU (transmitted - done on its receive "
                "flows), its sends lag too where they do: its PCIe / GPU side is slow",
    LOCUS_PROXY: "its flows have nothing pending yet do not move: its proxy thread posts steps late",
}


@dataclass(frozen=True, slots=True)
class FlowMark:
    """Where one heartbeat's in-flight flows of one rank hold their steps (max over its flows)."""

    network: int  # send flows: transmitted - done
    network_peer: int
    pcie: int  # receive flows: transmitted - done
    pcie_peer: int
    idle_s: float  # every flow with nothing pending: the youngest one's age; 0 when something is pending


@dataclass(slots=True)
class SlowLink:
    rank: int
    locus: str
    peer: int
    held: float  # what it held in every recent sampled heartbeat (steps; seconds for the proxy)
    ring_typical: float  # what the other ranks hold there at most (median over them)
    beats: int
    slowdown: float
    evidence: dict[str, Any] = field(default_factory=dict)
    alone: bool = False  # named on its flows alone: the job shows no slowdown against a baseline


ALONE_MEMO = "slow_link_alone"  # job.memo: (job.last_seen, answer, cost s) of the last search on flows alone
ALONE_EVERY_INTERVALS = 3.0
ALONE_SHARE = 0.02


def flow_mark(rank: int, attrs: Mapping[str, Any]) -> FlowMark | None:
    """One heartbeat's flows of `rank`, summarised; None when it sampled no flow."""
    flows = [f for f in flow_state.parse_flows(rank, attrs) if f.rank == rank and f.d < f.steps]
    if not flows:
        return None
    network = max(((f.t - f.d, f.peer) for f in flows if f.send), default=(0, -1))
    pcie = max(((f.t - f.d, f.peer) for f in flows if not f.send), default=(0, -1))
    pending = any(f.g > f.t or f.t > f.d or f.posted > f.g for f in flows)
    idle = 0.0 if pending else min(f.age for f in flows)
    return FlowMark(network[0], network[1], pcie[0], pcie[1], idle)


def _marks(job: JobState, beats: int) -> dict[int, list[FlowMark]]:
    """Each rank's marks of its last `beats` heartbeats that sampled flows (computed once, kept)."""
    out: dict[int, list[FlowMark]] = {}
    for r, rank in job.ranks.items():
        history = rank.flow_history
        if not history:
            continue
        marks: list[FlowMark] = []
        for entry in reversed(history):
            if entry[1] is None:
                entry[1] = (flow_mark(r, entry[0]) if entry[0] else None) or False
            if entry[1]:
                marks.append(entry[1])
                if len(marks) == beats + 1:
                    break
        if marks:
            out[r] = marks
    return out


def _culprit(marks: Mapping[int, Sequence[FlowMark]], locus: str, beats: int, cfg: AnalysisConfig,
             alone: bool = False) -> tuple[int, float, float, int] | None:
    """(rank, held, ring typical, peer) of the rank holding most at `locus` in its recent sampled beats;
    `alone`: and slow_link_alone_factor times what the next rank holds there."""
    def value_of(m: FlowMark) -> float:
        return float(m.network) if locus == LOCUS_NETWORK else float(m.pcie) if locus == LOCUS_PCIE else m.idle_s

    def held(ms: Sequence[FlowMark]) -> float:
        """What it held in each of its last `beats` sampled heartbeats, or in all but one of the
        last beats + 1 (a queue that drained for one sample is still the slow link)."""
        values = [value_of(m) for m in ms]
        strict = min(values[:beats])
        if len(values) > beats:
            return max(strict, sorted(values[:beats + 1])[1])
        return strict

    full = {r: ms for r, ms in marks.items() if len(ms) >= beats}
    if len(full) < 3:
        return None
    holding = {r: held(ms) for r, ms in full.items()}
    top = max(holding, key=holding.__getitem__)
    value = holding[top]
    typical = statistics.median(max(value_of(m) for m in ms) for r, ms in full.items() if r != top)
    if alone:
        second = max(v for r, v in holding.items() if r != top)
        margin = 0.0 if locus == LOCUS_PROXY else cfg.slow_link_min_steps
        if value < cfg.slow_link_alone_factor * second or value < second + margin:
            return None
    if locus == LOCUS_PROXY:
        if value < cfg.slow_link_min_idle_s or value < cfg.slow_link_factor * typical:
            return None
        peer = -1
    else:
        if value < cfg.slow_link_min_steps or value < typical + cfg.slow_link_min_steps:
            return None
        last = full[top][0]
        peer = last.network_peer if locus == LOCUS_NETWORK else last.pcie_peer
    return top, value, typical, peer


def find_slow_link(job: JobState, cfg: AnalysisConfig, slowdown: float) -> SlowLink | None:
    """The rank whose link paces the job: when the job runs slower and one rank's flows say why,
    or, with no slowdown to go by, when its flows alone do (paced: _alone_paced)."""
    if slowdown >= cfg.slow_link_min_slowdown:
        return _search(job, cfg, slowdown, cfg.slow_link_beats, alone=False)
    return _alone_paced(job, cfg, slowdown)


def _alone_paced(job: JobState, cfg: AnalysisConfig, slowdown: float) -> SlowLink | None:
    """_search on flows alone, re-run after max(ALONE_EVERY_INTERVALS intervals, cost / ALONE_SHARE)."""
    memo = job.memo.get(ALONE_MEMO)
    now = job.last_seen
    if memo is not None and 0.0 <= now - memo[0] < max(ALONE_EVERY_INTERVALS * job.hb_interval, memo[2] / ALONE_SHARE):
        return memo[1]
    started = time.thread_time()
    found = _search(job, cfg, slowdown, cfg.slow_link_alone_beats, alone=True)
    job.memo[ALONE_MEMO] = (now, found, time.thread_time() - started)
    return found


def _search(job: JobState, cfg: AnalysisConfig, slowdown: float, beats: int, alone: bool) -> SlowLink | None:
    marks = _marks(job, beats)
    found_at = {locus: _culprit(marks, locus, beats, cfg, alone) for locus in (LOCUS_NETWORK, LOCUS_PCIE, LOCUS_PROXY)}
    net, pcie = found_at[LOCUS_NETWORK], found_at[LOCUS_PCIE]
    if net is not None and pcie is not None and net[0] == pcie[0]:
        found_at[LOCUS_NETWORK] = None  # its sends and its receives both lag: the GPU<->NIC path (PCIe)
    for locus in (LOCUS_NETWORK, LOCUS_PCIE, LOCUS_PROXY):
        found = found_at[locus]
        if found is None:
            continue
        rank, held, typical, peer = found
        unit = "s idle" if locus == LOCUS_PROXY else " steps"
        pace = (f"the job completes ops x{slowdown:.2f} against its baseline: it has run at this pace since before "
                f"one was measured, and no other rank holds more than 1/{cfg.slow_link_alone_factor:g} of that"
                if alone else f"the job completes ops x{slowdown:.2f} slower")
        text = (f"rank {rank}: {_LOCUS_TEXT[locus]}; it held {held:g}{unit} there in each of its last {beats} "
                f"sampled heartbeats, the ring's other ranks at most {typical:g}{unit} (median); {pace}"
                + (f"; the link to rank {peer}" if peer >= 0 else ""))
        evidence = {"text": text, "locus": locus, "held": held, "ring_typical": typical, "beats": beats,
                    "peer": peer if peer >= 0 else None, "job_slowdown": round(slowdown, 3), "no_baseline": alone,
                    "suspect_side": flow_state.SIDE_RECV if locus == LOCUS_PCIE else flow_state.SIDE_SEND}
        return SlowLink(rank, locus, peer, held, typical, beats, slowdown, evidence, alone)
    return None
