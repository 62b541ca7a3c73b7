"""The action policy of `mycroft rca serve --actions FILE`: which verdicts Mycroft acts on, and how.

    mode: observe                 # observe (default): record what would be done; act: do it
    rules:
      - kinds: [hang, crash, deadlock, mismatch]
        min_severity: critical
        do: [abort_job, drain_node]

`parse_policy` validates the YAML and names the key that is wrong; `decide` is pure: an
incident, the policy, what was already recorded (History) and the job's scheduler facts in,
the actions to record out. A wrong drain costs more than none, so by default a rule fires only
on a *trusted* verdict (`trusted`): critical, not a consequence of an earlier incident, not a
pause, and every root cause convicted on direct evidence. Node actions further need a root
cause that implicates the node (a lost process, a link named by its flow counters) on at most
`max_hosts` hosts. docs/actions.md is the reference.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from mycroft.auth import RUN_SEPARATOR

from ..analysis.findings import (
    CRASH,
    CRITICAL,
    DEADLOCK,
    HANG,
    MISMATCH,
    RC_DEADLOCK,
    RC_LINK,
    RC_MISMATCH,
    RC_NOT_ENTERED,
    RC_PROCESS_EXITED,
    RC_PROCESS_LOST,
    SEVERITY,
    SEVERITY_ORDER,
    at_least,
    cause_who,
)
from ..analysis.triggers import UNSEEN
from .hosts import SuspectConfig

# actions
ABORT_JOB = "abort_job"
DRAIN_NODE = "drain_node"
CORDON_NODE = "cordon_node"
EXEC = "exec"
ACTIONS = (ABORT_JOB, DRAIN_NODE, CORDON_NODE, EXEC)
NODE_ACTIONS = frozenset({DRAIN_NODE, CORDON_NODE})

# modes
OBSERVE = "observe"
ACT = "act"

# results of an action (its audit record)
OWED = "owed"  # decided in act mode, not run yet (durable: runs after a restart)
RUNNING = "running"  # started; a restart re-runs the idempotent ones, an exec is then INTERRUPTED
DONE = "done"
FAILED = "failed"
OBSERVED = "observed"  # observe mode: what would have been done, recorded, nothing done
RATE_LIMITED = "rate_limited"
SKIPPED = "skipped"  # the rule matched, the action does not apply (no node implicated, host unknown, ...)
CANCELLED = "cancelled"  # its incident resolved before its delay ran out
INTERRUPTED = "interrupted"  # an exec the service died in: not run twice
UNDELIVERABLE = "undeliverable"  # an abort no rank acknowledged: nobody polls (a collector in front), or none acked
PUBLISHED = "published"  # an abort directive out, waiting for a rank's acknowledgment (then DONE or UNDELIVERABLE)
#: results that count against the rate limits (what was or will be done, or would have been)
COUNTED = frozenset({OWED, RUNNING, PUBLISHED, DONE, FAILED, OBSERVED, INTERRUPTED, UNDELIVERABLE})

# incident kinds a verdict on direct evidence can have (slowdown / stall are statistical)
TRUSTABLE_KINDS = frozenset({HANG, CRASH, DEADLOCK, MISMATCH})
# root causes convicted on what the ranks said, not on what they did not say
DIRECT_CAUSES = frozenset({RC_NOT_ENTERED, RC_PROCESS_LOST, RC_PROCESS_EXITED, RC_DEADLOCK, RC_MISMATCH, RC_LINK})
# root causes that say something about the node rather than the program
NODE_CAUSES = (RC_PROCESS_LOST, RC_LINK)
KNOWN_CAUSES = frozenset({*DIRECT_CAUSES, "straggler", "communication"})

DEFAULT_EXIT_CODE = 75  # sysexits EX_TEMPFAIL: the job failed on something a relaunch may not meet
MAX_EXEC_TIMEOUT_S = 600.0


class PolicyError(ValueError):
    """The action policy is unreadable or malformed; the message names the key."""


@dataclass(frozen=True, slots=True)
class Limit:
    max: int
    window_s: float


@dataclass(frozen=True, slots=True)
class ActionSpec:
    name: str
    exit_code: int = DEFAULT_EXIT_CODE  # abort_job: what the ranks exit with
    ttl_s: float = 600.0  # abort_job: the directive is served this long (a later launch is not aborted)
    requeue: bool = False  # drain_node: also `scontrol requeue <SLURM job>`
    cancel: bool = False  # drain_node: also `scancel <SLURM job>`
    max_hosts: int = 1  # node actions: more root-cause hosts than this is the network's or the job's doing
    causes: tuple[str, ...] = NODE_CAUSES  # node actions: root-cause kinds that implicate the node
    argv: tuple[str, ...] = ()  # exec
    timeout_s: float = 30.0  # exec


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    kinds: frozenset[str]
    do: tuple[ActionSpec, ...]
    min_severity: str = CRITICAL
    trusted_only: bool = True
    observe_only: bool = False  # `mode: observe` on the rule: observes even when the policy acts
    delay_s: float = 0.0  # act this long after the verdict; cancelled if the incident resolves meanwhile


@dataclass(frozen=True, slots=True)
class SlurmConfig:
    scontrol: str = "scontrol"
    scancel: str = "scancel"
    squeue: str = "squeue"  # a kill after an abort also waits for the job's task steps to end
    timeout_s: float = 10.0
    # a requeue / cancel after an abort of the same incident waits until the job's live ranks have
    # left (final heartbeat or silent, then the job's task steps ended: squeue), at most this long
    # after the abort was published: delivery
    # to the host's poller (< 2 s, a frozen poller's successor included), the rank's next tick, its
    # final heartbeat (<= 1 s), the wait for its host's ranks (<= 3 s, HOST_GATHER_S) and the process
    # groups' abort (<= 1 s) take ~7 s at most; the rest is a loaded node's slack
    kill_after_abort_s: float = 10.0


@dataclass(frozen=True, slots=True)
class KubeConfig:
    api_server: str
    token_file: str = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    ca_file: str | None = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    timeout_s: float = 10.0


@dataclass(frozen=True, slots=True)
class Policy:
    mode: str = OBSERVE
    rules: tuple[Rule, ...] = ()
    per_job: Limit = Limit(3, 3600.0)  # of each action per job
    per_host: Limit = Limit(1, 3600.0)  # of each node action per host
    fleet: Limit = Limit(10, 3600.0)  # node actions across the fleet: a bug must not drain the cluster
    slurm: SlurmConfig = SlurmConfig()
    kubernetes: KubeConfig | None = None
    suspects: SuspectConfig = field(default_factory=SuspectConfig)

    @property
    def longest_window_s(self) -> float:
        return max(self.per_job.window_s, self.per_host.window_s, self.fleet.window_s)


# ------------------------------------------------------------------ parsing
def _mapping(value: Any, where: str, allowed: Iterable[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise PolicyError(f"{where}: expected a mapping")
    unknown = sorted(set(map(str, value)) - set(allowed))
    if unknown:
        raise PolicyError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(allowed))})")
    return value


def _number(value: Any, where: str, lo: float, hi: float, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
        raise PolicyError(f"{where}: expected {'an integer' if integer else 'a number'}, got {value!r}")
    if not lo <= value <= hi:
        raise PolicyError(f"{where}: {value!r} is outside {lo:g}..{hi:g}")
    return float(value)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise PolicyError(f"{where}: expected true or false, got {value!r}")
    return value


def _strings(value: Any, where: str, choices: Iterable[str] | None = None) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise PolicyError(f"{where}: expected a non-empty list of strings")
    if choices is not None:
        known = set(choices)
        for v in value:
            if v not in known:
                raise PolicyError(f"{where}: unknown value {v!r} (known: {', '.join(sorted(known))})")
    return tuple(value)


_OPTIONS = {ABORT_JOB: ("exit_code", "ttl_s"), DRAIN_NODE: ("requeue", "cancel", "max_hosts", "causes"),
            CORDON_NODE: ("max_hosts", "causes"), EXEC: ("argv", "timeout_s")}


def _action(item: Any, where: str) -> ActionSpec:
    options: Any
    if isinstance(item, str):
        name, options = item, {}
    elif isinstance(item, Mapping) and len(item) == 1:
        name, options = next(iter(item.items()))
        options = {} if options is None else options
    else:
        raise PolicyError(f"{where}: expected an action name or {{name: {{options}}}}")
    if name not in _OPTIONS:
        raise PolicyError(f"{where}: unknown action {name!r} (known: {', '.join(ACTIONS)})")
    opts = _mapping(options, f"{where}.{name}", _OPTIONS[name])
    spec = ActionSpec(str(name))
    if "exit_code" in opts:
        spec = replace(spec, exit_code=int(_number(opts["exit_code"], f"{where}.exit_code", 1, 255, integer=True)))
    if "ttl_s" in opts:
        spec = replace(spec, ttl_s=_number(opts["ttl_s"], f"{where}.ttl_s", 1, 7 * 86400))
    if "requeue" in opts:
        spec = replace(spec, requeue=_bool(opts["requeue"], f"{where}.requeue"))
    if "cancel" in opts:
        spec = replace(spec, cancel=_bool(opts["cancel"], f"{where}.cancel"))
    if spec.requeue and spec.cancel:
        raise PolicyError(f"{where}: requeue and cancel exclude each other")
    if "max_hosts" in opts:
        spec = replace(spec, max_hosts=int(_number(opts["max_hosts"], f"{where}.max_hosts", 1, 64, integer=True)))
    if "causes" in opts:
        spec = replace(spec, causes=_strings(opts["causes"], f"{where}.causes", KNOWN_CAUSES))
    if name == EXEC:
        if "argv" not in opts:
            raise PolicyError(f"{where}: exec needs argv: [command, arg, ...]")
        spec = replace(spec, argv=_strings(opts["argv"], f"{where}.argv"))
        if "timeout_s" in opts:
            spec = replace(spec, timeout_s=_number(opts["timeout_s"], f"{where}.timeout_s", 0.1, MAX_EXEC_TIMEOUT_S))
    return spec


def _rule(item: Any, i: int, source: str) -> Rule:
    where = f"{source}: rules[{i}]"
    m = _mapping(item, where, ("name", "kinds", "min_severity", "trusted_only", "mode", "delay_s", "do"))
    for key in ("kinds", "do"):
        if key not in m:
            raise PolicyError(f"{where}: missing {key!r}")
    kinds = frozenset(_strings(m["kinds"], f"{where}.kinds", SEVERITY))
    severity = m.get("min_severity", CRITICAL)
    if severity not in SEVERITY_ORDER:
        raise PolicyError(f"{where}.min_severity: {severity!r} is not one of {', '.join(SEVERITY_ORDER)}")
    mode = m.get("mode", ACT)
    if mode not in (OBSERVE, ACT):
        raise PolicyError(f"{where}.mode: {mode!r} is not observe or act")
    if not isinstance(m["do"], list) or not m["do"]:
        raise PolicyError(f"{where}.do: expected a non-empty list of actions")
    do = tuple(_action(a, f"{where}.do[{j}]") for j, a in enumerate(m["do"]))
    names = [a.name for a in do]
    if len(set(names)) != len(names):
        raise PolicyError(f"{where}.do: an action is listed twice")
    return Rule(name=str(m.get("name") or f"rules[{i}]"), kinds=kinds, do=do, min_severity=str(severity),
                trusted_only=_bool(m.get("trusted_only", True), f"{where}.trusted_only"),
                observe_only=mode == OBSERVE,
                delay_s=_number(m.get("delay_s", 0.0), f"{where}.delay_s", 0, 86400))


def _limit(value: Any, where: str, default: Limit) -> Limit:
    m = _mapping(value, where, ("max", "window_s"))
    return Limit(int(_number(m.get("max", default.max), f"{where}.max", 0, 1_000_000, integer=True)),
                 _number(m.get("window_s", default.window_s), f"{where}.window_s", 1, 30 * 86400))


def parse_policy(document: Any, source: str = "actions policy") -> Policy:
    """The policy of a parsed YAML document (None / empty: observe, no rules)."""
    if document is None:
        return Policy()
    m = _mapping(document, source, ("mode", "rules", "limits", "slurm", "kubernetes", "suspects"))
    mode = m.get("mode", OBSERVE)
    if mode not in (OBSERVE, ACT):
        raise PolicyError(f"{source}: mode: {mode!r} is not observe or act")
    rules_doc = m.get("rules", [])
    if not isinstance(rules_doc, list):
        raise PolicyError(f"{source}: rules: expected a list")
    rules = tuple(_rule(r, i, source) for i, r in enumerate(rules_doc))
    policy = Policy(mode=str(mode), rules=rules)
    limits = _mapping(m.get("limits") or {}, f"{source}: limits", ("per_job", "per_host", "fleet"))
    policy = replace(
        policy, per_job=_limit(limits.get("per_job") or {}, f"{source}: limits.per_job", policy.per_job),
        per_host=_limit(limits.get("per_host") or {}, f"{source}: limits.per_host", policy.per_host),
        fleet=_limit(limits.get("fleet") or {}, f"{source}: limits.fleet", policy.fleet))
    if "slurm" in m:
        s = _mapping(m["slurm"], f"{source}: slurm", ("scontrol", "scancel", "squeue", "timeout_s",
                                                          "kill_after_abort_s"))
        policy = replace(policy, slurm=SlurmConfig(
            str(s.get("scontrol", "scontrol")), str(s.get("scancel", "scancel")), str(s.get("squeue", "squeue")),
            _number(s.get("timeout_s", 10.0), f"{source}: slurm.timeout_s", 0.1, 300),
            _number(s.get("kill_after_abort_s", 10.0), f"{source}: slurm.kill_after_abort_s", 0, 600)))
    if "kubernetes" in m:
        k = _mapping(m["kubernetes"], f"{source}: kubernetes", ("api_server", "token_file", "ca_file", "timeout_s"))
        server = k.get("api_server")
        if not isinstance(server, str) or not server.startswith(("https://", "http://")):
            raise PolicyError(f"{source}: kubernetes.api_server: expected an http(s):// URL")
        default = KubeConfig(server)
        ca = k.get("ca_file", default.ca_file)
        policy = replace(policy, kubernetes=KubeConfig(
            server, str(k.get("token_file", default.token_file)), None if ca in (None, "") else str(ca),
            _number(k.get("timeout_s", 10.0), f"{source}: kubernetes.timeout_s", 0.1, 300)))
    if any(a.name == CORDON_NODE for r in rules for a in r.do) and policy.kubernetes is None:
        raise PolicyError(f"{source}: cordon_node needs a kubernetes: {{api_server: ...}} section")
    if "suspects" in m:
        s = _mapping(m["suspects"], f"{source}: suspects", ("min_incidents", "window_s", "cause_kinds"))
        base = SuspectConfig()
        policy = replace(policy, suspects=SuspectConfig(
            int(_number(s.get("min_incidents", base.min_incidents), f"{source}: suspects.min_incidents", 0, 10_000,
                        integer=True)),
            _number(s.get("window_s", base.window_s), f"{source}: suspects.window_s", 60, 365 * 86400),
            _strings(s.get("cause_kinds", list(base.cause_kinds)), f"{source}: suspects.cause_kinds", KNOWN_CAUSES)))
    return policy


def load_policy(path: str) -> Policy:
    """Read and validate the file; also checks what can be checked before an incident needs it
    (exec commands exist, the Kubernetes token is readable)."""
    try:
        with open(path, encoding="utf-8") as f:
            document = yaml.safe_load(f)
    except OSError as exc:
        raise PolicyError(f"actions policy {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise PolicyError(f"actions policy {path}: not YAML: {exc}") from exc
    policy = parse_policy(document, f"actions policy {path}")
    for rule in policy.rules:
        for spec in rule.do:
            if spec.name == EXEC and shutil.which(spec.argv[0]) is None:
                raise PolicyError(f"actions policy {path}: rule {rule.name}: exec command {spec.argv[0]!r} "
                                  "is not an executable file (nor on PATH)")
    if policy.kubernetes is not None and not os.access(policy.kubernetes.token_file, os.R_OK):
        raise PolicyError(f"actions policy {path}: kubernetes.token_file {policy.kubernetes.token_file!r} "
                          "is not readable")
    return policy


# ------------------------------------------------------------------ deciding
@dataclass(frozen=True, slots=True)
class Recent:
    """An action that counts against the rate limits."""

    at: float
    job: str  # the job id (a second run's "JOB#RUN" counts as JOB)
    action: str
    host: str = ""  # node actions


@dataclass(frozen=True, slots=True)
class History:
    """What the store says, as of `now`: this incident's recorded (action, target) pairs, and the
    counted actions of the last `Policy.longest_window_s` (every job and host)."""

    now: float
    recorded: frozenset[tuple[str, str]] = frozenset()
    recent: tuple[Recent, ...] = ()


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What the job's live state says about where it runs (read when the verdict is made)."""

    run: str = ""  # mycroft.run.id of the incident's run
    slurm_job_id: str = ""
    kube_nodes: Mapping[str, str] = field(default_factory=dict)  # host -> Kubernetes node


@dataclass(frozen=True, slots=True)
class PlannedAction:
    incident: str
    job: str
    action: str
    target: str  # the job (abort_job, exec) or the host / node (drain_node, cordon_node)
    host: str  # node actions: the host (rate limits, fleet memory); "" otherwise
    mode: str
    rule: str
    result: str  # OWED | OBSERVED | RATE_LIMITED | SKIPPED
    detail: str
    params: dict[str, Any]
    decided_at: float
    due_at: float


def base_job(job: str) -> str:
    return job.split(RUN_SEPARATOR, 1)[0]


def paused(incident: Mapping[str, Any]) -> bool:
    """A healthy pause (a checkpoint within budget), or a hang not known to be one yet: a hang
    below critical is a pause, a holder whose stack is on its way, or one gone quiet inside an
    expected phase (docs/rca.md, Severities). Never acted on."""
    if (incident.get("evidence") or {}).get("pause"):
        return True
    return incident.get("kind") == HANG and incident.get("severity") != CRITICAL


def untrusted_because(incident: Mapping[str, Any]) -> str | None:
    """Why a verdict is not trusted enough to act on (None: it is). Trusted: critical; a hang,
    crash, deadlock or mismatch (slowdowns and stalls are inferred from rates); every root cause
    convicted on what the ranks reported: alive and outside the op every peer waits in (the
    heartbeat is fresher than the wait), silent while its peers hang on it (a process seen alive
    before), said goodbye, in a wait-for cycle, diverged in its op signature, or a link the native
    flow counters localise to a rank. A stall no counter localises, a rank that never reported
    (nothing tells it from one the launcher killed) are not."""
    if incident.get("severity") != CRITICAL:
        return f"severity {incident.get('severity')} (trusted: critical)"
    kind = incident.get("kind")
    if kind not in TRUSTABLE_KINDS:
        return f"a {kind} is inferred from rates, not seen directly"
    causes = incident.get("root_causes") or []
    if not causes:
        return "no root cause named"
    for cause in causes:
        ev = cause.get("evidence") or {}
        ck = cause.get("kind")
        if ck not in DIRECT_CAUSES:
            return f"root cause {ck} is not direct evidence"
        if ck == RC_LINK and (cause.get("rank") is None or not ev.get("flow_state")):
            return "a data stall without flow counters: the link is inferred, not localised"
        if ck == RC_PROCESS_LOST and ev.get("status") == UNSEEN:
            return f"rank {cause.get('rank')} never reported: nothing tells it from one the launcher killed"
    return None


def cause_line(incident: Mapping[str, Any], limit: int = 240) -> str:
    """One line naming the root cause: what a rank prints when it aborts, what a drain says."""
    causes = incident.get("root_causes") or []
    if not causes:
        text = f"{incident.get('kind')}: {incident.get('summary', '')}"
    else:
        top = causes[0]
        who = cause_who(top)
        more = f" (+{len(causes) - 1} more)" if len(causes) > 1 else ""
        text = f"{who} ({top.get('kind')}){more} in a {incident.get('kind')}: " \
               f"{(top.get('evidence') or {}).get('text', '')}"
    text = " ".join(str(text).split())  # one line, whatever the evidence held
    tail = f"; incident {incident.get('id')}"
    return (text if len(text) + len(tail) <= limit else text[: limit - len(tail) - 1] + "\u2026") + tail


def slurm_reason(incident: Mapping[str, Any], limit: int = 200) -> str:
    """The drain reason SLURM shows: what fits `sinfo -R`'s default 20-character column first
    ("mycroft hang: rank 2 not_entered ..."), printable ASCII only (SLURM shows other bytes as '?'),
    the incident id once, at the end, cut to `limit` with "..." before it. The whole text is the
    incident's (its root cause's evidence)."""
    causes = incident.get("root_causes") or []
    head = f"mycroft {incident.get('kind')}:"
    if causes:
        top = causes[0]
        more = f" (+{len(causes) - 1} more)" if len(causes) > 1 else ""
        text = f"{head} {cause_who(top)} {top.get('kind')}{more}: {(top.get('evidence') or {}).get('text', '')}"
    else:
        text = f"{head} {incident.get('summary', '')}"
    text = " ".join(_ascii(text).split())
    tail = f"; incident {incident.get('id')}"
    if len(text) + len(tail) > limit:
        text = text[: max(0, limit - len(tail) - 3)].rstrip() + "..."
    return text + tail


def _ascii(text: str) -> str:
    """Printable ASCII: an ellipsis as '...', a double quote as a single one, anything else dropped."""
    text = str(text).replace("\u2026", "...").replace('"', "'")
    return "".join(ch if " " <= ch <= "~" else " " if ch in "\t\r\n" else "" for ch in text)


def _node_targets(spec: ActionSpec, incident: Mapping[str, Any]) -> tuple[list[str], str]:
    """The hosts a node action applies to, or ([], why not)."""
    causes = [c for c in incident.get("root_causes") or [] if c.get("kind") in spec.causes
              and not (c.get("kind") == RC_LINK and c.get("rank") is None)]
    if not causes:
        kinds = sorted({str(c.get("kind")) for c in incident.get("root_causes") or []})
        return [], (f"root cause {', '.join(kinds) or 'none'} does not implicate a node "
                    f"(acts on {', '.join(spec.causes)})")
    known: Mapping[str, str] = incident.get("root_cause_hosts") or {}
    hosts: list[str] = []
    for cause in causes:
        host = known.get(str(cause.get("rank")))
        if not host:
            return [], f"the host of rank {cause.get('rank')} is not known"
        if host not in hosts:
            hosts.append(host)
    if len(hosts) > spec.max_hosts:
        return [], (f"root causes on {len(hosts)} hosts ({', '.join(hosts[:4])}{', ...' if len(hosts) > 4 else ''}; "
                    f"max_hosts {spec.max_hosts}): more likely the network, the service's reach or the job "
                    f"than {len(hosts)} bad nodes")
    return hosts, ""


def _over_limit(policy: Policy, counted: list[Recent], now: float, action: str, job: str, host: str) -> str | None:
    def within(limit: Limit, match: Any) -> int:
        return sum(1 for r in counted if now - r.at < limit.window_s and match(r))

    n = within(policy.per_job, lambda r: r.action == action and r.job == job)
    if n >= policy.per_job.max:
        return f"{action} already {n}x for job {job} in {policy.per_job.window_s:g}s (limits.per_job)"
    if host:
        n = within(policy.per_host, lambda r: r.action == action and r.host == host)
        if n >= policy.per_host.max:
            return f"{action} already {n}x on {host} in {policy.per_host.window_s:g}s (limits.per_host)"
        n = within(policy.fleet, lambda r: r.action in NODE_ACTIONS)
        if n >= policy.fleet.max:
            return f"{n} node actions in the fleet in {policy.fleet.window_s:g}s (limits.fleet)"
    return None


def describe(action: str, target: str, params: Mapping[str, Any], policy: Policy) -> str:
    """What running the action means, in words (an observed action's detail)."""
    if action == ABORT_JOB:
        return (f"publish an abort directive for job {target}: every rank exits {params.get('exit_code')} "
                f"({params.get('reason', '')})")
    if action == DRAIN_NODE:
        text = f"{policy.slurm.scontrol} update nodename={target} state=drain reason=\"{params.get('reason')}\""
        job = params.get("slurm_job_id")
        if params.get("requeue") or params.get("cancel"):
            verb = f"{policy.slurm.scontrol} requeue" if params.get("requeue") else policy.slurm.scancel
            text += f"; {verb} {job}" if job else "; no SLURM job id reported, so no requeue / cancel"
        return text
    if action == CORDON_NODE:
        server = policy.kubernetes.api_server if policy.kubernetes else "?"
        return f"PATCH {server}/api/v1/nodes/{target} spec.unschedulable=true"
    return f"run {' '.join(params.get('argv', []))} with the incident on stdin (timeout {params.get('timeout_s')}s)"


def decide(incident: Mapping[str, Any], policy: Policy, history: History,
           facts: JobFacts | None = None) -> list[PlannedAction]:
    """The actions to record for one incident event (its to_dict() form), first matching rule first.

    Never on a consequence of another incident, a resolved incident or a pause; a rule with
    trusted_only (the default) only on a trusted verdict; each (action, target) at most once per
    incident; rate limits per job, per host and across the fleet count observed actions too, so
    observe mode records exactly what act mode would do."""
    facts = facts or JobFacts()
    if not policy.rules or incident.get("consequence_of") or incident.get("status") != "firing" or paused(incident):
        return []
    now = history.now
    job = str(incident.get("job", ""))
    counted = list(history.recent)
    recorded = set(history.recorded)
    out: list[PlannedAction] = []
    reason = cause_line(incident)
    trust = untrusted_because(incident)
    for rule in policy.rules:
        if incident.get("kind") not in rule.kinds or not at_least(str(incident.get("severity")), rule.min_severity):
            continue
        if rule.trusted_only and trust is not None:
            continue
        mode = OBSERVE if policy.mode == OBSERVE or rule.observe_only else ACT
        for spec in rule.do:
            plans: list[tuple[str, str, dict[str, Any], str]] = []  # (target, host, params, why skipped)
            if spec.name in NODE_ACTIONS:
                hosts, why = _node_targets(spec, incident)
                if not hosts:
                    plans.append(("", "", {}, why))
                for host in hosts:
                    if spec.name == DRAIN_NODE:
                        params: dict[str, Any] = {
                            "reason": slurm_reason(incident),
                            "requeue": spec.requeue, "cancel": spec.cancel, "slurm_job_id": facts.slurm_job_id}
                        plans.append((host, host, params, ""))
                    else:
                        plans.append((facts.kube_nodes.get(host, host), host, {}, ""))
            elif spec.name == ABORT_JOB:
                plans.append((job, "", {"exit_code": spec.exit_code, "ttl_s": spec.ttl_s, "reason": reason,
                                        "job": base_job(job), "run": facts.run}, ""))
            else:
                plans.append((job, "", {"argv": list(spec.argv), "timeout_s": spec.timeout_s}, ""))
            for target, host, params, skipped in plans:
                if (spec.name, target) in recorded:
                    continue
                recorded.add((spec.name, target))
                if skipped:
                    result, detail = SKIPPED, skipped
                else:
                    limited = _over_limit(policy, counted, now, spec.name, base_job(job), host)
                    if limited:
                        result, detail = RATE_LIMITED, limited
                    else:
                        result = OBSERVED if mode == OBSERVE else OWED
                        detail = describe(spec.name, target, params, policy)
                        if mode == OBSERVE:
                            detail = "would " + detail
                        counted.append(Recent(now, base_job(job), spec.name, host))
                out.append(PlannedAction(str(incident.get("id")), job, spec.name, target, host, mode, rule.name,
                                         result, detail, params, now, now + rule.delay_s))
    # the abort first, whatever order the rules list them in: a requeue or cancel (drain_node) kills the
    # ranks, and waits for the abort's ranks to leave (actions.py); stable, so the rest keep their order
    out.sort(key=lambda planned: planned.action != ABORT_JOB)
    return out
