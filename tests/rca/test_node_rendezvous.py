"""A multi-node launch whose node never comes: the other nodes' launcher agents report (agent spans)
and the RCA names the absent node -- by index (static rendezvous), by host (the job's host list),
else by count -- after node_rendezvous_min_s, critical after its budget; quiet once enough nodes
are there or the ranks run; hostile agent spans are refused and counted."""

from __future__ import annotations

from mycroft.rca_service.analysis.verdict import analyze_job
from mycroft.rca_service.config import AnalysisConfig
from mycroft.rca_service.ingest import admission
from mycroft.rca_service.ingest.state import JobState, apply_records

from mycroft import schema
from mycroft.faults.made_up_job import heartbeat
from mycroft.otlp import SpanRecord

CFG = AnalysisConfig()


def _agent(host: str, pid: int, at: float, waited_s: float, nodes: tuple[int, int] = (2, 2), joined: int = -1,
           joined_hosts: tuple[str, ...] = (), expected: tuple[str, ...] = (), node_rank: int = -1,
           backend: str = "c10d", final: bool = False) -> SpanRecord:
    attributes: dict[str, object] = {
        schema.ATTR_SPAN_KIND: schema.KIND_AGENT, schema.ATTR_HB_COUNTER: 1, schema.ATTR_HB_INTERVAL_S: 0.5,
        schema.ATTR_HB_PHASE: schema.PHASE_NODE_RENDEZVOUS, schema.ATTR_HB_PHASE_S: waited_s,
        schema.ATTR_AGENT_RDZV_BACKEND: backend, schema.ATTR_AGENT_NODES_MIN: nodes[0],
        schema.ATTR_AGENT_NODES_MAX: nodes[1], schema.ATTR_AGENT_NODES_JOINED: joined,
        schema.ATTR_AGENT_JOINED_HOSTS: list(joined_hosts)}
    if expected:
        attributes[schema.ATTR_AGENT_EXPECTED_HOSTS] = list(expected)
    if final:
        attributes[schema.ATTR_HB_FINAL] = True
    resource: dict[str, object] = {schema.RES_JOB_ID: "job", schema.RES_HOST_NAME: host, schema.RES_PROCESS_PID: pid}
    if node_rank >= 0:
        resource[schema.RES_NODE_RANK] = node_rank
    return SpanRecord(trace_id=pid, span_id=pid, name=schema.SPAN_AGENT, start_ns=int(at * 1e9) - 1,
                      end_ns=int(at * 1e9), attributes=attributes, resource=resource)  # type: ignore[arg-type]


def _job(at: float, *records: SpanRecord) -> JobState:
    jobs: dict[str, JobState] = {}
    assert apply_records(jobs, records, at, CFG) == len(records)
    return jobs["job"]


def _found(job: JobState, now: float) -> list:
    return [f for f in analyze_job(job, now, CFG) if f.evidence.get("phase") == schema.PHASE_NODE_RENDEZVOUS]


def test_static_names_the_absent_nodes_by_index_and_host() -> None:
    t = 100.0
    hosts = ("trn01", "trn02", "trn03", "trn04")
    job = _job(t, *(_agent(h, 10 + n, t, 4.0, (4, 4), node_rank=n, expected=hosts, backend="static")
                    for n, h in enumerate(hosts) if n != 2))
    assert not _found(job, t + 0.5)  # 4.5 s: nodes start seconds apart
    (finding,) = _found(job, t + 1.2)
    assert [(c.rank, c.kind, c.evidence["node"], c.evidence["host"]) for c in finding.root_causes] == \
        [(None, "node_not_arrived", 2, "trn03")]
    assert finding.kind == "hang" and finding.severity == "warning"
    assert "3 of 4 nodes" in finding.root_causes[0].evidence["text"]


def test_c10d_names_the_hosts_that_have_not_joined_else_counts_them() -> None:
    t = 100.0
    expected = ("gpu01.cluster", "gpu02.cluster", "gpu03.cluster")
    # the agents' own hosts are short names, the rendezvous' FQDNs: matched by the short name
    job = _job(t, _agent("gpu01", 11, t, 6.0, (3, 3), 1, ("gpu01.cluster",), expected),
               _agent("gpu03", 12, t, 6.0, (3, 3), 2, ("gpu01.cluster", "gpu03.cluster"), expected))
    (finding,) = _found(job, t)
    assert [(c.evidence["node"], c.evidence["host"]) for c in finding.root_causes] == [(-1, "gpu02.cluster")]
    counted = _job(t, _agent("a", 11, t, 6.0, (4, 4), 2, ("a", "b")))  # no host list: two nodes unknown
    (finding,) = _found(counted, t)
    assert [(c.evidence["node"], c.evidence["host"]) for c in finding.root_causes] == [(-1, "")] * 2
    assert finding.evidence["nodes_present"] == 2 and finding.evidence["nodes_min"] == 4


def test_critical_after_the_budget_and_quiet_once_enough_nodes_or_ranks_run() -> None:
    t = 100.0
    (late,) = _found(_job(t, _agent("a", 1, t, CFG.node_rendezvous_budget_s + 1.0)), t)
    assert late.severity == "critical"
    # elastic --nnodes 2:4 with 2 there: the round waits for more up to its last call, no hang
    assert not _found(_job(t, _agent("a", 1, t, 60.0, (2, 4), 2, ("a", "b")),
                           _agent("b", 2, t, 60.0, (2, 4), 2, ("a", "b"))), t)
    # the agent said the rendezvous returned, or it went silent (its node's story is the ranks')
    assert not _found(_job(t, _agent("a", 1, t, 60.0, final=True)), t)
    assert not _found(_job(t, _agent("a", 1, t, 60.0)), t + 10.0)
    # ranks heartbeat: the rendezvous completed somewhere
    job = _job(t, _agent("a", 1, t, 60.0), heartbeat("job", 0, 4, t, 1, [], [], [], interval=0.5))
    assert not _found(job, t)


def test_hostile_agent_spans_are_refused_and_counted() -> None:
    jobs: dict[str, JobState] = {}
    bad = [_agent("", 1, 1.0, 1.0), _agent("a", 1, 1.0, 1.0, (10**9, 10**9)), _agent("a", 1, 1.0, 1.0, (-1, 2))]
    rejected: dict[str, int] = {}
    assert apply_records(jobs, bad, 1.0, CFG, rejected=rejected) == 0
    assert rejected == {admission.REJECT_BAD_AGENT: 3}
    odd = _agent("a", 1, 1.0, 1.0, joined=10**12, joined_hosts=tuple(str(i) for i in range(10_000)))
    odd.attributes[schema.ATTR_AGENT_EXPECTED_HOSTS] = [1, None, "x" * 10_000]
    job = _job(1.0, odd)
    (agent,) = job.agents.values()
    assert agent.joined == CFG.max_ranks_per_job and len(agent.joined_hosts) == 4096
    assert agent.expected_hosts == ("x" * 255,)
