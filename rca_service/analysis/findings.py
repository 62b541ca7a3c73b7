"""What the analysis says about a job: plain data, serialisable to the API's JSON."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

log = logging.getLogger("mycroft.rca.findings")

# incident kinds (what is wrong with the job)
HANG = "hang"
CRASH = "crash"
SLOWDOWN = "slowdown"
MISMATCH = "mismatch"
DEADLOCK = "deadlock"
STALL = "stall"

# a hang finding's evidence: the ops next to its sinks (a later hang in other ops only is another
# incident: the job moved on in between)
EVIDENCE_WAITED_OPS = "waited_ops"

# root-cause kinds (what is wrong with a rank or a link)
RC_NOT_ENTERED = "not_entered"  # alive, outside communication, others wait for it
RC_NOT_ARRIVED = "not_arrived"  # never reached init_process_group while the others wait in rendezvous
RC_NODE_NOT_ARRIVED = "node_not_arrived"  # a node whose launcher agent never joined the node rendezvous
RC_PROCESS_LOST = "process_lost"  # silent: killed, frozen or unreachable
RC_PROCESS_EXITED = "process_exited"  # said goodbye (final heartbeat) while others wait for it
RC_STRAGGLER = "straggler"  # arrives last again and again
RC_MISMATCH = "mismatch"  # issued a different op / size / dtype at the same seq
RC_DEADLOCK = "deadlock"  # member of a wait-for cycle
RC_LINK = "link"  # everyone issued, the data does not move: network / transport
RC_COMMUNICATION = "communication"  # ops slower with normal arrival skew

# how bad: what an operator should do about it (docs/rca.md, "Severities")
INFO = "info"  # worth seeing in the API, not worth a page: a normal pause, a mild imbalance
WARNING = "warning"  # the job is slower than it should be, or the evidence is still incomplete
CRITICAL = "critical"  # the job is stuck or broken: page someone
SEVERITY_ORDER = {INFO: 0, WARNING: 1, CRITICAL: 2}

# the default severity of each incident kind (the verdict may lower or raise it, saying why)
SEVERITY = {HANG: CRITICAL, CRASH: CRITICAL, DEADLOCK: CRITICAL, MISMATCH: CRITICAL,
            STALL: WARNING, SLOWDOWN: WARNING}


def at_least(severity: str, floor: str) -> bool:
    return SEVERITY_ORDER.get(severity, 1) >= SEVERITY_ORDER.get(floor, 2)


@dataclass(slots=True)
class RootCause:
    rank: int | None
    kind: str
    evidence: dict[str, Any] = field(default_factory=dict)  # "text" plus structured fields

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class Finding:
    """One anomaly of one job as of one analysis pass."""

    job: str
    kind: str
    summary: str
    root_causes: list[RootCause] = field(default_factory=list)
    graph: dict[str, Any] = field(default_factory=dict)  # wait-for graph summary
    evidence: dict[str, Any] = field(default_factory=dict)
    severity: str = ""  # "" = the kind's default (SEVERITY)
    severity_reason: str = ""  # why this severity, in words (a pause within budget, evidence pending, ...)
    # the incident page's drawing (graph_view.py), made only when an incident stores the finding:
    # most passes re-find a known condition and need no drawing
    draw: Callable[[], dict[str, Any]] | None = field(default=None, repr=False, compare=False)

    def drawing(self) -> dict[str, Any]:
        """The drawing, or {} (a drawing that fails must never cost the verdict)."""
        if self.draw is None:
            return {}
        try:
            return self.draw()
        except Exception:
            log.exception("drawing the %s finding of job %s failed", self.kind, self.job)
            return {}

    def __post_init__(self) -> None:
        if not self.severity:
            self.severity = SEVERITY.get(self.kind, WARNING)

    @property
    def key(self) -> str:
        """Identity of the condition for dedup: one firing incident per job and kind."""
        return f"{self.job}/{self.kind}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "kind": self.kind,
            "summary": self.summary,
            "root_causes": [rc.to_dict() for rc in self.root_causes],
            "graph": self.graph,
            "evidence": self.evidence,
            "severity": self.severity,
            "severity_reason": self.severity_reason,
        }


def cause_who(cause: Mapping[str, Any]) -> str:
    """Who a root cause (as the API serves it) names: a rank; a node that never joined a multi-node
    launch (by host or index); else the link, when it names no rank."""
    if cause.get("rank") is not None:
        return f"rank {cause['rank']}"
    if cause.get("kind") == RC_NODE_NOT_ARRIVED:
        evidence = cause.get("evidence") or {}
        node = evidence.get("node")
        return f"node {evidence.get('host') or (node if isinstance(node, int) and node >= 0 else '?')}"
    return "link / transport"
