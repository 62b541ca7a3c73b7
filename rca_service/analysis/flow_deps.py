"""Which rank's NIC, link, GPU side or proxy holds a ring: dependencies read over many heartbeats.

A heartbeat samples each of a rank's NET flows at one instant (posted / GPU-ready /
transmitted / done). One sample says little: a healthy ring's senders hold up to NCCL's
8-step window on the wire at every collective's start, a GPU whose next hop is slow holds
a receive backlog it cannot forward, and a sender that has data but no clear-to-send
(CTS) waits on its receiver. So this module never names a rank from a snapshot. It folds
every sampled flow, once, into a per-link ledger of what each end of the link waited on --

* the sender's side of link x->y (x's heartbeats): steps on the wire, posted to the network and
  not completed (T - D); steps whose data is ready but not transmitted (G - T);
* the receiver's side (y's heartbeats): buffers posted ahead for x's data, i.e. CTS sent
  (G - T on y's receive flow); steps arrived but not consumed by y's GPU (T - D). A receive
  backlog is a cause only where y could have forwarded: the send that carries y's data off
  its host on that ring (its own, or over NVLink the host's exit GPU's) was not *blocked*
  (window full, G - D >= NCCL_STEPS - 1, or data waiting for a CTS, G > T), and only while y
  had consumed nothing of the collective yet (a GPU that consumed and then stopped was
  stopped by its next hop, which NVLink hides); otherwise it is backpressure;

-- decayed over samples (``LEDGER_DECAY`` per sample of the link: about ten heartbeats of
memory, across collectives), and then compares each link with its peers (the median link of
the job over the same window):

* **network** of rank x: per link, the excess steps on the wire plus the excess data ready while
  the receiver had posted its buffers (a CTS was sent) yet nothing moved -- the path between
  them, averaged over the rank's channels (a NIC fault shows on all of them, fabric noise on one
  at a time); a rank scores the better of two hypotheses, its NIC (twice the weaker of its
  outgoing and incoming excess: both directions stall) or its outgoing link alone, so a link
  slow one way names its sender and a NIC slow or dead both ways names its rank, not the
  neighbours, which explain one of its links each;
* **receiver side** of rank y: data ready at its upstream sender while y posted no buffer (no
  CTS: y does not post, read as y's side -- not the sender's NIC), and steps arrived at y but
  not consumed, each counted only in the share of samples where y's own next hop had room;
* **proxy** of rank x: samples in which none of its flows had anything pending while they had
  not moved for a while (its proxy thread posts late), against the other ranks.

The rank with the largest score is named when it exceeds ``MIN_SCORE`` steps and
``MARGIN`` times the runner-up; the evidence lists its links' figures beside the median.
Pure functions of the job state; the ledger lives in job.memo.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mycroft import schema

from ..ingest.state import JobState
from . import flow_state

NCCL_STEPS = 8  # NCCL's step window per connection (src/include/device.h)
LEDGER = "flow_ledger"
LEDGER_DECAY = 0.97  # per sample of a link: ~33 samples of memory
MIN_SCORE = 1.5  # steps of excess over the median link
BALANCE = 0.6  # the NIC hypothesis needs the weaker direction at this share of the stronger
MARGIN = 1.5  # ... and this many times the runner-up
MIN_SAMPLES = 4.0  # decayed samples of a link before it is judged
PERSIST_INTERVALS = 3.0  # the same rank on top of the ledger for this many heartbeat intervals
TOP = "flow_deps_top"  # job.memo: (rank on top, since)
MAX_RANKS_PER_PASS = 2048  # flow samples folded per pass: beyond, every k-th rank (bounded cost at scale)

LOCUS_NIC = "network"
LOCUS_RECV = "receiver"
LOCUS_PROXY = "proxy"

_TEXT = {
    LOCUS_NIC: "its links hold steps posted to the network that do not complete, or data ready with the "
               "receiver's buffers posted that is not transmitted: its NIC / the link",
    LOCUS_RECV: "its side of the receive holds the ring: it posts no buffer (no clear-to-send) for data its "
                "upstream sender has ready, or what arrived waits to be consumed by its GPU while its own next "
                "hop has room (not backpressure)",
    LOCUS_PROXY: "its flows have nothing pending yet do not move: its proxy thread posts steps late",
}


Key = tuple[int, int, int]  # (sender, receiver, channel)
BINS = 8  # a flow's progress (done / steps) in eighths: its peers are compared at the same point


@dataclass(slots=True)
class Link:
    """Decayed sums of one link's samples, from both of its ends, per progress bin (the same steps)."""

    ring: tuple[str, int] = ("", 0)  # (commHash, channel): the ring whose other links are its peers
    tx: dict[int, list[float]] = field(default_factory=dict)  # bin -> [samples, on the wire, ready not sent, blocked]
    rx: dict[int, list[float]] = field(default_factory=dict)  # bin -> [samples, posted ahead, not consumed, blocked]
    n_tx: float = 0.0
    n_rx: float = 0.0

    def add_tx(self, b: int, wire: float, ready: float, blocked: bool) -> None:
        self.n_tx = _decay_add(self.tx, self.n_tx, b, wire, ready, blocked)

    def add_rx(self, b: int, ahead: float, unconsumed: float, blocked: bool | None) -> None:
        self.n_rx = _decay_add(self.rx, self.n_rx, b, ahead, unconsumed, blocked)


def _decay_add(bins: dict[int, list[float]], n: float, b: int, first: float, second: float,
               blocked: bool | None) -> float:
    """One sample into one side's bins: every bin decays with the link's samples (old evidence fades), then
    bin `b` takes [1, first, second, blocked]; the side's decayed sample count after it."""
    d = LEDGER_DECAY
    for v in bins.values():
        v[0] *= d
        v[1] *= d
        v[2] *= d
        v[3] *= d
    v = bins.setdefault(b, [0.0, 0.0, 0.0, 0.0])
    v[0] += 1.0
    v[1] += first
    v[2] += second
    v[3] += 1.0 if blocked else 0.0
    return n * d + 1.0


@dataclass(slots=True)
class Ledger:
    links: dict[tuple[int, int, int], Link] = field(default_factory=dict)  # (sender, receiver, channel)
    idle: dict[int, list[float]] = field(default_factory=dict)  # rank -> [decayed samples, decayed idle s]
    samples: int = 0
    scores: dict[int, dict[str, float]] = field(default_factory=dict)  # the last judgement's, per rank and locus


@dataclass(slots=True)
class LinkFinding:
    rank: int
    locus: str
    score: float
    runner_up: float
    peer: int
    evidence: dict[str, Any]


def ledger(job: JobState) -> Ledger:
    """The job's ledger, with every flow sample not folded yet folded in (each once)."""
    led: Ledger | None = job.memo.get(LEDGER)
    if led is None:
        led = job.memo[LEDGER] = Ledger()
    with_flows = [r for r in job.ranks.values() if r.flow_history]
    stride = max(1, math.ceil(len(with_flows) / MAX_RANKS_PER_PASS))
    for i, rank in enumerate(with_flows):
        history = rank.flow_history
        if len(history[-1]) > 2:  # newest folded already: so is everything before it
            continue
        fold = i % stride == 0
        for entry in reversed(history):
            if len(entry) > 2:
                break
            entry.append(True)
            if fold and entry[0]:
                _fold(led, rank.rank, entry[0])
    return led


def _fold(led: Ledger, rank: int, attrs: Mapping[str, Any]) -> None:
    flows = [f for f in flow_state.parse_flows(rank, attrs) if f.rank == rank and f.d < f.steps]
    if not flows:
        return
    led.samples += 1
    sends = {(f.comm, f.seq, f.channel): f for f in flows if f.send}
    pending = False
    youngest = math.inf
    for f in flows:
        youngest = min(youngest, f.age)
        if f.send:
            if f.g > f.t or f.t > f.d or f.posted > f.g:
                pending = True
            link = led.links.get((f.rank, f.peer, f.channel))
            if link is None:
                link = led.links[(f.rank, f.peer, f.channel)] = Link((f.comm, f.channel))
            link.add_tx(_bin(f), float(f.t - f.d), float(f.g - f.t), f.g - f.d >= NCCL_STEPS - 1 or f.g > f.t)
        else:
            if f.g > f.t or f.t > f.d:
                pending = True
            mine = sends.get((f.comm, f.seq, f.channel))
            blocked = mine is not None and (mine.g - mine.d >= NCCL_STEPS - 1 or mine.g > mine.t)
            link = led.links.get((f.peer, f.rank, f.channel))
            if link is None:
                link = led.links[(f.peer, f.rank, f.channel)] = Link((f.comm, f.channel))
            link.add_rx(_bin(f), float(f.g - f.t), float(f.t - f.d), blocked)
    idle = led.idle.setdefault(rank, [0.0, 0.0])
    idle[0] = idle[0] * LEDGER_DECAY + 1.0
    idle[1] = idle[1] * LEDGER_DECAY + (0.0 if pending or youngest == math.inf else youngest)


def _bin(f: Any) -> int:
    return min(BINS - 1, BINS * f.d // max(1, f.steps))


def _excess(links: Mapping[Key, Link], side: str, i: int, only: int | None = None) -> dict[Key, float]:
    """Per link: its mean of quantity i over its samples, each progress bin taken against the median
    of its ring's links in that bin (its peers over the same steps), weighted by its samples."""
    means: dict[tuple[tuple[str, int], int], list[float]] = {}
    for link in links.values():
        for b, v in (link.tx if side == "tx" else link.rx).items():
            if v[0] > 0.05 and (only is None or b == only):
                means.setdefault((link.ring, b), []).append(v[i] / v[0])
    medians = {k: statistics.median(m) for k, m in means.items() if len(m) >= 2}
    out: dict[Key, float] = {}
    for key, link in links.items():
        bins = [(b, v) for b, v in (link.tx if side == "tx" else link.rx).items()
                if v[0] > 0.05 and (link.ring, b) in medians]
        n = sum(v[0] for _, v in bins)
        out[key] = sum(v[0] * (v[i] / v[0] - medians[(link.ring, b)]) for b, v in bins) / n if n else 0.0
    return out


def _mean(links: Mapping[Key, Link], side: str, i: int) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for key, link in links.items():
        bins = link.tx if side == "tx" else link.rx
        n = sum(v[0] for v in bins.values())
        out[key] = sum(v[i] for v in bins.values()) / n if n else 0.0
    return out


def _per(total: float, n: float) -> float:
    return total / n if n > 0 else 0.0


def judge(led: Ledger, hosts: Mapping[int, str] | None = None) -> LinkFinding | None:
    """The rank whose links the job's others wait on, on the ledger's evidence; None when no rank
    stands out of its peers by MIN_SCORE steps and MARGIN times the runner-up."""
    hosts = hosts or {}
    links = {k: v for k, v in led.links.items() if v.n_tx >= MIN_SAMPLES and v.n_rx >= MIN_SAMPLES}
    if len(links) < 3:
        return None
    wire_x = _excess(links, "tx", 1)  # steps on the wire, over its peers at the same steps
    ready_x = _excess(links, "tx", 2)
    # arrived and not consumed while the receiver had consumed nothing of the collective yet (its first
    # progress bin): its kernel is not running; a GPU that consumed and then stopped was held by its next hop
    uncons_x = _excess(links, "rx", 2, only=0)
    wire, ready = _mean(links, "tx", 1), _mean(links, "tx", 2)
    ahead, uncons, blocked = _mean(links, "rx", 1), _mean(links, "rx", 2), _mean(links, "rx", 3)
    med_wire = statistics.median(wire.values())
    med_ready = statistics.median(ready.values())
    med_uncons = statistics.median(uncons.values())
    score: dict[int, dict[str, float]] = {}

    def add(rank: int, locus: str, value: float) -> None:
        if value > 0:
            loci = score.setdefault(rank, {})
            loci[locus] = loci.get(locus, 0.0) + value

    tx_blocked = _mean(links, "tx", 3)
    exits: dict[tuple[str, tuple[str, int]], list[Key]] = {}  # (host, ring) -> its links leaving the host
    for k, link in links.items():
        exits.setdefault((hosts.get(k[0], ""), link.ring), []).append(k)

    def forward_blocked(y: int, ring: tuple[str, int]) -> float:
        """How often what y receives on this ring could not go on: the send that carries it off y's host
        (y's own, or over NVLink the host's exit GPU's) had its window full or waited for a CTS."""
        out = exits.get((hosts.get(y, ""), ring)) if hosts.get(y) else None
        if not out:
            out = [k for k in links if k[0] == y and links[k].ring == ring]
        return max((tx_blocked[k] for k in out), default=0.0)

    outs: dict[int, list[float]] = {}  # per rank, each of its outgoing links' excess (one per channel)
    ins: dict[int, list[float]] = {}
    recv: list[tuple[int, float]] = []
    for k in links:
        x, y = k[0], k[1]
        posted = min(1.0, ahead[k] / 2.0)  # the receiver had buffers posted: its CTS was sent
        r = max(0.0, ready_x[k])
        # steps on the wire that do not complete, and data ready with a CTS sent that does not move: the
        # path between x and y (x's NIC, the wire, y's NIC)
        e = wire_x[k] + r * posted
        outs.setdefault(x, []).append(e)
        ins.setdefault(y, []).append(e)
        held = 1.0 - forward_blocked(y, links[k].ring)  # not backpressure from y's own next hop
        recv.append((y, r * (1.0 - posted) * held))  # no CTS: the receiver's side
        recv.append((y, uncons_x[k] * held))  # arrived, not consumed, though it could go on
    # a NIC carries several channels: a fault shows on all of them, fabric noise on one at a time
    out_net = {x: statistics.fmean(v) for x, v in outs.items()}
    in_net = {y: statistics.fmean(v) for y, v in ins.items()}
    for x in set(out_net) | set(in_net):
        o, i = out_net.get(x, 0.0), in_net.get(x, 0.0)
        # hypotheses: its NIC (its links stall both ways: twice the weaker direction) or its outgoing link
        # alone (a link slow one way names its sender); a neighbour explains one of the two links only
        both = min(o, i) >= BALANCE * max(o, i)  # a NIC slows both directions alike; a neighbour sees one
        add(x, LOCUS_NIC, max(2.0 * min(o, i) if both else 0.0, o))
    for y, v in recv:
        # a rank whose own sends are slow finishes each collective late and so starts the next one late:
        # that lateness is its link's doing, counted there
        add(y, LOCUS_RECV, v / (1.0 + max(0.0, out_net.get(y, 0.0))))
    idle = {r: _per(v[1], v[0]) for r, v in led.idle.items() if v[0] >= MIN_SAMPLES}
    if len(idle) >= 3:
        med_idle = statistics.median(idle.values())
        for r, v in idle.items():
            if v > 0.01 and v > 4 * med_idle:
                add(r, LOCUS_PROXY, 1000.0 * (v - med_idle) / 10.0)  # 10 ms idle ~ one step of excess
    led.scores = score
    if not score:
        return None
    totals = {r: sum(loci.values()) for r, loci in score.items()}
    ordered = sorted(totals, key=totals.__getitem__, reverse=True)
    top = ordered[0]
    best = totals[top]
    second = totals[ordered[1]] if len(ordered) > 1 else 0.0
    if best < MIN_SCORE or best < MARGIN * second:
        return None
    locus = max(score[top], key=score[top].__getitem__)
    mine = sorted(((k, v) for k, v in links.items() if top in k[:2]), key=lambda kv: -(wire_x[kv[0]]
                                                                                      + uncons_x[kv[0]]))
    peer = -1
    if locus == LOCUS_NIC:
        out = [k for k, _ in mine if k[0] == top]
        peer = out[0][1] if out else -1
    elif locus == LOCUS_RECV:
        inc = [k for k, _ in mine if k[1] == top]
        peer = inc[0][0] if inc else -1
    figures = [{"link": f"{k[0]}->{k[1]}", "channel": k[2], "on_wire": round(wire[k], 2),
                "on_wire_over_ring": round(wire_x[k], 2), "ready_not_sent": round(ready[k], 2),
                "receiver_posted_ahead": round(ahead[k], 2), "arrived_not_consumed": round(uncons[k], 2),
                "receiver_blocked_share": round(blocked[k], 2)} for k, _ in mine[:8]]
    text = (f"rank {top}: {_TEXT[locus]}; over the last ~{round(1 / (1 - LEDGER_DECAY))} samples of each link its "
            f"score is {best:.1f} steps above the job's median link "
            f"({', '.join(f'{k} {v:.1f}' for k, v in sorted(score[top].items()))}), "
            f"the next rank {second:.1f}; median link: {med_wire:.1f} steps on the wire, {med_ready:.1f} ready "
            f"not sent, {med_uncons:.1f} arrived not consumed")
    evidence = {"text": text, "locus": locus, "score": round(best, 2), "runner_up": round(second, 2),
                "peer": peer if peer >= 0 else None, "links": figures,
                "median_link": {"on_wire": round(med_wire, 2), "ready_not_sent": round(med_ready, 2),
                                "arrived_not_consumed": round(med_uncons, 2)},
                "suspect_side": flow_state.SIDE_RECV if locus == LOCUS_RECV else flow_state.SIDE_SEND,
                "samples": led.samples}
    return LinkFinding(top, locus, best, second, peer, evidence)


def find(job: JobState) -> LinkFinding | None:
    """Fold the new samples, judge, and name a rank only once the ledger has named it in every pass for
    PERSIST_INTERVALS heartbeat intervals (evidence kept across heartbeats, not one pass's)."""
    if not any(r.flow_history for r in job.ranks.values()):
        return None
    found = judge(ledger(job), {r: rank.host for r, rank in job.ranks.items() if rank.host})
    top = job.memo.get(TOP)
    now = job.last_seen
    if found is None:
        job.memo.pop(TOP, None)
        return None
    if top is None or top[0] != found.rank:
        job.memo[TOP] = top = (found.rank, now)
    if now - top[1] < PERSIST_INTERVALS * job.hb_interval:
        return None
    found.evidence["named_for_s"] = round(now - top[1], 2)
    return found


__all__ = ["LOCUS_NIC", "LOCUS_PROXY", "LOCUS_RECV", "LinkFinding", "find", "judge", "ledger",
           "schema"]
