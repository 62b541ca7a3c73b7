"""Feed a model's telemetry to the RCA engine on the model's clock, through the OTLP wire, and score it.

``run_model`` (this package's NCCL model) and ``run_bigjob`` (the existing simulator,
bigjob.py / simfaults.py) both produce span records at the times a rank would send them; the
records go through the OTLP protobuf encoder and decoder (what `mycroft rca serve` receives),
into the same Engine the service runs, stepped every ``tick_s`` of model time (as `mycroft rca
analyze` replays a recording).  Time is the model's, so a 30 s run takes a few seconds of CPU
and a loaded machine cannot turn into a verdict.

Scoring (issue 44): a run is right when the first loud (warning or critical) incident after the
onset -- else the first incident -- has an expected kind and its first root cause names the
faulty rank with an expected root-cause kind ("right as first raised"); a healthy run is right
when no loud incident is raised at all.  ``changes`` counts how often an incident's first root
cause (rank, kind) changed while it fired, read off every event the engine emitted.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from mycroft.otlp import SpanRecord, decode_protobuf, request_from_records

from .cluster import EXPECTED, Cluster, Plan, plan


@dataclass(slots=True)
class Outcome:
    fault: str
    layout: str
    mode: str  # "spans" (op spans sent) or "hb_only"
    seed: int
    rank: int | None
    right: bool
    verdict: str | None
    root_cause: tuple[str | None, int | None] | None
    severity: str | None
    detected_s: float | None
    root_cause_s: float | None
    loud_before: int
    loud: int
    max_changes: int
    changes: list[int]
    incidents: list[tuple[str, str, float, list[Any]]]

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


def _wire(records: list[SpanRecord]) -> list[SpanRecord]:
    """Through the OTLP protobuf encoder and decoder, as the service receives them."""
    return decode_protobuf(request_from_records(records).SerializeToString())


def replay(timed: Iterable[tuple[float, SpanRecord]], end: float, tick_s: float = 0.25,
           cfg: Any = None, start: float = 0.0) -> tuple[list[Any], dict[str, list[tuple[Any, ...]]]]:
    """Feed (send time, record) pairs to an Engine on model time; every incident (final state) and,
    per incident id, the first root cause of each event in order."""
    from mycroft.rca_service.incidents.engine import Engine

    engine = Engine(cfg)
    ordered = sorted(timed, key=lambda x: x[0])
    i, t = 0, start
    seen: dict[str, Any] = {}
    causes: dict[str, list[tuple[Any, ...]]] = {}
    while t <= end:
        batch = []
        while i < len(ordered) and ordered[i][0] <= t:
            batch.append(ordered[i][1])
            i += 1
        if batch:
            engine.ingest(_wire(batch), t)
        for event in engine.step(t):
            inc = event.incident
            seen[inc.id] = inc
            first = inc.root_causes[0] if inc.root_causes else {}
            sig = (first.get("rank"), first.get("kind"), inc.severity)
            history = causes.setdefault(inc.id, [])
            if not history or history[-1] != sig:
                history.append(sig)
        t += tick_s
    return sorted(seen.values(), key=lambda x: x.detected_at), causes


def score(fault: str, rank: int | None, onset: float, incidents: list[Any], causes: dict[str, list[tuple[Any, ...]]],
          expected: dict[str, tuple[frozenset[str], frozenset[str]]]) -> dict[str, Any]:
    loud = [x for x in incidents if x.severity != "info"]
    before = [x for x in loud if x.detected_at < onset] if fault != "none" else []
    after = [x for x in incidents if fault == "none" or x.detected_at >= onset]
    loud_after = [x for x in after if x.severity != "info"]
    verdict = (loud_after or after or [None])[0]
    changes = [_changes(causes.get(x.id, [])) for x in incidents]
    out: dict[str, Any] = {"loud": len(loud), "loud_before": len(before), "changes": changes,
                           "max_changes": max(changes, default=0),
                           "incidents": [(x.kind, x.severity, round(x.detected_at - onset, 2),
                                          [(c.get("kind"), c.get("rank")) for c in x.root_causes[:2]])
                                         for x in incidents][:8]}
    if fault == "none":
        out.update(right=not loud, verdict=loud[0].kind if loud else None, root_cause=None,
                   severity=loud[0].severity if loud else None, detected_s=None, root_cause_s=None)
        return out
    if verdict is None:
        out.update(right=False, verdict=None, root_cause=None, severity=None, detected_s=None, root_cause_s=None)
        return out
    history = causes.get(verdict.id) or [(None, None, None)]
    # the root cause as first raised (the first time the incident was loud), not as it ended
    raised = next((h for h in history if h[2] != "info"), history[0])
    first = {"rank": raised[0], "kind": raised[1]}
    kinds, rc_kinds = expected[fault]
    right = verdict.kind in kinds and first.get("kind") in rc_kinds and first.get("rank") == rank and not before
    out.update(right=right, verdict=verdict.kind, root_cause=(first.get("kind"), first.get("rank")),
               severity=verdict.severity, detected_s=round(verdict.detected_at - onset, 2),
               root_cause_s=round((verdict.root_cause_at or verdict.detected_at) - onset, 2))
    return out


def _changes(history: list[tuple[Any, ...]]) -> int:
    """How often the first root cause (rank, kind) changed over an incident's events."""
    sigs = [h[:2] for h in history]
    return sum(1 for a, b in itertools.pairwise(sigs) if a != b)


def model_records(cluster: Cluster, job_id: str, interval: float, op_spans: bool,
                  seed: int) -> list[tuple[float, SpanRecord]]:
    """Every heartbeat (each rank on its own phase) and, unless heartbeat-only, every op span."""
    rng = random.Random(seed)
    out: list[tuple[float, SpanRecord]] = []
    for r in range(cluster.world):
        resource = cluster.resource(job_id, r)
        phase = rng.uniform(0.0, interval)
        k, t = 1, phase
        while t <= cluster.seconds:
            rec = cluster.heartbeat(job_id, r, t, k, interval, rng)
            rec.resource = resource
            out.append((cluster.epoch + t + 0.005, rec))
            k += 1
            t += interval
        if op_spans:
            for at, span in cluster.op_spans(job_id, r):
                span.resource = resource
                out.append((at, span))
    return out


def run_model(fault: str, seed: int, layout: str = "dp", hb_only: bool = False, seconds: float = 30.0,
              interval: float = 1.0, cfg: Any = None) -> Outcome:
    """One run of the NCCL source model under `fault` ("none": healthy)."""
    p = plan(fault, seed) if fault != "none" else Plan("none", -1, 8.0, 1.0, seed)
    cluster = Cluster(layout=layout, fault=p, seconds=seconds, seed=seed, op_spans_sent=not hb_only)
    job = f"model-{layout}-{fault}-{seed}{'-hb' if hb_only else ''}"
    incidents, causes = replay(model_records(cluster, job, interval, not hb_only, seed), cluster.epoch + seconds,
                               cfg=cfg, start=cluster.epoch)
    s = score(fault, p.rank if fault != "none" else None, cluster.epoch + p.onset, incidents, causes, EXPECTED)
    return Outcome(fault, layout, "hb_only" if hb_only else "spans", seed, p.rank if fault != "none" else None,
                   s["right"], s["verdict"], s["root_cause"], s["severity"], s["detected_s"], s["root_cause_s"],
                   s["loud_before"], s["loud"], s["max_changes"], s["changes"], s["incidents"])


def run_bigjob(fault: str, seed: int, world: int = 64, tp: int = 8, hb_only: bool = True, seconds: float = 20.0,
               interval: float = 1.0, warmup: int = 6, cfg: Any = None) -> Outcome:
    """One run of the existing simulator (bigjob.py, simfaults.py) under `fault`, as `mycroft simulate`
    runs it (two senders half an interval apart), on model time."""
    from mycroft.faults.bigjob import BigJob, Layout
    from mycroft.faults.simfaults import EXPECTED as SIM_EXPECTED
    from mycroft.faults.simfaults import plan as sim_plan

    fp = sim_plan(fault if fault != "none" else "block", world, tp, seed)
    job_id = f"sim-{fault}-{world}-{seed}{'-hb' if hb_only else ''}"
    job = BigJob(job_id, Layout(world, tp, 1), 10, interval, fault=fp if fault != "none" else None)
    if fault == "none":
        job.fault_at = 0.0
    start = 1.8e9
    onset = start + warmup * interval + random.Random(seed).uniform(0.0, 1.0) * interval
    if fault != "none":
        job.fault_at = onset
    timed: list[tuple[float, SpanRecord]] = []
    k = 0
    while start + k * interval < start + seconds:
        nominal = start + k * interval
        job.tick(nominal)
        for half in (0, 1):
            now = nominal + half * interval / 2
            ranks = list(range(half, world, 2))
            for r in ranks:
                if not job.sends(r, now):
                    continue
                rec = job.record(r, now)
                rec.resource = job.resource(r)
                timed.append((now + 0.005, rec))
            if not hb_only:
                payload, count = job.op_span_bytes(ranks, now, 0.1)
                if count:
                    timed.extend((now + 0.005, rec) for rec in decode_protobuf(payload))
        k += 1
    incidents, causes = replay(timed, start + seconds, cfg=cfg, start=start)
    s = score(fault, fp.rank if fault != "none" else None, onset, incidents, causes, _sim_expected(SIM_EXPECTED))
    if fault == "deadlock" and s["root_cause"] is not None and s["verdict"] == "deadlock":
        s["right"] = s["root_cause"] == ("deadlock", fp.partner) and not s["loud_before"]
    return Outcome(fault, f"sim{world}/tp{tp}", "hb_only" if hb_only else "spans", seed,
                   fp.rank if fault != "none" else None, s["right"], s["verdict"], s["root_cause"], s["severity"],
                   s["detected_s"], s["root_cause_s"], s["loud_before"], s["loud"], s["max_changes"], s["changes"],
                   s["incidents"])


def _sim_expected(sim: dict[str, tuple[frozenset[str], frozenset[str]]]) -> dict[str, tuple[frozenset[str],
                                                                                                frozenset[str]]]:
    return dict(sim)
