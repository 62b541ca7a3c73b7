"""The first steps of a compiled job page no one; a real block still does.

Seen in healthy torch.compile(fullgraph=True) runs on 2 busy cores (test_frameworks'
healthy compile, ~1 in 6 before): ranks compile for 15-25 s at stacks that end in code the
compiler generated (`<string>`, `<eval_with_key>`), a compiler holding the GIL starves a
rank's heartbeat thread for 1.6 s, a rank's first eager optimizer step takes 1.1 s while a
peer already waits: each was a critical page.
"""

from __future__ import annotations

from mycroft.rca_service.analysis.findings import SEVERITY, Finding
from mycroft.rca_service.analysis.verdict import analyze_job
from mycroft.rca_service.config import AnalysisConfig
from mycroft.rca_service.ingest.state import JobState, apply_records

from mycroft import schema
from mycroft.faults.made_up_job import Group, InFlightOp, heartbeat
from mycroft.otlp import SpanRecord

CFG = AnalysisConfig()
WORLD = Group("0", (0, 1, 2, 3))
USER_STACK = 'train.py:40 in <module>\ntrain.py:22 in step\ntrain.py:9 in wait_for_the_other_job'
GENERATED = ("/venv/lib/python3.11/site-packages/torch/_dynamo/eval_frame.py:1166 in compile_wrapper\n"
             "/usr/lib/python3.11/dataclasses.py:433 in _create_fn\n<string>:0 in <module>")
FX_GENERATED = ("/venv/lib/python3.11/site-packages/torch/_dynamo/eval_frame.py:1446 in _fn\n"
                "/venv/lib/python3.11/site-packages/torch/fx/graph_module.py:493 in __call__\n"
                "<eval_with_key>.5:12 in forward")


def _phase(record: SpanRecord, phase: str) -> SpanRecord:
    record.attributes[schema.ATTR_HB_PHASE] = phase
    return record


def _held(t: float, idle_s: float, stack: str, phase: str = schema.PHASE_TRAINING) -> JobState:
    """Ranks 0-2 wait in seq 8 for rank 3, outside communication for `idle_s` at `stack`."""
    jobs: dict[str, JobState] = {}
    hb = [heartbeat("job", r, 4, t, 1, [WORLD], [8], [7], [InFlightOp(WORLD, 8, age_s=idle_s)]) for r in range(3)]
    hb.append(_phase(heartbeat("job", 3, 4, t, 1, [WORLD], [7], [7], idle_s=idle_s, stack=stack), phase))
    apply_records(jobs, hb, t, CFG)
    return jobs["job"]


def _severity(finding: Finding) -> str:
    return finding.severity or SEVERITY[finding.kind]


def _top(job: JobState, now: float) -> Finding:
    findings = analyze_job(job, now, CFG)
    assert findings
    return findings[0]


def test_a_rank_that_says_it_compiles_is_an_expected_pause_at_any_stack() -> None:
    t = 100.0
    finding = _top(_held(t, 20.0, USER_STACK, schema.PHASE_COMPILING), t + 0.1)
    assert (finding.kind, finding.root_causes[0].rank, _severity(finding)) == ("hang", 3, "info")
    assert finding.evidence["pause"]["phase"] == "compilation", finding.evidence
    # the same stack in training: a hang that pages
    assert _severity(_top(_held(t, 20.0, USER_STACK), t + 0.1)) == "critical"


def test_code_a_library_generated_counts_as_the_librarys() -> None:
    t = 200.0
    for stack in (GENERATED, FX_GENERATED):
        finding = _top(_held(t, 20.0, stack), t + 0.1)
        assert _severity(finding) == "info" and finding.evidence["pause"]["phase"] == "compilation", stack


def test_a_holder_just_past_the_threshold_warns_then_pages_if_it_stays_out() -> None:
    t = 300.0
    young = _top(_held(t, 1.4, USER_STACK), t + 0.1)
    assert (young.root_causes[0].rank, young.root_causes[0].kind, _severity(young)) == (3, "not_entered", "warning")
    assert "critical if they stay out" in young.severity_reason
    old = _top(_held(t, 1.4, USER_STACK), t + 0.1 + CFG.page_idle_min_s)
    assert _severity(old) == "critical"


def _silent(t: float, phase: str) -> JobState:
    """Rank 1's last heartbeat at t (in `phase`, at a stack in no expected phase); the others keep
    beating and training."""
    jobs: dict[str, JobState] = {}
    apply_records(jobs, [_phase(heartbeat("job", 1, 4, t, 1, [WORLD], [7], [7], idle_s=0.6,
                                          stack=USER_STACK), phase)], t, CFG)
    for k, at in enumerate((t + 0.5, t + 1.0, t + 1.5, t + 2.0)):
        apply_records(jobs, [heartbeat("job", r, 4, at, 2 + k, [WORLD], [7], [7], idle_s=0.1) for r in (0, 2, 3)],
                      at, CFG)
    return jobs["job"]


def test_a_rank_silent_while_compiling_warns_until_the_grace_then_pages() -> None:
    t = 400.0
    starved = _top(_silent(t, schema.PHASE_COMPILING), t + 2.1)
    assert (starved.kind, starved.root_causes[0].rank, _severity(starved)) == ("crash", 1, "warning")
    assert "compiling" in starved.severity_reason
    job = _silent(t, schema.PHASE_COMPILING)
    later = t + CFG.paused_silence_grace_s + 0.5
    apply_records({"job": job}, [heartbeat("job", r, 4, later, 90, [WORLD], [7], [7]) for r in (0, 2, 3)],
                  later, CFG)
    assert _severity(_top(job, later + 0.1)) == "critical"


def test_a_silent_rank_nobody_waits_on_warns_until_peers_wait_or_exit() -> None:
    t = 500.0
    quiet = _top(_silent(t, schema.PHASE_TRAINING), t + 2.1)
    assert (quiet.kind, _severity(quiet)) == ("crash", "warning") and "no rank waits" in quiet.severity_reason
    # its peers wait on it in their next collective: a hang naming it, which pages
    job = _silent(t, schema.PHASE_TRAINING)
    apply_records({"job": job}, [heartbeat("job", r, 4, t + 2.5, 50, [WORLD], [8], [7],
                                           [InFlightOp(WORLD, 8, age_s=1.6)]) for r in (0, 2, 3)], t + 2.5, CFG)
    waited = _top(job, t + 2.6)
    assert (waited.kind, waited.root_causes[0].rank, waited.root_causes[0].kind, _severity(waited)) == \
        ("hang", 1, "process_lost", "critical")
    # the launcher tears the job down (the others exit): a crash that pages
    job = _silent(t, schema.PHASE_TRAINING)
    apply_records({"job": job}, [heartbeat("job", r, 4, t + 2.2, 60, [WORLD], [7], [7], final=True,
                                           exit_reason="SIGTERM") for r in (0, 2, 3)], t + 2.2, CFG)
    torn = _top(job, t + 2.3)
    assert (torn.kind, _severity(torn)) == ("crash", "critical")
    # nothing corroborates it, but the silence outlasts the grace
    assert _severity(_top(_silent(t, schema.PHASE_TRAINING), t + CFG.unwaited_lost_grace_s + 0.1)) == "critical"
