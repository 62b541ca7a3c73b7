"""What the analysis says about a job: plain data, serialisable to the API's JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# incident kinds (what is wrong with the job)
HANG = "hang"
CRASH = "crash"
SLOWDOWN = "slowdown"
MISMATCH = "mismatch"
DEADLOCK = "deadlock"
STALL = "stall"

# root-cause kinds (what is wrong with a rank or a link)
RC_NOT_ENTERED = "not_entered"  # alive, outside communication, others wait for it
RC_PROCESS_LOST = "process_lost"  # silent: killed, frozen or unreachable
RC_PROCESS_EXITED = "process_exited"  # said goodbye (final heartbeat) while others wait for it
RC_STRAGGLER = "straggler"  # arrives last again and again
RC_MISMATCH = "mismatch"  # issued a different op / size / dtype at the same seq
RC_DEADLOCK = "deadlock"  # member of a wait-for cycle
RC_LINK = "link"  # everyone issued, the data does not move: network / transport
RC_COMMUNICATION = "communication"  # ops slower with normal arrival skew

# how bad, for alert labels
SEVERITY = {HANG: "critical", CRASH: "critical", DEADLOCK: "critical", MISMATCH: "critical",
            STALL: "warning", SLOWDOWN: "warning"}


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
        }
