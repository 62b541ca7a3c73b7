"""The action policy (pure): parsing errors that name the key, which verdicts are trusted, what
decide() records (never on consequences, warnings or pauses unless asked; once per incident;
rate limits per job, per host and across the fleet), and the fleet memory's fold."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from mycroft.rca_service.incidents import hosts
from mycroft.rca_service.incidents.action_policy import (
    ABORT_JOB,
    ACT,
    DRAIN_NODE,
    EXEC,
    OBSERVED,
    OWED,
    RATE_LIMITED,
    SKIPPED,
    History,
    JobFacts,
    PolicyError,
    Recent,
    cause_line,
    decide,
    load_policy,
    parse_policy,
    slurm_reason,
    untrusted_because,
)
from mycroft.rca_service.incidents.scheduler_actions import sanitize_reason

ACTING = """
mode: act
rules:
  - kinds: [hang, crash, deadlock, mismatch]
    min_severity: critical
    do: [abort_job, {drain_node: {requeue: true}}]
"""


def _policy(text: str = ACTING) -> Any:
    return parse_policy(yaml.safe_load(text), "test")


Causes = list[tuple[Any, str, dict[str, Any]]]


def _incident(kind: str = "hang", severity: str = "critical", causes: Causes | None = None,
              hosts_: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    causes = causes if causes is not None else [(2, "not_entered", {"text": "rank 2 is alive but sleeps\nin train.py",
                                                                    "status": "alive"})]
    return {"id": "inc1", "job": "llama", "kind": kind, "status": "firing", "severity": severity,
            "summary": "3 ranks stuck", "consequence_of": None, "evidence": {},
            "root_causes": [{"rank": r, "kind": k, "evidence": e} for r, k, e in causes],
            "root_cause_hosts": hosts_ if hosts_ is not None else {str(r): f"node{r}" for r, _, _ in causes
                                                                  if r is not None},
            **extra}


LOST = [(5, "process_lost", {"text": "rank 5 stopped reporting", "status": "lost"})]


@pytest.mark.parametrize("text, where", [
    ("mode: maybe", "mode"),
    ("rules: [{kinds: [hang], do: [drian_node]}]", "rules[0].do[0]: unknown action 'drian_node'"),
    ("rules: [{kinds: [hang], do: [exec]}]", "exec needs argv"),
    ("rules: [{kinds: [hnag], do: [abort_job]}]", "rules[0].kinds: unknown value 'hnag'"),
    ("rules: [{kinds: [hang], min_severity: high, do: [abort_job]}]", "rules[0].min_severity"),
    ("rules: [{kinds: [hang], do: [{drain_node: {requeue: true, cancel: true}}]}]", "requeue and cancel"),
    ("rules: [{kinds: [hang], do: [{drain_node: {reqeue: true}}]}]", "unknown key 'reqeue'"),
    ("rules: [{kinds: [hang], do: [cordon_node]}]", "cordon_node needs a kubernetes"),
    ("rules: [{kinds: [hang]}]", "rules[0]: missing 'do'"),
    ("rules: [{kinds: [hang], do: [abort_job], trusted_only: yes please}]", "trusted_only"),
    ("limits: {per_host: {max: -1}}", "limits.per_host.max"),
    ("actions: []", "unknown key 'actions'"),
    ("rules: [{kinds: [hang], do: [{exec: {argv: [x], timeout_s: 9999}}]}]", "timeout_s"),
])
def test_policy_errors_name_the_key(text: str, where: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(yaml.safe_load(text), "policy.yaml")
    assert where in str(err.value) and str(err.value).startswith("policy.yaml")


def test_defaults_observe_and_the_file_is_checked(tmp_path: Any) -> None:
    assert parse_policy(None).mode == "observe" and not parse_policy(None).rules
    policy = _policy("rules: [{kinds: [hang], do: [abort_job]}]")
    assert policy.mode == "observe" and policy.rules[0].trusted_only and policy.rules[0].min_severity == "critical"
    path = tmp_path / "a.yaml"
    path.write_text("rules: [{kinds: [hang], do: [{exec: {argv: [/no/such/tool]}}]}]")
    with pytest.raises(PolicyError, match="not an executable"):
        load_policy(str(path))
    path.write_text("mode: [")
    with pytest.raises(PolicyError, match="not YAML"):
        load_policy(str(path))


def test_trusted_verdicts() -> None:
    assert untrusted_because(_incident()) is None
    assert untrusted_because(_incident(causes=LOST)) is None
    assert untrusted_because(_incident("deadlock", causes=[(1, "deadlock", {}), (2, "deadlock", {})])) is None
    assert untrusted_because(_incident("mismatch", causes=[(3, "mismatch", {})])) is None
    assert "severity warning" in str(untrusted_because(_incident(severity="warning")))
    assert "inferred" in str(untrusted_because(_incident("slowdown", causes=[(1, "straggler", {})])))
    assert "flow counters" in str(untrusted_because(_incident(causes=[(None, "link", {"text": "stall"})])))
    assert untrusted_because(_incident(causes=[(4, "link", {"flow_state": "not_transmitted"})])) is None
    assert "never reported" in str(untrusted_because(_incident("crash", causes=[(7, "process_lost",
                                                                                  {"status": "unseen"})])))


def test_act_on_a_trusted_hang_abort_owed_drain_skipped_for_a_program_fault() -> None:
    planned = decide(_incident(), _policy(), History(100.0), JobFacts(run="r1", slurm_job_id="42"))
    by = {p.action: p for p in planned}
    assert by[ABORT_JOB].result == OWED and by[ABORT_JOB].mode == ACT and by[ABORT_JOB].target == "llama"
    assert by[ABORT_JOB].params["exit_code"] == 75 and by[ABORT_JOB].params["run"] == "r1"
    reason = by[ABORT_JOB].params["reason"]
    assert "\n" not in reason and reason.startswith("rank 2 (not_entered) in a hang") and reason.endswith("inc1")
    assert by[DRAIN_NODE].result == SKIPPED and "not_entered does not implicate a node" in by[DRAIN_NODE].detail


def test_drain_the_host_of_a_lost_rank_with_requeue() -> None:
    planned = decide(_incident("crash", causes=LOST), _policy(), History(100.0), JobFacts(slurm_job_id="42"))
    drain = next(p for p in planned if p.action == DRAIN_NODE)
    assert drain.result == OWED and drain.target == drain.host == "node5"
    assert drain.params["requeue"] and drain.params["slurm_job_id"] == "42"
    assert drain.params["reason"] == "mycroft crash: rank 5 process_lost: rank 5 stopped reporting; incident inc1"
    assert "scontrol requeue 42" in drain.detail


def test_slurm_reason_fits_sinfo_first_ascii_incident_once() -> None:
    """What `sinfo -R` shows in its default 20-character column comes first; ASCII; the id once, last."""
    long_text = "rank 2 is alive but has not entered \u2026 the op \u00e9 " + "x" * 400
    incident = _incident(causes=[(2, "not_entered", {"text": long_text}), (3, "not_entered", {"text": "y"})])
    reason = slurm_reason(incident)
    assert reason[:20] == "mycroft hang: rank 2"
    assert reason.startswith("mycroft hang: rank 2 not_entered (+1 more): "
                             "rank 2 is alive but has not entered ... the op")
    assert len(reason) == 200 and reason.endswith("...; incident inc1")
    assert reason.count("inc1") == 1 and all(" " <= ch <= "~" for ch in reason)
    assert sanitize_reason(reason) == reason  # scontrol gets it as is


def test_abort_is_decided_first_whatever_the_rule_order() -> None:
    policy = parse_policy(yaml.safe_load("mode: act\nrules: [{kinds: [crash], do: [{drain_node: {cancel: true}}]},"
                                         " {kinds: [crash], do: [abort_job]}]"))
    planned = decide(_incident("crash", causes=LOST), policy, History(100.0), JobFacts(slurm_job_id="42"))
    assert [p.action for p in planned] == [ABORT_JOB, DRAIN_NODE]
    assert policy.slurm.kill_after_abort_s == 10.0
    bounded = parse_policy({"slurm": {"kill_after_abort_s": 3}})
    assert bounded.slurm.kill_after_abort_s == 3.0


def test_observe_records_what_would_be_done() -> None:
    planned = decide(_incident("crash", causes=LOST), _policy(ACTING.replace("mode: act", "mode: observe")),
                     History(100.0))
    assert {p.result for p in planned} == {OBSERVED}
    assert all(p.detail.startswith("would ") for p in planned)
    assert "no SLURM job id reported" in next(p for p in planned if p.action == DRAIN_NODE).detail
    # a rule may observe under an acting policy (roll out one action at a time)
    mixed = _policy(ACTING + "  - {kinds: [crash], mode: observe, do: [{exec: {argv: [/bin/true]}}]}\n")
    results = {p.action: p.result for p in decide(_incident("crash", causes=LOST), mixed, History(1.0))}
    assert results == {ABORT_JOB: OWED, DRAIN_NODE: OWED, EXEC: OBSERVED}


@pytest.mark.parametrize("incident", [
    _incident(consequence_of="earlier"),  # a teardown's aftermath
    _incident(severity="warning"),  # the holder's stack is on its way
    _incident(severity="info", evidence={"pause": {"phase": "checkpoint"}}),  # a healthy pause
    _incident(status="resolved"),
], ids=["consequence", "warning", "pause", "resolved"])
def test_never_on_consequences_warnings_or_pauses(incident: dict[str, Any]) -> None:
    assert decide(incident, _policy(), History(100.0)) == []
    # not even when a rule asks for every severity and untrusted verdicts: pauses and consequences never
    loose = _policy("mode: act\nrules: [{kinds: [hang], min_severity: info, trusted_only: false, do: [abort_job]}]")
    assert decide(incident, loose, History(100.0)) == []


def test_warnings_only_when_the_rule_asks() -> None:
    slow = _incident("slowdown", "warning", causes=[(4, "link", {"text": "slow NIC", "locus": "nic"})])
    assert decide(slow, _policy(), History(1.0)) == []
    asks = _policy("mode: act\nrules: [{kinds: [slowdown], min_severity: warning, trusted_only: false, "
                   "do: [drain_node]}]")
    (drain,) = decide(slow, asks, History(1.0))
    assert drain.result == OWED and drain.target == "node4"


def test_once_per_incident_and_max_hosts() -> None:
    policy = _policy()
    first = decide(_incident("crash", causes=LOST), policy, History(1.0))
    recorded = frozenset((p.action, p.target) for p in first)
    assert decide(_incident("crash", causes=LOST), policy, History(2.0, recorded)) == []
    spread = [(r, "process_lost", {"status": "lost"}) for r in (1, 9, 17)]
    drain = next(p for p in decide(_incident("crash", causes=spread), policy, History(1.0)) if p.action == DRAIN_NODE)
    assert drain.result == SKIPPED and "3 hosts" in drain.detail and "max_hosts 1" in drain.detail
    unknown = decide(_incident("crash", causes=LOST, hosts_={}), policy, History(1.0))
    assert "host of rank 5 is not known" in next(p for p in unknown if p.action == DRAIN_NODE).detail


def test_rate_limits_per_job_per_host_and_fleet() -> None:
    policy = _policy(ACTING + "limits: {per_job: {max: 2, window_s: 600}, per_host: {max: 1, window_s: 3600}, "
                              "fleet: {max: 3, window_s: 3600}}\n")
    crash = _incident("crash", causes=LOST)
    recent = (Recent(50.0, "llama", ABORT_JOB), Recent(60.0, "llama", ABORT_JOB))
    by = {p.action: p for p in decide(crash, policy, History(100.0, recent=recent))}
    assert by[ABORT_JOB].result == RATE_LIMITED and "per_job" in by[ABORT_JOB].detail
    assert by[DRAIN_NODE].result == OWED
    # the window passed: allowed again; a run of the same job counts as the job
    assert {p.result for p in decide(crash, policy, History(700.0, recent=recent))} == {OWED}
    by = {p.action: p for p in decide({**crash, "job": "llama#run2"}, policy, History(100.0, recent=recent))}
    assert by[ABORT_JOB].result == RATE_LIMITED
    by = {p.action: p for p in decide(crash, policy, History(100.0, recent=(Recent(90.0, "other", DRAIN_NODE,
                                                                                   "node5"),)))}
    assert by[DRAIN_NODE].result == RATE_LIMITED and "per_host" in by[DRAIN_NODE].detail
    fleet = tuple(Recent(90.0, f"j{i}", DRAIN_NODE, f"n{i}") for i in range(3))
    by = {p.action: p for p in decide(crash, policy, History(100.0, recent=fleet))}
    assert by[DRAIN_NODE].result == RATE_LIMITED and "fleet" in by[DRAIN_NODE].detail


def test_cause_line_is_one_bounded_line() -> None:
    line = cause_line(_incident(causes=[(2, "not_entered", {"text": "x\n" * 500})]), limit=120)
    assert "\n" not in line and len(line) <= 120 and line.endswith("; incident inc1")


def test_hosts_fold_suspects_expire_and_slurm_list() -> None:
    day = hosts.DAY_S
    now = 100 * day
    cfg = hosts.SuspectConfig(min_incidents=2, window_s=7 * day)

    def row(i: int, host: str, at: float, cause: str = "process_lost", **kw: Any) -> hosts.HostIncident:
        return hosts.HostIncident(f"i{i}", host, kw.get("job", f"job{i}"), kw.get("kind", "crash"), cause,
                                  kw.get("severity", "critical"), at, kw.get("consequence", False))

    rows = [row(1, "lemon", now - 1 * day), row(2, "lemon", now - 3 * day),
            row(3, "once", now - 1 * day),
            row(4, "code", now - day, "mismatch", kind="mismatch"), row(5, "code", now - day, "deadlock"),
            row(6, "after", now - day, consequence=True), row(7, "after", now - day, consequence=True),
            row(8, "pause", now - day, "not_entered", severity="info"), row(9, "pause", now - day, "not_entered",
                                                                             severity="info"),
            row(10, "old", now - 20 * day), row(11, "old", now - 21 * day)]
    seen = [hosts.HostSeen("healthy", "job1", now - 5 * day, now - 60), hosts.HostSeen("lemon", "job9", now - 9 * day,
                                                                                        now - 30)]
    acts = [hosts.HostAction("lemon", DRAIN_NODE, "act", "done", now - day, "i1")]
    records = hosts.fold(seen, rows, acts, now, cfg)
    by = {r.host: r for r in records}
    assert records[0].host == "lemon" and by["lemon"].suspect
    assert by["lemon"].suspect_until == pytest.approx(now - 3 * day + 7 * day)  # the 2nd latest leaves the window
    assert not any(by[h].suspect for h in ("once", "code", "after", "pause", "old", "healthy"))
    assert by["after"].incidents == 0 and by["pause"].incidents == 0 and by["code"].incidents == 2
    assert by["lemon"].jobs == {"job1", "job2", "job9"} and by["lemon"].first_seen == now - 9 * day
    assert by["lemon"].daily[1] == 1 and by["lemon"].daily[3] == 1
    doc = by["lemon"].to_dict(now)
    assert doc["actions"][0]["action"] == DRAIN_NODE and doc["by_kind"] == {"crash": 2} and doc["suspect"]
    assert hosts.slurm_exclude(records) == "lemon"
    later = {r.host: r for r in hosts.fold(seen, rows, acts, now + 5 * day, cfg)}
    assert not later["lemon"].suspect  # expired


def test_host_rows_of_an_incident() -> None:
    inc = {**_incident("crash", causes=[*LOST, (6, "process_lost", {})], hosts_={"5": "n1", "6": "n1"}),
           "detected_at_unix": 7.0, "critical_at_unix": 7.0}
    (only,) = hosts.host_rows(inc)
    assert (only.host, only.cause_kind, only.severity, only.at, only.consequence) == ("n1", "process_lost",
                                                                                      "critical", 7.0, False)
