"""The simulator's fault catalogue: what each fault does to the ranks' heartbeats (pure).

`mycroft simulate` (bigjob.py) runs N simulated ranks; this module says, per fault kind,
which role every rank plays after the onset, how the job's pace and each rank's compute
share change, and -- for the paper's seven NCCL faults -- what the native flow counters of
the in-flight inter-node all-reduce look like (posted / GPU-ready / transmitted / done per
flow, per channel, per peer, with the proxy's last step state), as the profiler plugin
puts them in heartbeats (`instrumentation/native_reader.py`).

Layout (bigjob.Layout): TP groups are intra-node (NVLink: NCCL's P2P transport has no
proxy steps, so TP ops carry no flows); DP groups cross nodes (NET transport: proxy steps,
flows). The network and GPU faults strike rank f's NIC / GPU, so they show in f's DP ring.

Process faults: block, crash, freeze, straggler, mismatch, deadlock, chain.
NCCL faults: nic_down, nic_bw_limit, pcie_downgrade, gpu_power_limit, bg_gpu_compute,
bg_net_traffic, proxy_delay. How each shows and what the RCA can name is in docs/faults.md.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from mycroft import schema

PROCESS_FAULTS = ("block", "crash", "freeze", "straggler", "mismatch", "deadlock", "chain")
NCCL_FAULTS = ("nic_down", "nic_bw_limit", "pcie_downgrade", "gpu_power_limit", "bg_gpu_compute",
               "bg_net_traffic", "proxy_delay")
FAULTS = PROCESS_FAULTS + NCCL_FAULTS
#: faults after which the job stops (the frontier freezes); the others only slow it down
HANGS = frozenset({"block", "crash", "freeze", "mismatch", "deadlock", "chain", "nic_down"})
#: the rank's GPU is slower: its own compute grows (it arrives last), its NCCL kernels lag
GPU_SLOW = frozenset({"straggler", "gpu_power_limit", "bg_gpu_compute"})
#: the DP ring through rank f is slower: every rank waits more, nobody computes more
NET_SLOW = frozenset({"nic_bw_limit", "pcie_downgrade", "bg_net_traffic", "proxy_delay"})

# roles (a heartbeat "situation": every rank of one role sends the same heartbeat body)
HEALTHY = "healthy"
HOLDER = "holder"  # alive, outside communication: has not entered its TP collective
TP_WAITER = "tp_waiter"  # in its TP collective, waiting for a TP peer
DP_WAITER = "dp_waiter"  # in its DP all-reduce, waiting for a member that has not issued it
WORLD_WAITER = "world_waiter"  # in the next world all-reduce
SILENT = "silent"  # sends nothing (crashed / frozen)
MISMATCHED = "mismatched"  # in its TP collective with another dtype / size than its peers
DP_MISMATCHED = "dp_mismatched"  # the same in its DP all-reduce (no TP group: --tp 1)
CROSSED = "crossed"  # deadlock: went to the world all-reduce before its TP (--tp 1: DP) collective
RING_STUCK = "ring_stuck"  # in a DP all-reduce whose data does not move (nic_down)
RING = "ring"  # in a DP all-reduce that moves slowly (network faults); flows in flight
SLOW = "slow"  # the rank whose GPU is slower (its compute grows)
SLOW_RING = "slow_ring"  # the same, seen in its DP all-reduce (NCCL GPU faults: flows in flight)

#: role -> index of the group its in-flight op is in (0 TP, 1 DP, 2 world; None: nothing in flight)
INFLIGHT_GROUP: dict[str, int | None] = {
    HEALTHY: 0, HOLDER: None, TP_WAITER: 0, DP_WAITER: 1, WORLD_WAITER: 2, SILENT: None, MISMATCHED: 0,
    CROSSED: 2, RING_STUCK: 1, RING: 1, SLOW: 0, SLOW_RING: 1, DP_MISMATCHED: 1,
}
#: roles whose heartbeats carry the native flows of their in-flight DP all-reduce
FLOW_ROLES = frozenset({RING_STUCK, RING, SLOW_RING})
#: roles whose op is stalled since the onset (its age grows with the hang)
STALLED = frozenset({TP_WAITER, DP_WAITER, WORLD_WAITER, MISMATCHED, DP_MISMATCHED, CROSSED, RING_STUCK})

# healthy step: 60% compute, 40% communication (25% TP, 15% the DP all-reduce), in intervals
COMPUTE = 0.6
DP_COMM = 0.15

# what the RCA should say: fault -> (incident kinds, root-cause kinds naming the faulty rank)
EXPECTED: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "block": (frozenset({"hang"}), frozenset({"not_entered"})),
    "chain": (frozenset({"hang"}), frozenset({"not_entered"})),
    "crash": (frozenset({"hang", "crash"}), frozenset({"process_lost"})),
    "freeze": (frozenset({"hang", "crash"}), frozenset({"process_lost"})),
    "straggler": (frozenset({"slowdown"}), frozenset({"straggler"})),
    "mismatch": (frozenset({"mismatch"}), frozenset({"mismatch"})),
    "deadlock": (frozenset({"deadlock"}), frozenset({"deadlock"})),
    "nic_down": (frozenset({"hang"}), frozenset({"link"})),
    "gpu_power_limit": (frozenset({"slowdown"}), frozenset({"straggler"})),
    "bg_gpu_compute": (frozenset({"slowdown"}), frozenset({"straggler"})),
    # a slower link: the verdict should name the rank whose NIC / PCIe / proxy it is
    "nic_bw_limit": (frozenset({"slowdown"}), frozenset({"link", "communication"})),
    "pcie_downgrade": (frozenset({"slowdown"}), frozenset({"link", "communication"})),
    "bg_net_traffic": (frozenset({"slowdown"}), frozenset({"link", "communication"})),
    "proxy_delay": (frozenset({"slowdown"}), frozenset({"link", "communication"})),
}


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """One run's fault: kind, the faulty rank, its partner (deadlock), magnitude, seed."""

    kind: str
    rank: int
    partner: int = -1  # deadlock: the rank that took the crossed order
    factor: float = 1.0  # GPU faults: compute x factor; network faults: DP all-reduce x factor
    variation: float = 0.0  # bursty faults (background traffic / compute): +- this share per interval
    step: int = 1  # nic_down: the flow step at which the NIC died
    mismatch_field: str = "dtype"  # mismatch: dtype or bytes
    seed: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "rank": self.rank, "partner": self.partner, "factor": round(self.factor, 3),
                "variation": self.variation, "step": self.step, "mismatch_field": self.mismatch_field,
                "seed": self.seed}


def plan(kind: str, world: int, tp: int, seed: int, rank: int = -1, pp: int = 1) -> FaultPlan:
    """A fault of `kind` with its rank and magnitude drawn from `seed` (rank given: kept).

    The deadlock's partner is f's TP neighbour; with no TP group (tp 1) its DP neighbour."""
    if kind not in FAULTS and kind != "none":
        raise ValueError(f"unknown fault {kind!r}; known: {', '.join(FAULTS)}")
    rng = random.Random(seed)
    f = rank if rank >= 0 else rng.randrange(world)
    stride = tp * pp
    partner = f - f % tp + (f % tp + 1) % tp if tp >= 2 else (f + stride) % world if world > stride else -1
    factor, variation = 1.0, 0.0
    if kind == "straggler":
        factor = rng.uniform(2.0, 3.0)  # +60..120% of a step's compute
    elif kind == "gpu_power_limit":
        factor = rng.uniform(1.6, 2.2)  # clocks capped: kernels 1.6-2.2x longer
    elif kind == "bg_gpu_compute":
        factor, variation = rng.uniform(1.8, 2.4), 0.2  # a co-located job's kernels share the SMs
    elif kind in ("nic_bw_limit", "pcie_downgrade"):
        factor = rng.uniform(3.0, 5.0)  # the ring runs at its slowest link: 1/3..1/5 of the bandwidth
    elif kind == "bg_net_traffic":
        factor, variation = rng.uniform(3.0, 4.5), 0.25
    elif kind == "proxy_delay":
        factor = rng.uniform(3.0, 5.0)  # the proxy thread posts each step late
    return FaultPlan(kind, f, partner, factor, variation, step=rng.randrange(1, 6),
                     mismatch_field=rng.choice(("dtype", "bytes")), seed=seed)


def step_time(p: FaultPlan, tick: int) -> tuple[float, float]:
    """(job step time, the faulty rank's compute per step), in heartbeat intervals, at one tick."""
    wobble = 1.0 + p.variation * (random.Random(p.seed * 1_000_003 + tick).random() * 2 - 1)
    if p.kind in GPU_SLOW:
        own = COMPUTE * (1 + (p.factor - 1) * wobble)
        return own + (1 - COMPUTE), own
    if p.kind in NET_SLOW:
        return 1.0 + DP_COMM * (p.factor - 1) * wobble, COMPUTE
    return 1.0, COMPUTE


def score(fault: str, rank: int, partner: int, kind: str | None, causes: list[tuple[str, int | None]]) -> bool:
    """Is the verdict (incident kind, root causes in order) the one the fault implies?"""
    if fault == "none":
        return kind is None
    if kind is None or not causes:
        return False
    kinds, rc_kinds = EXPECTED[fault]
    if kind not in kinds:
        return False
    if fault == "deadlock":  # a cycle, led by the rank that took the crossed order (rank only picks its group)
        return causes[0] == ("deadlock", partner) and all(k in rc_kinds for k, _ in causes)
    first_kind, first_rank = causes[0]
    return first_kind in rc_kinds and first_rank == rank


# ---------------------------------------------------------------------------- native flows
@dataclass(frozen=True, slots=True)
class Flow:
    """One flow of a rank's in-flight DP all-reduce, as the plugin's ring record has it."""

    channel: int
    peer: int
    send: bool
    steps: int
    posted: int
    gpu_ready: int
    transmitted: int
    done: int
    age_s: float
    proxy_state: str


CHANNELS = 2
SEND_GPU_WAIT, SEND_WAIT, RECV_WAIT, RECV_FLUSH_WAIT, RECV_GPU_WAIT = (
    "SendGPUWait", "SendWait", "RecvWait", "RecvFlushWait", "RecvGPUWait")


def ring_steps(n: int) -> int:
    """Steps of one ring all-reduce loop per flow: reduce-scatter then all-gather."""
    return max(2, 2 * (n - 1))


def ring_flows(p: FaultPlan, members: tuple[int, ...], rank: int, stalled_s: float, tick: int) -> list[Flow]:
    """The flows of `rank`'s in-flight all-reduce on the ring `members` under fault `p`.

    Stalled ring (nic_down at f, both directions dead): f's send and f-1's send to f stop
    where the ring stood (step k) with what was posted to the network never completing
    (G = T = D + 2: not delivered); every other flow stops where the stall reaches it (the
    ring forwards what it receives: rank f+j can send j steps more than f did), its receive
    buffers posted ahead (G > T), the fixpoint of native/emulate.py's stop_points with the
    link into f cut too. Moving ring (the slow faults): a snapshot
    of flows that advance; the fault's own flows show where the time goes.
    """
    n = len(members)
    i = members.index(rank)
    nxt, prv = members[(i + 1) % n], members[(i - 1) % n]
    steps = ring_steps(n)
    f = members.index(p.rank) if p.rank in members else -1
    out: list[Flow] = []
    if p.kind == "nic_down" and f >= 0:
        j = (i - f) % n  # distance downstream of f
        k = min(p.step, steps - 2)  # where the ring stood when the NIC died (a small ring's loop is short)
        # the two links through f's NIC stop there; downstream ranks forward what they got
        send_d = k if j in (0, n - 1) else min(steps, k + j)
        recv_d = k if j == 0 else min(steps, k + j - 1)
        age = round(stalled_s, 3)
        for ch in range(CHANNELS):
            if j == 0 or j == n - 1:  # a link through f's dead NIC: what was posted never completes
                top = min(steps, send_d + 2)  # the proxy posts what is ready (up to the receiver's credit)
                out.append(Flow(ch, nxt, True, steps, top, top, top, send_d, age, SEND_WAIT))
            else:
                out.append(Flow(ch, nxt, True, steps, send_d, send_d, send_d, send_d, age, SEND_GPU_WAIT))
            out.append(Flow(ch, prv, False, steps, min(steps, recv_d + 2), min(steps, recv_d + 2), recv_d, recv_d,
                            age, RECV_WAIT))
        return out
    # a moving ring: about half way through the loop, counters advancing (ages: since the last step)
    base = (steps // 2 + tick * 7 + i) % max(1, steps - 4) + 1
    for ch in range(CHANNELS):
        s, r = base, max(0, base - 1)
        send = Flow(ch, nxt, True, steps, s + 1, s + 1, s, s, 0.002, SEND_WAIT)
        recv = Flow(ch, prv, False, steps, r + 2, r + 2, r, r, 0.002, RECV_WAIT)
        if i == f:
            if p.kind in ("nic_bw_limit", "bg_net_traffic"):  # the NIC drains slowly: steps queue behind it
                send = Flow(ch, nxt, True, steps, s + 4, s + 4, s + 4, s, 0.03, SEND_WAIT)
            elif p.kind == "pcie_downgrade":  # GPU<->NIC DMA slow both ways: sends and receive flushes lag
                send = Flow(ch, nxt, True, steps, s + 3, s + 3, s + 3, s, 0.03, SEND_WAIT)
                recv = Flow(ch, prv, False, steps, r + 4, r + 4, r + 3, r, 0.03, RECV_FLUSH_WAIT)
            elif p.kind == "proxy_delay":  # the proxy posts late: data and buffers ready, steps not posted
                send = Flow(ch, nxt, True, steps, s, s, s, s, 0.05, SEND_GPU_WAIT)
                recv = Flow(ch, prv, False, steps, r, r, r, r, 0.05, RECV_GPU_WAIT)
            elif p.kind in GPU_SLOW:  # the GPU produces and consumes late
                send = Flow(ch, nxt, True, steps, s + 2, s, s, s, 0.02, SEND_GPU_WAIT)
                recv = Flow(ch, prv, False, steps, r + 2, r + 2, r + 2, r, 0.02, RECV_GPU_WAIT)
        out.extend((send, recv))
    return out


def flow_attributes(flows: list[Flow], comm: str, seq: int, rank: int) -> dict[str, list[object]]:
    """ATTR_HB_FLOW_* parallel arrays, typed as NativeReader.heartbeat_attributes emits them."""
    return {
        schema.ATTR_HB_FLOW_COMMS: [comm] * len(flows),
        schema.ATTR_HB_FLOW_SEQS: [seq] * len(flows),
        schema.ATTR_HB_FLOW_CHANNELS: [f.channel for f in flows],
        schema.ATTR_HB_FLOW_PEERS: [f.peer for f in flows],
        schema.ATTR_HB_FLOW_SENDS: [f.send for f in flows],
        schema.ATTR_HB_FLOW_STEPS: [f.steps for f in flows],
        schema.ATTR_HB_FLOW_POSTED: [f.posted for f in flows],
        schema.ATTR_HB_FLOW_GPU_READY: [f.gpu_ready for f in flows],
        schema.ATTR_HB_FLOW_TRANSMITTED: [f.transmitted for f in flows],
        schema.ATTR_HB_FLOW_DONE: [f.done for f in flows],
        schema.ATTR_HB_FLOW_AGES_S: [f.age_s for f in flows],
        schema.ATTR_HB_FLOW_RANKS: [rank] * len(flows),
        schema.ATTR_HB_FLOW_PROXY_STATES: [f.proxy_state for f in flows],
    }
