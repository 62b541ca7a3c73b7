"""NCCL's ring progress, step by step, as NCCL's source drives it (no Mycroft rule is read here).

This is the second model of NCCL the RCA is checked on (issue 44). It was written from NCCL's
own source (NVIDIA/nccl master, 2026; facts only, no code carried over), not from Mycroft's
span contract, so that the rules cannot have been fitted to it. What it follows:

* ``src/include/device.h``: ``NCCL_STEPS`` = 8, the number of buffer slots of one connection
  (its FIFO): a sender may run at most 8 steps ahead of what the network completed.
* ``src/transport/net.cc`` ``sendProxyProgress``: per sub (one channel, one peer) the proxy keeps
  ``posted``, ``transmitted``, ``done``.  It *posts* step s (hands the buffer slot to the GPU:
  profiler state SendGPUWait) while ``posted < done + maxDepth`` (maxDepth = NCCL_STEPS for a
  ring's single sub); it *transmits* step s when the GPU wrote the slot (``connFifo[slot].size
  != -1`` and ``recvTail > base + transmitted``: state SendPeerWait) and ``ncclNet->isend``
  returns a request (state SendWait with transSize); it marks step s *done* when
  ``ncclNet->test`` says the send completed, and only then writes ``sendHead`` so the GPU may
  reuse the slot (step stop).
* ``src/transport/net_ib.cc`` ``ncclIbIsend``: the send request is NULL (nothing posted, the
  proxy retries next round) until the receiver's clear-to-send for that slot -- the FIFO
  entry its ``irecv`` RDMA-writes into the sender -- has arrived: no CTS, no transmit.
* ``src/transport/net.cc`` ``recvProxyProgress``: the receiver *posts* ``irecv`` for step s while
  ``posted < done + maxDepth`` (state RecvWait: this is the CTS the sender waits for); when
  ``test`` completes the data has *received* (state RecvFlushWait, transSize); after the
  flush (GDR: a PCIe read or ``iflush``) it *transmits* to the GPU by writing ``recvTail``
  (state RecvGPUWait); it marks the step *done* once the GPU advanced ``sendMem->head`` past
  it -- the kernel consumed the data (step stop).
* ``src/transport/p2p.cc``: intra-node hops (NVLink / PCIe P2P) move data GPU to GPU through
  the same head / tail step window with no proxy progress function for the common path, so
  they emit no ProxyOp / ProxyStep events and no flows (``docs/native.md``: ProxyOp and
  ProxyStep come only from the NET transport).
* ``src/device/all_reduce.h`` ``runRing``: a ring all-reduce of n ranks runs, per channel and
  per loop, 2(n-1) send steps and 2(n-1) receive steps: step 0 sends the rank's own chunk,
  each later step is ``recvReduceSend`` / ``recvReduceCopySend`` / ``recvCopySend`` (the GPU
  consumes receive step s-1 and produces send step s in one go), and the last receive is
  ``directRecv`` (consumed, nothing sent).  The kernel needs a free slot in its send FIFO
  (``sendHead``) before it writes a step.
* ``src/proxy.cc`` / ``src/enqueue.cc``: proxy ops are handed to the proxy thread when the
  host launches the collective (``ncclProxyStart`` at launch), so a receiver's buffers are
  posted (CTS sent) from the host launch on, even while its kernel waits behind other work
  on the stream (a late kernel).

The profiler plugin's counters (docs/native.md) are read off these times: send flow posted =
steps started (SendGPUWait), G = SendPeerWait reached, T = SendWait (isend accepted), D = step
stopped; receive flow posted = G = RecvWait (irecv posted: CTS), T = RecvFlushWait (arrived),
D = step stopped (consumed by the GPU).

Times are seconds on one clock; ``INF`` is "never" (a dead NIC).  Everything is a recurrence
over steps in increasing order, so a collective of n ranks x C channels x S steps costs
O(n C S) and needs no event queue.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

NCCL_STEPS = 8  # src/include/device.h
INF = math.inf

SEND_GPU_WAIT, SEND_PEER_WAIT, SEND_WAIT = "SendGPUWait", "SendPeerWait", "SendWait"
RECV_WAIT, RECV_FLUSH_WAIT, RECV_GPU_WAIT = "RecvWait", "RecvFlushWait", "RecvGPUWait"


@dataclass(slots=True)
class Hop:
    """What the fabric does to one step moving src -> dst on one channel (set by the cluster)."""

    net: bool  # NET transport (inter-node: proxy steps, flows); False: P2P (NVLink), no proxy
    wire_s: Callable[[float], float]  # seconds on the wire for one step starting at t (INF: link down)
    latency_s: float  # one-way latency (data, CTS and completion each pay it)


@dataclass(slots=True)
class RankSide:
    """One rank's part in one collective on one channel."""

    launch: float  # host launched the collective: proxy ops appended (receives posted from here)
    kernel: float  # the kernel started on the GPU (compute before it done, late kernel included)
    gpu_step_s: float  # GPU time to reduce / copy one step
    proxy_lag_s: float  # proxy thread's delay per action (a slow proxy thread)
    flush_s: float  # receive flush (GDR PCIe read) of one step; PCIe down-trained makes it long
    nic_up: Callable[[float], float] = field(default=lambda t: t)  # earliest time >= t the NIC passes traffic


@dataclass(slots=True)
class FlowTimes:
    """Per-step times of one NET flow (one direction, one peer, one channel) on its owning rank."""

    rank: int
    peer: int
    channel: int
    send: bool
    steps: int
    posted: list[float]
    gpu_ready: list[float]
    transmitted: list[float]
    flushed: list[float]  # receive flows: RecvGPUWait reached (recvTail written); send flows: unused
    done: list[float]
    start: float  # the ProxyOp started (the flow exists in heartbeats from here)

    def counters(self, t: float) -> tuple[int, int, int, int]:
        """(posted, G, T, D) at time t, as the plugin's cumulative counters read them."""
        return (bisect.bisect_right(self.posted, t), bisect.bisect_right(self.gpu_ready, t),
                bisect.bisect_right(self.transmitted, t), bisect.bisect_right(self.done, t))

    def finished(self) -> float:
        return self.done[-1] if self.done else self.start

    def last_move(self, t: float) -> float:
        """When a counter last moved at or before t (the flow's start when none has)."""
        last = self.start
        for times in (self.posted, self.gpu_ready, self.transmitted, self.done):
            i = bisect.bisect_right(times, t)
            if i:
                last = max(last, times[i - 1])
        return last

    def proxy_state(self, t: float) -> str:
        p, g, tr, d = self.counters(t)
        if self.send:
            return SEND_WAIT if tr > d else SEND_PEER_WAIT if g > tr else SEND_GPU_WAIT if p > g else ""
        if tr > d:
            return RECV_GPU_WAIT if bisect.bisect_right(self.flushed, t) > d else RECV_FLUSH_WAIT
        return RECV_WAIT if g > tr else ""


@dataclass(slots=True)
class ChannelRun:
    """One channel of one ring all-reduce: its flows and each rank's end."""

    flows: list[FlowTimes]
    end: dict[int, float]  # rank -> when its kernel finished this channel


def ring_allreduce_channel(order: Sequence[int], channel: int, loops: int, sides: dict[int, RankSide],
                           hop: Callable[[int, int], Hop]) -> ChannelRun:
    """Run one channel of a ring all-reduce over ranks `order` (order[i] sends to order[i+1]).

    Follows runRing (all_reduce.h) for the GPU and send/recvProxyProgress (net.cc) for NET hops:
    steps in increasing order; each quantity depends only on earlier steps or on the window
    (s - NCCL_STEPS), so one pass computes every time."""
    n = len(order)
    per_loop = 2 * (n - 1)
    steps = loops * per_loop
    hops = [hop(order[i], order[(i + 1) % n]) for i in range(n)]
    W = NCCL_STEPS
    # per position i: sender side (hop i: order[i] -> order[i+1]) and receiver side (hop i-1 into order[i])
    ready = [[0.0] * steps for _ in range(n)]  # GPU wrote send step s into its FIFO slot
    s_posted = [[0.0] * steps for _ in range(n)]
    s_gready = [[0.0] * steps for _ in range(n)]
    s_trans = [[0.0] * steps for _ in range(n)]
    s_done = [[0.0] * steps for _ in range(n)]
    r_posted = [[0.0] * steps for _ in range(n)]  # receiver irecv posted = CTS sent
    r_recv = [[0.0] * steps for _ in range(n)]  # data arrived at the receiver
    r_flush = [[0.0] * steps for _ in range(n)]  # flushed: recvTail written, the GPU may read it
    r_done = [[0.0] * steps for _ in range(n)]  # consumed by the GPU (step stop)
    wire_free = [0.0] * n  # per hop: the wire is busy until
    flush_free = [0.0] * n  # per receiver: its PCIe flush engine is busy until
    side = [sides[r] for r in order]

    for s in range(steps):
        first_of_loop = s % per_loop == 0
        for i in range(n):
            me, h = side[i], hops[i]
            prev = ready[i][s - 1] if s else me.kernel
            inp = me.kernel if first_of_loop else r_flush[i][s - 1]  # recv step s-1 (from i-1) reached the GPU
            if h.net:
                slot = s_done[i][s - W] if s >= W else me.kernel  # sendHead: the slot completed on the network
            else:
                j = (i + 1) % n
                slot = r_done[j][s - W] if s >= W else me.kernel  # P2P: the peer consumed that slot
            ready[i][s] = max(me.kernel, prev, inp, slot) + me.gpu_step_s
            if not first_of_loop:
                r_done[i][s - 1] = ready[i][s]  # recvReduceSend: consuming s-1 produced s
        for i in range(n):
            me, h = side[i], hops[i]
            j = (i + 1) % n
            peer = side[j]
            # the receiver j posts irecv for step s (CTS) once its window has room (recvProxyProgress)
            r_room = r_done[j][s - W] if s >= W else peer.launch
            r_posted[j][s] = max(peer.launch, r_room, r_posted[j][s - 1] if s else 0.0) + peer.proxy_lag_s
            if h.net:
                s_room = s_done[i][s - W] if s >= W else me.launch
                s_posted[i][s] = max(me.launch, s_room, s_posted[i][s - 1] if s else 0.0) + me.proxy_lag_s
                s_gready[i][s] = max(s_posted[i][s], ready[i][s]) + me.proxy_lag_s
                # ncclIbIsend: no CTS, no request; the CTS crosses the wire from j's NIC to i's
                cts_at = me.nic_up(peer.nic_up(r_posted[j][s]) + h.latency_s)
                s_trans[i][s] = max(s_gready[i][s], cts_at, s_trans[i][s - 1] if s else 0.0) + me.proxy_lag_s
                start = max(me.nic_up(s_trans[i][s]), wire_free[i])
                wire = h.wire_s(start)
                finish = start + wire
                wire_free[i] = finish
                arrive = peer.nic_up(finish + h.latency_s)
                r_recv[j][s] = max(arrive, r_posted[j][s])
                s_done[i][s] = me.nic_up(peer.nic_up(r_recv[j][s]) + h.latency_s)  # completion seen
                fl = max(r_recv[j][s] + peer.proxy_lag_s, flush_free[j]) + peer.flush_s
                flush_free[j] = fl
                r_flush[j][s] = fl
            else:
                arrive = ready[i][s] + h.wire_s(ready[i][s]) + h.latency_s
                r_recv[j][s] = arrive
                r_flush[j][s] = arrive
                s_posted[i][s] = s_gready[i][s] = s_trans[i][s] = s_done[i][s] = arrive
        if (s + 1) % per_loop == 0:  # the loop's last receive: directRecv, consumed without a send
            for i in range(n):
                r_done[i][s] = max(r_flush[i][s], ready[i][s]) + side[i].gpu_step_s
    flows: list[FlowTimes] = []
    end: dict[int, float] = {}
    for i in range(n):
        j = (i + 1) % n
        if hops[i].net:
            flows.append(FlowTimes(order[i], order[j], channel, True, steps, s_posted[i], s_gready[i], s_trans[i],
                                   [], s_done[i], side[i].launch))
            flows.append(FlowTimes(order[j], order[i], channel, False, steps, r_posted[j], r_posted[j], r_recv[j],
                                   r_flush[j], r_done[j], side[j].launch))
    for i in range(n):
        end[order[i]] = max(r_done[i][-1], s_done[i][-1])
    return ChannelRun(flows, end)
