"""The trace budget's counts on the RCA side: heartbeats carry each rank's op-span counts
(schema.ATTR_HB_SPANS_*), the compiled fold and the Python fold read them alike, and
service.trace_budget_series sums them per job for /metrics with the budget from the resource."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from mycroft.rca_service.config import AnalysisConfig
from mycroft.rca_service.ingest import state
from mycroft.rca_service.service import trace_budget_series

from mycroft import schema
from mycroft.faults.made_up_job import StepJob
from mycroft.otlp import DecodeCache, SpanRecord, decode_protobuf, request_from_records


def _with_counts(beats: list[SpanRecord], k: int, budget: float | None, as_text: bool = False) -> list[SpanRecord]:
    out = []
    for beat in beats:
        rank = beat.rank or 0
        values: list[Any] = [100 * k + rank, rank, 1000 * k + 7 * rank]
        if as_text:
            values = [str(v) for v in values]
        attributes = {**beat.attributes, schema.ATTR_HB_SPANS_KEPT: values[0],
                      schema.ATTR_HB_SPANS_ANOMALIES: values[1], schema.ATTR_HB_SPANS_SAMPLED_OUT: values[2]}
        resource = dict(beat.resource or {})
        if budget is not None:
            resource[schema.RES_TRACE_BUDGET] = budget
        out.append(replace(beat, attributes=attributes, resource=resource))
    return out


@pytest.mark.parametrize("as_text", [False, True])
def test_both_folds_read_the_counts_and_metrics_sum_them(as_text: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    assert state._fold_fast is not None  # the compiled fold is built: it is under test here
    job = StepJob("tb", 4, t0=1000.0)
    cfg = AnalysisConfig()
    compiled: dict[str, state.JobState] = {}
    python: dict[str, state.JobState] = {}
    python_folds = []
    real_python_fold = state._apply_heartbeat_python

    def counted(*args: Any) -> None:
        python_folds.append(1)
        real_python_fold(*args)

    cache = DecodeCache()  # as the receivers decode: unchanged values shared, which the compiled fold relies on
    for k in range(1, 6):
        made = job.steps(2) + _with_counts(job.heartbeats(job.now + 0.1), k, 2048.0, as_text)
        records = decode_protobuf(request_from_records(made).SerializeToString(), cache)
        with monkeypatch.context() as m:
            m.setattr(state, "_apply_heartbeat_python", counted)
            state.apply_records(compiled, records, job.now + 0.2, cfg)
        with monkeypatch.context() as m:
            m.setattr(state, "_fold_fast", None)
            state.apply_records(python, records, job.now + 0.2, cfg)
    assert compiled == python
    # counts of their usual type: the compiled fold takes the steady beats (all but each rank's first);
    # as text it declines them and the Python fold converts
    assert len(python_folds) == (20 if as_text else 4)
    ranks = compiled["tb"].ranks
    assert [(r.spans_kept, r.spans_anomalies, r.spans_sampled_out) for _, r in sorted(ranks.items())] == \
        [(500 + i, i, 5000 + 7 * i) for i in range(4)]
    series = trace_budget_series(compiled.values())
    assert series == {"budget": {"tb": 2048.0}, "kept": {"tb": 2006.0}, "anomalies": {"tb": 6.0},
                      "sampled_out": {"tb": 20042.0}}


def test_a_job_without_a_budget_has_no_budget_series() -> None:
    job = StepJob("free", 2, t0=1000.0, trace_budget=None)
    jobs: dict[str, state.JobState] = {}
    beats = _with_counts(job.heartbeats(job.now + 0.1), 1, None)
    state.apply_records(jobs, job.steps(2) + beats, job.now, AnalysisConfig())
    series = trace_budget_series(jobs.values())
    assert series["budget"] == {} and series["sampled_out"] == {"free": 1000.0 + 1007.0}
