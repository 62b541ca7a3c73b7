"""A training job on 8 hosts x 4 GPUs whose NCCL all-reduces run through progress.py, and its telemetry.

Topology (what NCCL's ring search builds on rail-optimised hosts, src/graph/rings.cc /
search.cc): each GPU has its own NIC; a channel's ring enters a host at one GPU, crosses the
host over NVLink (P2P transport: no flows) and leaves it from another GPU's NIC (NET
transport: proxy steps, flows).  Channel c enters host h at local GPU c % 4 and leaves from
(c + 3) % 4, so with 8 channels every NIC sends on two channels and receives on two.

Layouts: ``dp`` -- one data-parallel ring of all 32 ranks (the default group); ``tp4dp8`` --
tensor parallel inside a host (NVLink only) and 4 data-parallel rings of 8 ranks, one per
local GPU index, each hop inter-node through that GPU's NIC.

Each iteration: forward/backward on the GPU (``compute_s``, jittered), [TP all-reduce], then
the gradient all-reduce, which the host launches ``lead`` seconds before the GPU reaches it
(NCCL is asynchronous to the host: torch 2.13 ProcessGroupNCCL returns at enqueue).  The op
is in flight for the instrumentation from the launch to the device's completion.

Faults (at a random onset, rank and magnitude: ``plan``): the paper's seven NCCL faults as
real clusters see them -- a dead NIC, a flapping NIC, a link slow one way, PCIe down-trained,
a power-capped (throttled) GPU, a noisy neighbour on the NIC, a slow proxy thread -- and a late
kernel.  Telemetry is built by the instrumentation's own encoders (``heartbeat_attributes``,
``heartbeat_span``, ``op_span`` from GroupInfo / OpRecord objects, the flow arrays in the
order and types of ``NativeReader.heartbeat_attributes``), so the RCA reads what a rank sends.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from mycroft import schema
from mycroft.instrumentation.groups import GroupInfo
from mycroft.instrumentation.op_record import OpRecord
from mycroft.instrumentation.spans import heartbeat_attributes, heartbeat_span, op_span
from mycroft.otlp import AttrValue, SpanRecord

from .progress import INF, NCCL_STEPS, FlowTimes, Hop, RankSide, ring_allreduce_channel

HOSTS, GPUS = 8, 4
CHANNELS = 8

FAULTS = ("nic_down", "nic_flap", "slow_link_one_way", "pcie_downgrade", "gpu_power_cap", "noisy_neighbour",
          "slow_proxy", "late_kernel")
#: fault -> (incident kinds, root-cause kinds) a right verdict has; the first root cause must name the rank
EXPECTED: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "nic_down": (frozenset({"hang"}), frozenset({"link"})),
    "nic_flap": (frozenset({"slowdown", "hang"}), frozenset({"link"})),
    "slow_link_one_way": (frozenset({"slowdown"}), frozenset({"link"})),
    "pcie_downgrade": (frozenset({"slowdown"}), frozenset({"link"})),
    "gpu_power_cap": (frozenset({"slowdown"}), frozenset({"straggler", "link"})),
    "noisy_neighbour": (frozenset({"slowdown"}), frozenset({"link"})),
    "slow_proxy": (frozenset({"slowdown"}), frozenset({"link"})),
    "late_kernel": (frozenset({"slowdown"}), frozenset({"straggler", "link"})),
}


@dataclass(frozen=True, slots=True)
class Plan:
    kind: str  # a FAULTS entry or "none"
    rank: int
    onset: float  # seconds from the job's start
    factor: float = 1.0
    seed: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "rank": self.rank, "onset": round(self.onset, 3), "factor": round(self.factor, 3),
                "seed": self.seed}


def plan(kind: str, seed: int, warmup_s: float = 8.0) -> Plan:
    """A fault's rank, onset (warm-up plus up to one iteration) and magnitude, drawn from the seed."""
    rng = random.Random(seed)
    rank = rng.randrange(HOSTS * GPUS)
    onset = warmup_s + rng.uniform(0.0, 1.0)
    factor = {
        "nic_down": 1.0,
        "nic_flap": rng.uniform(0.4, 0.9),  # seconds down per flap (link retrains, IB retry timeouts)
        "slow_link_one_way": rng.uniform(3.0, 5.0),
        "pcie_downgrade": rng.uniform(3.0, 4.5),  # x16 -> x4: the GPU<->NIC DMA at 1/3..1/4.5
        "gpu_power_cap": rng.uniform(1.5, 2.2),
        "noisy_neighbour": rng.uniform(0.2, 0.4),  # the share of the NIC left in a burst
        # seconds the proxy thread is late per action on one channel: one thread serves every channel and
        # peer of the GPU in turn (src/proxy.cc progress loop), so 0.5-1 ms per op visit is 4-8 ms a channel
        "slow_proxy": rng.uniform(0.004, 0.008),
        "late_kernel": rng.uniform(0.15, 0.4),  # seconds the kernel starts late each collective
    }.get(kind, 1.0)
    return Plan(kind, rank, onset, factor, seed)


def host_of(rank: int) -> int:
    return rank // GPUS


@dataclass(slots=True)
class Op:
    """One collective as one rank ran it."""

    group: int  # index into Cluster.groups
    seq: int
    launch: float  # host launched it (in flight from here)
    end: float  # device finished it (INF: never)


@dataclass(slots=True)
class Cluster:
    """The job, run ahead of time: every rank's ops and every NET flow's step times."""

    layout: str = "dp"
    fault: Plan = field(default_factory=lambda: Plan("none", 0, INF))
    seconds: float = 30.0
    compute_s: float = 0.6
    bytes_per_allreduce: int = 1 << 30
    chunk_bytes: int = 4 << 20
    channel_gbps: float = 1.6  # GB/s one channel gets of its NIC
    latency_s: float = 8e-6
    gpu_step_s: float = 2e-4
    flush_s: float = 1e-4
    nvlink_gbps: float = 40.0
    seed: int = 0
    op_spans_sent: bool = True  # False: heartbeat-only (op spans sampled away by the trace budget)
    epoch: float = 1.8e9  # unix time of the model's second 0 (span times are unix ns)
    world: int = HOSTS * GPUS
    ops: dict[int, list[Op]] = field(default_factory=dict)
    flows: list[tuple[int, int, FlowTimes]] = field(default_factory=list)  # (group, seq, flow)
    groups: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    infos: dict[int, list[GroupInfo]] = field(default_factory=dict)
    comm_hex: dict[int, str] = field(default_factory=dict)
    flow_index: dict[tuple[int, int, int], list[FlowTimes]] = field(default_factory=dict)  # (rank, group, seq)
    rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed * 7919 + 17)
        self.ops = {r: [] for r in range(self.world)}
        if self.layout == "dp":
            self.groups = [("0", tuple(range(self.world)))]
        elif self.layout == "tp4dp8":
            self.groups = [(f"tp{h}", tuple(range(h * GPUS, (h + 1) * GPUS))) for h in range(HOSTS)]
            self.groups += [(f"dp{g}", tuple(range(g, self.world, GPUS))) for g in range(GPUS)]
        else:
            raise ValueError(f"unknown layout {self.layout!r}: dp | tp4dp8")
        for gi, (name, ranks) in enumerate(self.groups):
            digest = hashlib.blake2b(f"{name}:{list(ranks)}".encode(), digest_size=8).hexdigest()
            self.comm_hex[gi] = digest  # the NCCL commHash of the communicator torch made for the group
        gid = {gi: schema.group_id(name, ranks) for gi, (name, ranks) in enumerate(self.groups)}
        for r in range(self.world):
            self.infos[r] = [GroupInfo(gid=gid[gi], name=name, desc=name, ranks=ranks,
                                       ranks_text=schema.encode_ranks(ranks), group_rank=ranks.index(r),
                                       backend="nccl", pg=None, has_counter=False, device_async=True)
                             for gi, (name, ranks) in enumerate(self.groups) if r in ranks]
        self._run()

    # ------------------------------------------------------------------ the fault, as the fabric sees it
    def _active(self, t: float) -> bool:
        return self.fault.kind != "none" and t >= self.fault.onset

    def _nic_up(self, rank: int) -> Callable[[float], float]:
        f = self.fault
        if f.kind == "nic_down" and rank == f.rank:
            return lambda t: t if t < f.onset else INF
        if f.kind == "nic_flap" and rank == f.rank:
            down, period = f.factor, 2.0  # down `down` s at the start of every 2 s after the onset

            def up(t: float) -> float:
                if t < f.onset:
                    return t
                phase = (t - f.onset) % period
                return t if phase >= down else t + (down - phase)
            return up
        return _identity

    def _hop(self, src: int, dst: int, gi: int, seq: int, channel: int) -> Hop:
        if host_of(src) == host_of(dst):
            nvlink = self.chunk_bytes / (self.nvlink_gbps * 1e9)
            return Hop(False, lambda t: nvlink, 2e-6)
        base = self.chunk_bytes / (self.channel_gbps * 1e9)
        rng = random.Random(hash((self.seed, gi, seq, channel, src)) & 0xFFFFFFFF)
        jitter = rng.uniform(0.9, 1.15)  # per collective and hop: fabric load, adaptive routing
        f = self.fault
        nominal = base * jitter

        def wire(t: float) -> float:
            if not self._active(t):
                return nominal
            if f.kind == "slow_link_one_way" and src == f.rank:
                return nominal * f.factor
            if f.kind == "pcie_downgrade" and f.rank in (src, dst):  # GDR: the NIC DMAs over the slow link
                return nominal * f.factor
            if f.kind == "noisy_neighbour" and f.rank in (src, dst):
                burst = int((t - f.onset) / 0.25) % 5 < 3  # another tenant's flows, 3 of every 5 quarter-seconds
                return nominal / f.factor if burst else nominal * 1.2
            return nominal
        return Hop(True, wire, self.latency_s)

    # ------------------------------------------------------------------ the job
    def _run(self) -> None:
        f = self.fault
        free = dict.fromkeys(range(self.world), 0.05)  # when each GPU is next free
        host_sync = dict(free)  # the host waits for the last all-reduce (optimizer step) before the next
        seqs = [0] * len(self.groups)
        tp_groups = [gi for gi, (n, _) in enumerate(self.groups) if n.startswith("tp")]
        dp_groups = [gi for gi, (n, _) in enumerate(self.groups) if not n.startswith("tp")]
        while min(free.values()) < self.seconds:
            ready: dict[int, float] = {}
            for r in range(self.world):
                work = self.compute_s * self.rng.uniform(0.95, 1.06)
                if f.kind == "gpu_power_cap" and r == f.rank and self._active(free[r]):
                    work *= f.factor
                ready[r] = free[r] + work
            for gi in tp_groups:  # TP all-reduce over NVLink: no proxy, no flows
                ranks = self.groups[gi][1]
                seqs[gi] += 1
                start = max(ready[r] for r in ranks)
                end = start + 0.012 * (f.factor if f.kind == "gpu_power_cap" and f.rank in ranks
                                       and self._active(start) else 1.0)
                for r in ranks:
                    launch = max(host_sync[r], ready[r] - self.rng.uniform(0.01, 0.05))
                    self.ops[r].append(Op(gi, seqs[gi], launch, end))
                    ready[r] = end
            for gi in dp_groups:
                ranks = self.groups[gi][1]
                seqs[gi] += 1
                self._allreduce(gi, seqs[gi], ranks, ready, host_sync, free)
            if all(math.isinf(v) for v in free.values()):
                break

    def _allreduce(self, gi: int, seq: int, ranks: tuple[int, ...], ready: dict[int, float],
                   host_sync: dict[int, float], free: dict[int, float]) -> None:
        f = self.fault
        sides: dict[int, RankSide] = {}
        launches: dict[int, float] = {}
        for r in ranks:
            lead = self.rng.uniform(0.02, 0.3)
            launch = max(host_sync[r], ready[r] - lead)
            kernel = ready[r]
            if f.kind == "late_kernel" and r == f.rank and self._active(ready[r]):
                kernel += f.factor * self.rng.uniform(0.85, 1.15)
            gpu_step = self.gpu_step_s * (f.factor if f.kind == "gpu_power_cap" and r == f.rank
                                          and self._active(ready[r]) else 1.0)
            lag = 2e-5 + (f.factor if f.kind == "slow_proxy" and r == f.rank and self._active(launch) else 0.0)
            flush = self.flush_s * (f.factor if f.kind == "pcie_downgrade" and r == f.rank
                                    and self._active(launch) else 1.0)
            sides[r] = RankSide(launch, kernel, gpu_step, lag, flush, self._nic_up(r))
            launches[r] = launch
        n = len(ranks)
        per_channel = self.bytes_per_allreduce / CHANNELS
        loops = max(1, round(per_channel / (n * self.chunk_bytes)))
        end = dict.fromkeys(ranks, 0.0)
        for c in range(CHANNELS):
            order = self._ring_order(ranks, c)
            run = ring_allreduce_channel(order, c, loops, sides, functools.partial(self._hop, gi=gi, seq=seq,
                                                                                     channel=c))
            for r, e in run.end.items():
                end[r] = max(end[r], e)
            self.flows.extend((gi, seq, fl) for fl in run.flows)
            for fl in run.flows:
                self.flow_index.setdefault((fl.rank, gi, seq), []).append(fl)
        for r in ranks:
            self.ops[r].append(Op(gi, seq, launches[r], end[r]))
            free[r] = end[r]
            host_sync[r] = end[r]

    def _ring_order(self, ranks: tuple[int, ...], channel: int) -> list[int]:
        """The channel's ring: hosts in order; inside a host from GPU channel % 4 on (dp layout)."""
        if len({host_of(r) for r in ranks}) == len(ranks):  # one rank per host (tp4dp8's DP rings)
            return list(ranks)
        order = []
        for h in range(HOSTS):
            local = [r for r in ranks if host_of(r) == h]
            k = channel % len(local)
            order.extend(local[k:] + local[:k])
        return order

    # ------------------------------------------------------------------ telemetry
    def job_end(self) -> float:
        return self.seconds

    def resource(self, job_id: str, rank: int) -> dict[str, AttrValue]:
        return {
            schema.RES_SERVICE_NAME: job_id, schema.RES_JOB_ID: job_id, schema.RES_RUN_ID: f"{job_id}.0",
            schema.RES_RANK: rank, schema.RES_WORLD_SIZE: self.world, schema.RES_LOCAL_RANK: rank % GPUS,
            schema.RES_HOST_NAME: f"host{host_of(rank):02d}", schema.RES_PROCESS_PID: 20_000 + rank,
            schema.RES_SCHEMA_VERSION: schema.SCHEMA_VERSION,
        }

    def _record(self, r: int, op: Op) -> OpRecord:
        info = self.infos[r][[g.name for g in self.infos[r]].index(self.groups[op.group][0])]
        rec = OpRecord("torch.distributed.all_reduce", schema.OP_ALL_REDUCE, info, op.seq,
                       int((self.epoch + op.launch) * 1e9))
        rec.bytes, rec.dtype = self.bytes_per_allreduce if not self.groups[op.group][0].startswith("tp") else 1 << 24, \
            "bfloat16"
        rec.call_end_ns = rec.start_ns + 20_000
        return rec

    def heartbeat(self, job_id: str, r: int, t: float, counter: int, interval: float,
                  rng: random.Random) -> SpanRecord:
        """Rank r's heartbeat at time t, built as runtime.py builds it."""
        done = [op for op in self.ops[r] if op.end <= t]
        live = [op for op in self.ops[r] if op.launch <= t < op.end]
        infos = self.infos[r]
        for info in infos:
            gi = next(i for i, (n, _) in enumerate(self.groups) if n == info.name)
            info.completed = max((op.seq for op in done if op.group == gi), default=0)
            info.issued = max((op.seq for op in self.ops[r] if op.group == gi and op.launch <= t), default=0)
            info.fr_completed = info.completed
        inflight = [self._record(r, op) for op in live]
        last_end = max((op.end for op in done), default=0.0)
        idle = 0.0 if live else max(0.0, t - last_end)
        now_ns = int((self.epoch + t) * 1e9)
        attrs = heartbeat_attributes(infos, inflight, now_ns, idle)
        attrs[schema.ATTR_HB_DROPPED] = 0
        comm = sum(min(op.end, t) - op.launch for op in self.ops[r] if op.launch <= t)
        attrs[schema.ATTR_HB_COMM_S] = round(comm, 6)
        attrs[schema.ATTR_HB_OPS_DONE] = len(done)
        if not self.op_spans_sent:  # the trace budget sent none of its op spans: the heartbeats say so
            attrs[schema.ATTR_HB_SPANS_KEPT] = 0
            attrs[schema.ATTR_HB_SPANS_SAMPLED_OUT] = len(done)
        attrs.update(self.flow_attributes(r, t, live))
        return heartbeat_span(r, counter, interval, now_ns - int(interval * 1e9), now_ns, attrs, rng)

    def flow_attributes(self, r: int, t: float, live: list[Op]) -> dict[str, AttrValue]:
        """The rank's in-flight NET flows, as NativeReader.heartbeat_attributes emits them."""
        rows = [(op.group, op.seq, fl) for op in live for fl in self.flow_index.get((r, op.group, op.seq), ())
                if fl.start <= t and fl.counters(t)[3] < fl.steps]
        if not rows:
            return {}
        rows.sort(key=lambda x: (self.comm_hex[x[0]], x[1], x[2].channel, not x[2].send))
        counters = [fl.counters(t) for _, _, fl in rows]
        return {
            schema.ATTR_HB_FLOW_COMMS: [self.comm_hex[gi] for gi, _, _ in rows],
            schema.ATTR_HB_FLOW_SEQS: [seq for _, seq, _ in rows],
            schema.ATTR_HB_FLOW_CHANNELS: [fl.channel for _, _, fl in rows],
            schema.ATTR_HB_FLOW_PEERS: [fl.peer for _, _, fl in rows],
            schema.ATTR_HB_FLOW_SENDS: [fl.send for _, _, fl in rows],
            schema.ATTR_HB_FLOW_STEPS: [fl.steps for _, _, fl in rows],
            schema.ATTR_HB_FLOW_POSTED: [c[0] for c in counters],
            schema.ATTR_HB_FLOW_GPU_READY: [c[1] for c in counters],
            schema.ATTR_HB_FLOW_TRANSMITTED: [c[2] for c in counters],
            schema.ATTR_HB_FLOW_DONE: [c[3] for c in counters],
            schema.ATTR_HB_FLOW_AGES_S: [round(max(0.0, t - fl.last_move(t)), 3) for _, _, fl in rows],
            schema.ATTR_HB_FLOW_RANKS: [r] * len(rows),
            schema.ATTR_HB_FLOW_PROXY_STATES: [fl.proxy_state(t) for _, _, fl in rows],
        }

    def op_spans(self, job_id: str, r: int) -> list[tuple[float, SpanRecord]]:
        """(when it is sent, span) of every op the rank completed, as op_span builds it."""
        out = []
        for op in self.ops[r]:
            if math.isinf(op.end) or op.end > self.seconds:
                continue
            rec = self._record(r, op)
            rec.end_ns = int((self.epoch + op.end) * 1e9)
            rec.state = schema.STATE_COMPLETED
            out.append((self.epoch + op.end + 0.02, op_span(rec, job_id, r)))
        return out


def _identity(t: float) -> float:
    return t


__all__ = ["CHANNELS", "EXPECTED", "FAULTS", "GPUS", "HOSTS", "NCCL_STEPS", "Cluster", "Plan", "plan"]
