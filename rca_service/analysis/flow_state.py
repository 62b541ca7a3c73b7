"""Mycroft's per-flow state table over the native heartbeat counters (pure functions).

Each rank's heartbeat carries, for every NCCL flow still in flight, the cumulative step
counters the profiler plugin keeps: posted (the proxy started the step), GPU-ready,
transmitted, done. For a send flow GPU-ready means the GPU produced the step's data,
transmitted that it was posted to the network, done that the completion was seen; for a
receive flow GPU-ready means the receive buffer was posted (the receiver is ready),
transmitted that the data arrived, done that the GPU consumed it.

The paper's table names where a flow that does not move is stuck:
not started (G=T=D=0), not transmitted (G>T), not delivered (T>D), GPU not ready
(G=T=D>0 with steps left). One stall makes the flows that depend on it stall too (a
ring forwards what it receives), so classify_flows also joins each flow with its
counterpart on the peer and with the flow feeding it on the same rank, marks the
victims, and names for the others the side and rank at fault.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mycroft import schema

from . import kernel_progress

SIDE_SEND = "send"
SIDE_RECV = "recv"
SUSPECT_NETWORK = "network"

_SEVERITY = {
    schema.FLOW_STATE_NOT_DELIVERED: 0,
    schema.FLOW_STATE_NOT_TRANSMITTED: 1,
    schema.FLOW_STATE_GPU_NOT_READY: 2,
    schema.FLOW_STATE_NOT_STARTED: 3,
    schema.FLOW_STATE_COMPLETE: 9,
}


@dataclass(slots=True)
class FlowFinding:
    """One in-flight flow, classified; `suspect_*` says where the fault most likely is."""

    rank: int  # the rank the flow belongs to
    peer: int
    comm: str  # NCCL commHash, hex
    seq: int
    channel: int
    side: str  # SIDE_SEND / SIDE_RECV: which end of the flow this rank is
    state: str  # schema.FLOW_STATE_*
    counters: dict[str, int] = field(default_factory=dict)  # posted, gpu_ready, transmitted, done, steps
    evidence: str = ""
    suspect_rank: int | None = None
    suspect_side: str = ""  # SIDE_SEND, SIDE_RECV or SUSPECT_NETWORK
    victim: bool = False  # stalled only because the flow feeding it is
    age_s: float = 0.0
    proxy_state: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "peer": self.peer, "comm": self.comm, "seq": self.seq, "channel": self.channel,
            "side": self.side, "state": self.state, "counters": dict(self.counters), "evidence": self.evidence,
            "suspect_rank": self.suspect_rank, "suspect_side": self.suspect_side, "victim": self.victim,
            "age_s": self.age_s, "proxy_state": self.proxy_state,
        }


@dataclass(slots=True)
class _Flow:
    rank: int
    comm: str
    seq: int
    channel: int
    peer: int
    send: bool
    steps: int
    posted: int
    g: int
    t: int
    d: int
    age: float
    proxy_state: str


def _column(attrs: Mapping[str, Any], key: str, n: int, default: Any) -> list[Any]:
    value = attrs.get(key)
    if isinstance(value, list | tuple) and len(value) == n:
        return list(value)
    return [default] * n


def parse_flows(rank: int, attrs: Mapping[str, Any]) -> list[_Flow]:
    """A heartbeat's flow arrays as flows (counters, peer, side, age, proxy state)."""
    comms = attrs.get(schema.ATTR_HB_FLOW_COMMS)
    if not isinstance(comms, list | tuple) or not comms:
        return []
    n = len(comms)
    seqs = _column(attrs, schema.ATTR_HB_FLOW_SEQS, n, -1)
    channels = _column(attrs, schema.ATTR_HB_FLOW_CHANNELS, n, -1)
    peers = _column(attrs, schema.ATTR_HB_FLOW_PEERS, n, -1)
    sends = _column(attrs, schema.ATTR_HB_FLOW_SENDS, n, False)
    steps = _column(attrs, schema.ATTR_HB_FLOW_STEPS, n, 0)
    g = _column(attrs, schema.ATTR_HB_FLOW_GPU_READY, n, 0)
    t = _column(attrs, schema.ATTR_HB_FLOW_TRANSMITTED, n, 0)
    d = _column(attrs, schema.ATTR_HB_FLOW_DONE, n, 0)
    ages = _column(attrs, schema.ATTR_HB_FLOW_AGES_S, n, 0.0)
    owners = _column(attrs, schema.ATTR_HB_FLOW_RANKS, n, rank)
    states = _column(attrs, schema.ATTR_HB_FLOW_PROXY_STATES, n, "")
    posted = attrs.get(schema.ATTR_HB_FLOW_POSTED)
    posted_col = list(posted) if isinstance(posted, list | tuple) and len(posted) == n else None
    flows = []
    for i in range(n):
        flows.append(_Flow(
            rank=int(owners[i]), comm=str(comms[i]), seq=int(seqs[i]), channel=int(channels[i]),
            peer=int(peers[i]), send=bool(sends[i]), steps=int(steps[i]),
            posted=int(posted_col[i]) if posted_col is not None else max(int(g[i]), int(d[i])),
            g=int(g[i]), t=int(t[i]), d=int(d[i]), age=float(ages[i]), proxy_state=str(states[i]),
        ))
    return flows


def _counters(f: _Flow) -> dict[str, int]:
    return {"posted": f.posted, "gpu_ready": f.g, "transmitted": f.t, "done": f.d, "steps": f.steps}


def _desc(f: _Flow) -> str:
    arrow = f"{f.rank}->{f.peer}" if f.send else f"{f.peer}->{f.rank}"
    return (f"{'send' if f.send else 'recv'} flow {arrow} comm {f.comm} seq {f.seq} channel {f.channel} "
            f"(posted {f.posted}, G {f.g}, T {f.t}, D {f.d} of {f.steps} steps"
            + (f", last state {f.proxy_state}" if f.proxy_state else "") + ")")


def _classify(f: _Flow, flows: dict[tuple[str, int, int, int, bool, int], _Flow],
              inputs: dict[tuple[str, int, int, int], _Flow]) -> FlowFinding:
    state = schema.flow_state(f.g, f.t, f.d, f.steps)
    finding = FlowFinding(rank=f.rank, peer=f.peer, comm=f.comm, seq=f.seq, channel=f.channel,
                          side=SIDE_SEND if f.send else SIDE_RECV, state=state, counters=_counters(f),
                          age_s=f.age, proxy_state=f.proxy_state)
    # the same transfer seen from the other end, and the flow feeding this one on this rank
    other = flows.get((f.comm, f.seq, f.channel, f.peer, not f.send, f.rank))
    feeder = inputs.get((f.comm, f.seq, f.channel, f.rank)) if f.send else None
    me = _desc(f)
    if f.send:
        if state in (schema.FLOW_STATE_GPU_NOT_READY, schema.FLOW_STATE_NOT_STARTED) and feeder is not None \
                and feeder.d <= f.d and feeder.d < feeder.steps:
            finding.victim = True
            finding.suspect_rank, finding.suspect_side = feeder.peer, SIDE_SEND
            finding.evidence = (f"{me}: waits for data it has to forward; its input flow from rank "
                                f"{feeder.peer} is itself stalled at {feeder.d} steps")
        elif state == schema.FLOW_STATE_GPU_NOT_READY and f.posted > f.d:
            finding.suspect_rank, finding.suspect_side = f.rank, SIDE_SEND
            finding.evidence = (f"{me}: step {f.d} is posted but the GPU of rank {f.rank} has not produced its "
                                f"data (stuck in SendGPUWait) although its input is there: GPU not ready")
        elif state in (schema.FLOW_STATE_GPU_NOT_READY, schema.FLOW_STATE_NOT_STARTED):
            finding.suspect_rank, finding.suspect_side = f.rank, SIDE_SEND
            ready = f" while receiver rank {f.peer} has posted {other.g} buffers" if other is not None else ""
            finding.evidence = (f"{me}: the proxy of rank {f.rank} has not posted step {f.d}{ready}: "
                                f"the send was never started (proxy / sender side)")
        elif state == schema.FLOW_STATE_NOT_TRANSMITTED:
            if other is not None and other.g <= f.t:
                finding.suspect_rank, finding.suspect_side = f.peer, SIDE_RECV
                finding.evidence = (f"{me}: data is ready but receiver rank {f.peer} has posted only {other.g} "
                                    f"buffers: receiver not ready")
            else:
                finding.suspect_rank, finding.suspect_side = f.rank, SIDE_SEND
                finding.evidence = f"{me}: data is ready but rank {f.rank} does not post it: sender NIC / RDMA"
        elif state == schema.FLOW_STATE_NOT_DELIVERED:
            finding.suspect_rank, finding.suspect_side = f.peer, SUSPECT_NETWORK
            got = f"; receiver rank {f.peer} got {other.t}" if other is not None else ""
            finding.evidence = (f"{me}: {f.t - f.d} step(s) posted to the network by rank {f.rank} never "
                                f"completed{got}: not delivered on link {f.rank}->{f.peer} (network or receiver)")
    else:
        if state == schema.FLOW_STATE_NOT_TRANSMITTED:
            finding.victim = True
            finding.suspect_rank, finding.suspect_side = f.peer, SIDE_SEND
            sender_state = schema.flow_state(other.g, other.t, other.d, other.steps) if other else ""
            sent = f"; the sender's flow is {sender_state}" if other else ""
            finding.evidence = f"{me}: receive posted, no data from rank {f.peer}{sent}"
        elif state == schema.FLOW_STATE_NOT_DELIVERED:
            finding.suspect_rank, finding.suspect_side = f.rank, SIDE_RECV
            finding.evidence = f"{me}: data arrived but rank {f.rank} does not consume it (flush / GPU)"
        elif state == schema.FLOW_STATE_GPU_NOT_READY:
            finding.suspect_rank, finding.suspect_side = f.rank, SIDE_RECV
            finding.evidence = f"{me}: rank {f.rank} does not post the next receive buffer: GPU not ready"
        elif state == schema.FLOW_STATE_NOT_STARTED:
            finding.suspect_rank, finding.suspect_side = f.rank, SIDE_RECV
            finding.evidence = f"{me}: the proxy of rank {f.rank} never posted a receive"
    return finding


def classify_flows(heartbeat_attrs_by_rank: Mapping[int, Mapping[str, Any]],
                   min_age_s: float = 0.0) -> list[FlowFinding]:
    """Every in-flight flow of the job, classified; culprits first, then victims, oldest first.

    heartbeat_attrs_by_rank: rank -> that rank's latest heartbeat attributes (the
    ATTR_HB_FLOW_* parallel arrays). Flows younger than min_age_s (seconds since their
    counters last moved) are left out: they may simply be running.
    """
    flows: dict[tuple[str, int, int, int, bool, int], _Flow] = {}
    for rank, attrs in heartbeat_attrs_by_rank.items():
        for f in parse_flows(int(rank), attrs):
            flows[(f.comm, f.seq, f.channel, f.rank, f.send, f.peer)] = f
    if not flows:  # one node without the network transport: no proxy events, kernel channels may tell
        return [_kernel_finding(k) for k in kernel_progress.classify_kernels(heartbeat_attrs_by_rank, min_age_s)]
    # each rank's receive flow per (comm, seq, channel): the input its send forwards (first one
    # seen, as before); an index, not a scan per send: a 2,048-rank DP ring has 8k flows
    inputs: dict[tuple[str, int, int, int], _Flow] = {}
    for key, x in flows.items():
        if not key[4]:
            inputs.setdefault(key[:4], x)
    findings = [_classify(f, flows, inputs) for f in flows.values() if f.age >= min_age_s]
    findings = [x for x in findings if x.state != schema.FLOW_STATE_COMPLETE]
    findings.sort(key=lambda x: (x.victim, _SEVERITY.get(x.state, 5), -x.age_s, x.rank, x.channel))
    return findings


def _kernel_finding(k: kernel_progress.KernelFinding) -> FlowFinding:
    """Kernel-channel evidence in the flow findings' shape (side "kernel", no peer, no counters)."""
    return FlowFinding(rank=k.rank, peer=-1, comm=k.comm, seq=k.seq, channel=k.channels[0] if k.channels else -1,
                       side=kernel_progress.SIDE_KERNEL, state=k.state, evidence=k.evidence,
                       suspect_rank=k.rank if k.culprit else None, suspect_side=k.suspect_side,
                       victim=not k.culprit, age_s=k.age_s)


def culprits(findings: Sequence[FlowFinding]) -> list[FlowFinding]:
    """The findings that are not explained by another stalled flow."""
    return [x for x in findings if not x.victim]


def shared_endpoint(findings: Sequence[FlowFinding]) -> int | None:
    """The one rank every undelivered link runs through, when there are two links or more.

    A not-delivered flow names its receiver ("network or receiver"); but when a rank's
    outgoing and incoming links both stop delivering (its NIC is down: f-1 -> f and
    f -> f+1 on a ring), the rank they share is the fault, not either neighbour.
    """
    links = {(x.rank, x.peer) for x in culprits(findings)
             if x.state == schema.FLOW_STATE_NOT_DELIVERED and x.side == SIDE_SEND}
    if len(links) < 2:
        return None
    common = set.intersection(*({a, b} for a, b in links))
    return common.pop() if len(common) == 1 else None


def summarize(findings: Sequence[FlowFinding]) -> dict[str, Any]:
    """A verdict-sized summary: the first culprit's suspect rank, side and evidence, plus all flows."""
    top = next(iter(culprits(findings)), None)
    if top is None:
        return {"flows": [x.as_dict() for x in findings[:32]]} if findings else {}
    shared = shared_endpoint(findings)
    if shared is not None:
        dead = [x for x in culprits(findings)
                if x.state == schema.FLOW_STATE_NOT_DELIVERED and shared in (x.rank, x.peer)]
        links = sorted({f"{x.rank}->{x.peer}" for x in dead})
        text = (f"{len(links)} links through rank {shared} ({', '.join(links[:8])}) do not deliver what was posted "
                f"to the network, in both directions: rank {shared}'s NIC / network port; first: {dead[0].evidence}")
        return {"rank": shared, "side": SUSPECT_NETWORK, "state": schema.FLOW_STATE_NOT_DELIVERED, "text": text,
                "flow": dead[0].as_dict(), "flows": [x.as_dict() for x in findings[:32]]}
    return {
        "rank": top.suspect_rank, "side": top.suspect_side, "state": top.state, "text": top.evidence,
        "flow": top.as_dict(), "flows": [x.as_dict() for x in findings[:32]],
    }
