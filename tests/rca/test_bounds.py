"""Input bounded before it is expanded, and runs kept apart (issue 10's table, core rows):
a rank outside its world, rank-range and gzip bombs (RSS of a real `mycroft rca serve`
process), two launches under one job id, incidents of evicted jobs."""

from __future__ import annotations

import dataclasses
import gzip
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mycroft.rca_service.config import AnalysisConfig
from mycroft.rca_service.incidents.engine import Engine

from mycroft import schema
from mycroft.faults.made_up_job import StepJob
from mycroft.otlp import SpanRecord, request_from_records

from ..netprobe import post, raw_http, rss_mb
from .helpers import get_json, http, wait_until

CFG = dataclasses.replace(AnalysisConfig(), resolve_after_s=0.5)


def _with_run(records: list[SpanRecord], run: str) -> list[SpanRecord]:
    for record in records:
        record.resource = {**record.resource, schema.RES_RUN_ID: run}
    return records


def test_decode_ranks_checks_before_expanding() -> None:
    started = time.perf_counter()
    for bomb in ("0-999999999", "0-4999999", "0-99999999999999999999"):
        with pytest.raises(ValueError):
            schema.decode_ranks(bomb)
        with pytest.raises(ValueError):
            schema.count_ranks(bomb, 8)
    assert time.perf_counter() - started < 0.05  # nothing was expanded
    with pytest.raises(ValueError, match="outside the world"):
        schema.decode_ranks("0-8", world_size=8)
    with pytest.raises(ValueError, match="more than"):
        schema.decode_ranks("0,0,0,0", max_count=3)
    assert schema.decode_ranks("0-7", world_size=8) == list(range(8))
    assert schema.count_ranks("0-16383", 16384) == 16384


def test_rank_beyond_world_is_refused_not_a_false_crash() -> None:
    engine = Engine(CFG)
    job = StepJob("w4", 4, t0=100.0)
    engine.ingest(job.steps(5), job.now)
    liar = job.heartbeats(job.now, not_entered=range(4))[0]
    liar.resource = {**liar.resource, schema.RES_RANK: 5}
    liar.attributes = {**liar.attributes, schema.ATTR_RANK: 5}  # a real rank says it in both places
    rejected: dict[str, int] = {}
    assert engine.ingest([liar], job.now, rejected=rejected) == 0
    assert rejected == {"rank_out_of_world": 1}
    assert sorted(engine.jobs["w4"].ranks) == [0, 1, 2, 3]
    events = []
    for i in range(30):  # the real ranks keep reporting; rank 5 (which never existed) stays silent
        now = job.now + 0.2 * i
        engine.ingest(job.heartbeats(now, not_entered=range(4), stack=""), now)
        events += engine.step(now)
    assert not [e for e in events if e.action == "fired"]
    # members outside the world and peers outside it are refused too
    bad_group = job.heartbeats(job.now, not_entered=range(4))[1]
    bad_group.attributes = {**bad_group.attributes, schema.ATTR_HB_GROUP_RANKS: ["0-7"]}
    bad_peer = job.heartbeats(job.now, blocked={0: 1.0})[0]
    bad_peer.attributes = {**bad_peer.attributes, schema.ATTR_HB_INFLIGHT_PEERS: [9]}
    rejected = {}
    assert engine.ingest([bad_group, bad_peer], job.now, rejected=rejected) == 0
    assert rejected == {"bad_group_ranks": 1, "peer_out_of_world": 1}


def test_oversized_heartbeat_arrays_are_refused_where_they_would_drive_work() -> None:
    """The leading array of each heartbeat table and the lists admission walks are capped; a long
    parallel array is harmless (the fold reads it only at the leading array's indices)."""
    from mycroft.rca_service.ingest import admission

    cfg = dataclasses.replace(CFG, max_groups_per_job=4)
    job = StepJob("big", 4, t0=100.0)
    engine = Engine(cfg)
    engine.ingest(job.steps(2), job.now)
    beat = job.heartbeats(job.now, blocked={0: 1.0})[0]
    capped = {schema.ATTR_HB_GROUP_IDS: ["g"] * 5, schema.ATTR_HB_GROUP_RANKS: ["0-3"] * 5,
              schema.ATTR_HB_DIGEST_GROUP_IDS: ["g"] * 5,
              schema.ATTR_HB_INFLIGHT_GROUP_IDS: ["g"] * (admission.MAX_INFLIGHT_OPS + 1),
              schema.ATTR_HB_INFLIGHT_PEERS: [-1] * (admission.MAX_INFLIGHT_OPS + 1)}
    for key, value in capped.items():
        bomb = dataclasses.replace(beat, attributes={**beat.attributes, key: value})
        rejected: dict[str, int] = {}
        assert engine.ingest([bomb], job.now, rejected=rejected) == 0, key
        assert rejected == {admission.REJECT_OVERSIZED: 1}, key
    long_tail = dataclasses.replace(beat, attributes={
        **beat.attributes, schema.ATTR_HB_GROUP_SIZES: [4] * 100,
        schema.ATTR_HB_INFLIGHT_SEQS: list(beat.attributes[schema.ATTR_HB_INFLIGHT_SEQS]) + [7] * 5000})
    assert engine.ingest([long_tail], job.now) == 1
    rank = engine.jobs["big"].ranks[0]
    assert len(rank.inflight) == len(beat.attributes[schema.ATTR_HB_INFLIGHT_GROUP_IDS])


def test_a_changed_member_list_is_checked_again_within_a_batch() -> None:
    """A rank's unchanged member list is not walked again (the same decoded object as the one it
    was admitted with); a new one is, also when a batch's job is already known."""
    from mycroft.otlp import DecodeCache

    cache = DecodeCache()

    def wire(records: list[SpanRecord]) -> list[SpanRecord]:  # as the receivers hand them over: shared values
        return cache.decode(request_from_records(records).SerializeToString())

    engine = Engine(CFG)
    job = StepJob("members", 4, t0=100.0)
    engine.ingest(wire(job.steps(2)), job.now)
    engine.ingest(wire(job.heartbeats(job.now)), job.now)
    good, bad = job.heartbeats(job.now + 1.0)[:2]
    bad.attributes = {**bad.attributes, schema.ATTR_HB_GROUP_RANKS: ["0-7"]}
    decoded = wire([good, bad])
    prior = engine.jobs["members"].ranks[1]
    assert decoded[1].resource is prior.resource and prior.hb_table is not None  # the shortcut applies
    rejected: dict[str, int] = {}
    assert engine.ingest(decoded, job.now + 1.0, rejected=rejected) == 1
    assert rejected == {"bad_group_ranks": 1}
    same = wire(job.heartbeats(job.now + 2.0))
    assert same[1].attributes[schema.ATTR_HB_GROUP_RANKS] is prior.hb_table[2]
    assert engine.ingest(same, job.now + 2.0) == 4


def test_a_heartbeat_like_the_last_admitted_one_is_admitted_and_any_change_is_checked() -> None:
    """apply_records skips admission for a heartbeat whose checked arrays (admission.HEARTBEAT_CHECKED)
    equal the last admitted heartbeat's of the same process; a changed one (a peer outside the
    world) is refused, and so is the same heartbeat from another process (a smaller world)."""
    from mycroft.rca_service.ingest import admission

    from mycroft.otlp import DecodeCache

    cache = DecodeCache()

    def wire(records: list[SpanRecord]) -> list[SpanRecord]:
        return cache.decode(request_from_records(records).SerializeToString())

    engine = Engine(CFG)
    job = StepJob("checked", 4, t0=100.0)
    engine.ingest(wire(job.steps(2)), job.now)
    first = wire(job.heartbeats(job.now))
    assert engine.ingest(first, job.now) == 4
    rank = engine.jobs["checked"].ranks[1]
    assert rank.hb_checked == admission.heartbeat_checked(first[1].attributes)
    later = job.heartbeats(job.now + 1.0)
    beat = later[1]
    beat.attributes = {**beat.attributes, schema.ATTR_HB_INFLIGHT_GROUP_IDS: ["g"], schema.ATTR_HB_INFLIGHT_SEQS: [9],
                       schema.ATTR_HB_INFLIGHT_OPS: [schema.OP_SEND], schema.ATTR_HB_INFLIGHT_PEERS: [99]}
    rejected: dict[str, int] = {}
    assert engine.ingest(wire(later), job.now + 1.0, rejected=rejected) == 3
    assert rejected == {admission.REJECT_PEER_OUT_OF_WORLD: 1}
    again = wire(job.heartbeats(job.now + 2.0))
    assert again[2].attributes[schema.ATTR_HB_GROUP_IDS] is rank.hb_checked[0]  # shared: the shortcut applies
    assert engine.ingest(again, job.now + 2.0) == 4
    smaller = [dataclasses.replace(r, resource={**r.resource, schema.RES_WORLD_SIZE: 2}) for r in
               job.heartbeats(job.now + 3.0)[2:]]
    rejected = {}
    engine.ingest(wire(smaller), job.now + 3.0, rejected=rejected)
    assert rejected.get(admission.REJECT_RANK_OUT_OF_WORLD) == 2, rejected


def test_a_job_evicted_mid_batch_is_not_folded_into() -> None:
    """apply_records looks a job up once per batch; a record that evicts it (max_jobs) must not
    leave the batch's later records folding into the evicted state."""
    cfg = dataclasses.replace(CFG, max_jobs=1)
    first, second = StepJob("one", 2, t0=100.0), StepJob("two", 2, t0=100.0)
    engine = Engine(cfg)
    batch = first.heartbeats(100.0)[:1] + second.heartbeats(100.0)[:1] + first.heartbeats(100.0)[1:]
    assert engine.ingest(batch, 100.0) == 3
    assert list(engine.jobs) == ["one"]  # "two" evicted "one", whose second rank then took it back
    assert sorted(engine.jobs["one"].ranks) == [1]


def test_two_launches_under_one_job_id_are_kept_apart() -> None:
    """World 4 (healthy) and world 8 (rank 6 never enters) both call themselves "clash"."""
    for runs in (("a1b2.0", "c3d4.0"), ("", "")):  # with run ids, and without (told apart by world size)
        engine = Engine(CFG)
        small = StepJob("clash", 4, t0=100.0)
        big = StepJob("clash", 8, t0=100.0)
        engine.ingest(_with_run(small.steps(10), runs[0]) if runs[0] else small.steps(10), small.now)
        engine.ingest(_with_run(big.steps(10), runs[1]) if runs[1] else big.steps(10), big.now)
        onset = big.now
        fired_at = None
        for i in range(1, 40):
            now = onset + 0.1 * i
            hb_small = small.heartbeats(now, not_entered=range(4), stack="")
            small.steps(1)
            hb_big = big.heartbeats(now, not_entered=[6])
            engine.ingest((_with_run(hb_small, runs[0]) if runs[0] else hb_small)
                          + (_with_run(hb_big, runs[1]) if runs[1] else hb_big), now)
            for event in engine.step(now):
                if event.action == "fired" and fired_at is None:
                    fired_at = now
                    incident = event.incident
        assert len(engine.jobs) == 2
        assert engine.jobs["clash"].world_size == 4
        second = next(k for k in engine.jobs if k != "clash")
        assert second.startswith("clash#") and engine.jobs[second].world_size == 8
        assert fired_at is not None and fired_at - onset < 2.5
        assert incident.job == second and incident.root_causes[0]["rank"] == 6


def test_a_relaunch_replaces_the_old_run() -> None:
    engine = Engine(CFG)
    first = StepJob("re", 4, t0=100.0)
    engine.ingest(_with_run(first.steps(5), "base.0"), first.now)
    again = StepJob("re", 4, t0=first.now + 0.2)
    engine.ingest(_with_run(again.steps(2), "base.1"), again.now)  # torchelastic restart 1, at once
    assert list(engine.jobs) == ["re"] and engine.jobs["re"].run_id == "base.1"


def test_incidents_of_evicted_jobs_resolve() -> None:
    cfg = dataclasses.replace(CFG, max_jobs=3)
    engine = Engine(cfg)
    fired: set[str] = set()
    resolved: dict[str, str] = {}
    now = 1000.0
    jobs: dict[str, StepJob] = {}
    for n in range(8):  # 8 hung jobs through a cap of 3; the live ones keep reporting their hang
        jobs[f"hung-{n}"] = job = StepJob(f"hung-{n}", 4, t0=now - 5.0)
        engine.ingest(job.steps(20), now)
        for _ in range(6):
            for name in [j for j in jobs if j in engine.jobs or j == f"hung-{n}"]:
                engine.ingest(jobs[name].heartbeats(now, not_entered=[2]), now)
            for event in engine.step(now):
                if event.action == "fired":
                    fired.add(event.incident.job)
                elif event.action == "resolved":
                    resolved[event.incident.job] = str(event.incident.evidence.get("resolved_because"))
            now += 0.5
    assert len(fired) == 8 and len(engine.jobs) == 3
    assert {i.job for i in engine.tracker.active.values()} == set(engine.jobs) == {"hung-5", "hung-6", "hung-7"}
    assert sorted(resolved) == [f"hung-{n}" for n in range(5)]
    assert all("evicted" in reason for reason in resolved.values()), resolved


# ------------------------------------------------------------------ a real service process
@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, int]]]:
    proc = subprocess.Popen([sys.executable, "-m", "mycroft.cli", "rca", "serve", "--otlp-grpc", "",
                             "--otlp-http", "127.0.0.1:0", "--http", "127.0.0.1:0", "--db", str(tmp_path / "r.db")],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    ports = json.loads(proc.stdout.readline())
    try:
        yield proc, ports
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def _settle(pid: int) -> float:
    time.sleep(0.3)
    return rss_mb(pid)


@pytest.mark.slow
def test_memory_stays_bounded_under_bombs(served: tuple[subprocess.Popen[str], dict[str, int]]) -> None:
    proc, ports = served
    api = f"http://127.0.0.1:{ports['http']}"
    job = StepJob("bombed", 4)
    body = request_from_records(job.steps(3)).SerializeToString()
    assert raw_http(ports["otlp_http"], post("/v1/traces", body)).status == 200
    assert wait_until(lambda: bool(get_json(f"{api}/api/v1/jobs")), 5)
    base = _settle(proc.pid)

    # 1. gzip: 509 KiB declaring 512 MiB
    bomb = gzip.compress(b"\0" * (512 << 20), 9)
    reply = raw_http(ports["otlp_http"], post("/v1/traces", bomb, extra="Content-Encoding: gzip\r\n"), timeout=30)
    assert reply.status == 413
    after_gzip = _settle(proc.pid)
    assert after_gzip - base < 100, f"RSS {base:.0f} -> {after_gzip:.0f} MB under the gzip bomb"

    # 2. rank ranges of 9 bytes naming millions (and a billion) of ranks
    for text in ("0-4999999", "0-999999999"):
        hb = job.heartbeats(time.time(), not_entered=range(4))
        for record in hb:
            record.attributes = {**record.attributes, schema.ATTR_HB_GROUP_RANKS: [text]}
        collective = job.steps(1)
        for record in collective:
            record.attributes = {**record.attributes, schema.ATTR_GROUP_RANKS: text}
        payload = request_from_records(hb + collective).SerializeToString()
        assert raw_http(ports["otlp_http"], post("/v1/traces", payload)).status == 200
    time.sleep(0.5)
    after_ranks = _settle(proc.pid)
    assert after_ranks - base < 100, f"RSS {base:.0f} -> {after_ranks:.0f} MB under rank-range bombs"
    started = time.perf_counter()
    jobs = get_json(f"{api}/api/v1/jobs")
    assert time.perf_counter() - started < 0.25
    assert [g["size"] for g in jobs[0]["groups"]] == [4]
    metrics = http(f"{api}/metrics")[1].decode()
    assert 'mycroft_rca_spans_dropped_total{reason="bad_group_ranks"} 16' in metrics
    assert 'mycroft_rca_requests_rejected_total{reason="too_large"} 1' in metrics
    assert proc.poll() is None
