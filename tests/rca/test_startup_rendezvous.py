"""A rank that never reaches init_process_group is named about a second after the others wait
for it, unless the others themselves trickled into rendezvous (then in proportion to that)."""

from __future__ import annotations

from mycroft.rca_service.analysis.verdict import analyze_job, startup_threshold_s
from mycroft.rca_service.config import AnalysisConfig
from mycroft.rca_service.ingest.state import JobState, apply_records

from mycroft import schema
from mycroft.faults.made_up_job import heartbeat
from mycroft.otlp import SpanRecord

CFG = AnalysisConfig()
IMPORT_STACK = "train.py:3 in <module>\ndata.py:40 in download_shards\nsocket.py:700 in recv"


def _startup(rank: int, at: float, phase: str, phase_s: float, stack: str = "") -> SpanRecord:
    record = heartbeat("job", rank, 4, at, 1, [], [], [], stack=stack, interval=0.5)
    record.attributes[schema.ATTR_HB_PHASE] = phase
    record.attributes[schema.ATTR_HB_PHASE_S] = phase_s
    return record


def _job(at: float, waited: dict[int, float], importing: dict[int, float]) -> JobState:
    jobs: dict[str, JobState] = {}
    records = [_startup(r, at, schema.PHASE_RENDEZVOUS, s) for r, s in waited.items()]
    records += [_startup(r, at, schema.PHASE_IMPORTING, s, IMPORT_STACK) for r, s in importing.items()]
    apply_records(jobs, records, at, CFG)
    return jobs["job"]


def _startup_findings(job: JobState, now: float) -> list:
    return [f for f in analyze_job(job, now, CFG) if f.evidence.get("phase") == "startup"]


def test_ranks_that_arrived_together_name_the_absent_one_after_a_second() -> None:
    t = 50.0
    job = _job(t, {0: 0.8, 1: 0.75, 2: 0.7}, {3: 6.0})
    assert not _startup_findings(job, t)  # 0.8 s: a rank may just be late
    found = _startup_findings(job, t + 0.3)  # 1.1 s
    assert found, analyze_job(job, t + 0.3, CFG)
    finding = found[0]
    assert [c.rank for c in finding.root_causes] == [3]
    assert finding.root_causes[0].kind == "not_arrived"
    assert finding.severity == "warning"  # within the start-up budget
    assert finding.root_causes[0].evidence["stack"] == IMPORT_STACK


def test_ranks_that_trickled_in_wait_in_proportion() -> None:
    t = 50.0
    job = _job(t, {0: 1.5, 1: 1.0, 2: 0.0}, {3: 4.0})  # arrived 1.5 s apart: a big job's spread
    assert startup_threshold_s([1.5, 1.0, 0.0], 0.5, CFG) == 3.0
    assert not _startup_findings(job, t + 1.4)  # waited 2.9 s of 3 s
    assert _startup_findings(job, t + 1.6)


def test_a_rank_never_heard_from_is_named_and_the_floor_is_one_interval() -> None:
    t = 50.0
    job = _job(t, {0: 1.2, 1: 1.2, 2: 1.1}, {})
    found = _startup_findings(job, t)
    assert found and [c.rank for c in found[0].root_causes] == [3]
    assert found[0].root_causes[0].evidence["status"] == "unseen"
    assert startup_threshold_s([0.1, 0.1], 2.0, CFG) == 2.0  # slow heartbeats: one interval at least
