"""The verdict: triggers + wait-for graph -> findings with the evidence that convicts.

`analyze_job(job, now, cfg)` is the pure core every front end (live service, offline
analyzer, benchmarks) calls. At most one primary finding per job and pass, by priority:
mismatch > deadlock > hang > crash > slowdown, because the higher ones explain the lower
(a mismatch hangs the job; a dead rank hangs its peers).
"""

from __future__ import annotations

import copy
import importlib
import math
import operator
import time
from typing import Any

from mycroft import schema

from ..config import AnalysisConfig
from ..ingest.state import AgentState, JobState, job_name
from . import flow_deps, graph_view
from . import graph as wfg
from . import pauses as pauses_mod
from .findings import (
    CRASH,
    CRITICAL,
    DEADLOCK,
    EVIDENCE_WAITED_OPS,
    HANG,
    INFO,
    MISMATCH,
    RC_COMMUNICATION,
    RC_DEADLOCK,
    RC_LINK,
    RC_MISMATCH,
    RC_NODE_NOT_ARRIVED,
    RC_NOT_ARRIVED,
    RC_NOT_ENTERED,
    RC_PROCESS_EXITED,
    RC_PROCESS_LOST,
    RC_STRAGGLER,
    SLOWDOWN,
    WARNING,
    Finding,
    RootCause,
)
from .rank_table import rank_table
from .slow_links import find_slow_link
from .slowness import find_straggle, job_slowdown, job_wait_growth
from .triggers import (
    ALIVE,
    EXITED,
    LOST,
    UNSEEN,
    HangSweep,
    Mismatch,
    find_digest_mismatches,
    find_mismatches,
    find_slowdowns,
    hang_threshold,
    late,
    lost_after,
    silent_limit,
    spoke_at,
    too_young_to_miss,
)

STACK_SEEN_MEMO = "stack_seen"  # job.memo: {rank: (its stack as the analysis last saw it, since when)}


def _group_name(job: JobState, gid: str) -> str:
    group = job.groups.get(gid)
    return group.label if group is not None else gid


def _rank_evidence(job: JobState, rank_id: int, status: str, now: float, cfg: AnalysisConfig) -> RootCause:
    """Convict one sink rank: why it is the one everybody waits for."""
    rank = job.ranks.get(rank_id)
    if rank is None or status == UNSEEN:
        return RootCause(rank_id, RC_PROCESS_LOST, {
            "text": f"rank {rank_id} is a member of a blocked group but never reported",
            "status": UNSEEN})
    spoke = spoke_at(job, rank)
    base: dict[str, Any] = {
        "status": status, "host": rank.host, "pid": rank.pid,
        "issued": dict(rank.issued), "completed": dict(rank.completed),
        "last_heartbeat_counter": rank.heartbeat_number,
        "silent_for_s": round(max(0.0, now - spoke), 3) if spoke else None,
    }
    if status == LOST:
        heard = (f"stopped reporting {now - spoke:.1f}s ago" if rank.last_hb_at else
                 f"sent spans {now - spoke:.1f}s ago but never a heartbeat")
        base["text"] = (f"rank {rank_id} (pid {rank.pid} on {rank.host or '?'}) {heard} without a final "
                        f"heartbeat (expected every {rank.hb_interval:g}s): killed, frozen or unreachable")
        if rank.stack:
            base["last_stack"] = rank.stack
        return RootCause(rank_id, RC_PROCESS_LOST, base)
    if status == EXITED:
        base["exit_reason"] = rank.exit_reason
        base["text"] = f"rank {rank_id} exited ({rank.exit_reason}) while its peers wait for it"
        return RootCause(rank_id, RC_PROCESS_EXITED, base)
    idle = rank.idle_at(now)
    base["idle_s"] = round(idle, 3)
    if rank.stack:
        base["stack"] = rank.stack
    if rank.thread_stacks:
        base["threads"] = rank.thread_stacks  # what its other threads were doing meanwhile
    where = rank.stack.strip().splitlines()[-1].strip() if rank.stack.strip() else "unknown (no stack yet)"
    beat = f"heartbeat {rank.hb_counter}" if rank.heartbeat_number is not None else "no heartbeat yet"
    base["text"] = (f"rank {rank_id} is alive ({beat}) but has not entered the op its "
                    f"peers wait in; outside communication for {idle:.1f}s, at: {where}")
    return RootCause(rank_id, RC_NOT_ENTERED, base)


def _data_sink_cause(job: JobState, node: wfg.Node) -> RootCause:
    """Everyone issued the op and it does not finish: the transport between them."""
    if node[0] == "c":
        group = job.groups.get(node[1])
        members = list(group.ranks) if group is not None else []
        text = (f"every member of group {_group_name(job, node[1])} issued seq {node[2]} but it does not "
                f"complete: data does not move between them (network / transport)")
        evidence: dict[str, Any] = {"text": text, "group_id": node[1], "seq": node[2],
                                    "members": members[:64]}
    else:
        text = f"both sides of p2p {node[2]}->{node[3]} seq {node[4]} were issued but it does not complete"
        evidence = {"text": text, "src": node[2], "dst": node[3], "seq": node[4]}
    flows = _classify_flows(job, node)
    dep = flow_deps.find(job)  # the links' dependencies over the heartbeats since the stall, not one snapshot
    if dep is not None:
        evidence["flows"] = flows.get("flows", []) if flows else []
        evidence["text"] = f"{dep.evidence['text']} (the collective does not complete)"
        evidence["links"] = dep.evidence["links"]
        evidence["locus"] = dep.locus
        evidence["suspect_side"] = dep.evidence["suspect_side"]
        return RootCause(dep.rank, RC_LINK, evidence)
    if flows:
        evidence["flows"] = flows.get("flows", [])
        culprit = flows.get("rank")
        if isinstance(culprit, int):
            evidence["text"] = f"{flows.get('text', '')} (flow state {flows.get('state')}, {flows.get('side')} side)"
            evidence["flow_state"] = flows.get("state")
            evidence["suspect_side"] = flows.get("side")
            return RootCause(culprit, RC_LINK, evidence)
    return RootCause(None, RC_LINK, evidence)


def _classify_flows(job: JobState, node: wfg.Node) -> dict[str, Any]:
    """Native per-flow counters, when present, localise a data stall (the paper's state table).

    Kept while the stalled op and every rank's flows are the same objects (the fold gives a rank
    new flows with each heartbeat): a 2,048-rank DP ring stalled at 16k ranks holds ~100k flows,
    ~0.1 s to classify, and a pass runs about twice per heartbeat interval."""
    per_rank = {r.rank: r.flows for r in job.ranks.values() if r.flows}
    if not per_rank:
        return {}
    known = job.memo.get("classify_flows")
    if known is not None and known[0] == node and len(known[1]) == len(per_rank) and \
            all(map(operator.is_, known[1], per_rank.values())):  # held: the same objects, so the same answer
        return copy.deepcopy(known[2])
    summary = _classify_flows_now(job, node, per_rank)
    job.memo["classify_flows"] = (node, list(per_rank.values()), summary)
    return copy.deepcopy(summary)


def _classify_flows_now(job: JobState, node: wfg.Node, per_rank: dict[int, dict[str, Any]]) -> dict[str, Any]:
    try:  # flow_state.py belongs to the native-plugin work; degrade to "link" if it is absent
        flow_state = importlib.import_module(f"{__package__}.flow_state")
    except ImportError:
        return {}
    members = set(_op_members(job, node))
    if members:
        per_rank = {r: attrs for r, attrs in per_rank.items() if r in members} or per_rank
    try:
        findings = flow_state.classify_flows(per_rank)
        summary = flow_state.summarize(findings)
    except Exception as exc:  # an optional refinement must never break the verdict
        return {"error": f"classify_flows failed: {exc}"}
    return dict(summary) if isinstance(summary, dict) else {}


def _corroborated_status(job: JobState, rank_id: int, now: float, cfg: AnalysisConfig,
                         fresh_after: float = 0.0) -> str | None:
    """A rank that others hang on: LOST sooner than an unaccused rank (its peers corroborate),
    None (undecided) while it is late or has not reported since the waiting began (a heartbeat
    from before the wait cannot tell "alive, elsewhere" from "dead"), ALIVE otherwise."""
    rank = job.ranks[rank_id]
    spoke = spoke_at(job, rank)
    if not spoke:
        return ALIVE
    late = now - spoke
    if late > cfg.corroborated_lost_intervals * rank.hb_interval + cfg.suspect_slack_s:
        return LOST
    if late > cfg.suspect_intervals * rank.hb_interval + cfg.suspect_slack_s or spoke < fresh_after:
        return None
    return ALIVE


def _moved(job: JobState, node: wfg.Node, members: list[int]) -> bool:
    """A member completed the collective, or the receiver the p2p: the data moved. What still reads as
    in flight elsewhere is a completion late to arrive (or one the instrumentation could not see end),
    not a stalled transport."""
    if node[0] == "c":
        return wfg.completed_by_a_member(job, members, node[1], node[2])
    return wfg.received(job, *node[1:])


def _posted_by_one_gone_on(job: JobState, node: wfg.Node, members: list[int]) -> bool:
    """A member posted the op and waits on none of its ops (schema.ATTR_HB_POSTED_ONLY): on gloo a
    posted op completes, as far as anyone can see, only inside wait(), so "everyone issued it and it
    does not complete" says nothing of the transport while that member is in its own code."""
    members = [node[2], node[3]] if node[0] == "p" else members
    return any(rank.posted_only for rank in map(job.ranks.get, members) if rank)


def _youngest_issue_age(job: JobState, node: wfg.Node, members: list[int], now: float) -> float:
    """How long ago the last member issued the op (0.0 when some member's issue age is not known)."""
    youngest = float("inf")
    for m in members:
        rank = job.ranks.get(m)
        if rank is None:
            continue
        if node[0] == "c":
            if rank.completed.get(node[1], 0) >= node[2]:
                continue  # it finished the op (NCCL: downstream of a link that died late in the collective)
            ages = [op.age_at(now) for op in rank.inflight if op.group_id == node[1] and op.seq == node[2]]
        else:
            ages = [op.age_at(now) for op in rank.inflight if op.is_p2p and op.seq == node[4]
                    and {m, op.peer} == {node[2], node[3]}]
        if not ages:
            return 0.0
        youngest = min(youngest, max(ages))
    return 0.0 if youngest == float("inf") else youngest


def _op_members(job: JobState, node: wfg.Node) -> list[int]:
    if node[0] == "c":
        group = job.groups.get(node[1])
        return list(group.ranks) if group is not None else []
    return [node[2], node[3]]


def _crossed(job: JobState, wf: wfg.WaitForGraph, cycle: list[wfg.Node],
             ranks: list[int]) -> dict[int, tuple[str, int]]:
    """The ranks of a deadlock cycle that wait in the op fewest of its ranks wait in, when the rest
    share one other op: they took their ops in another order than their peers (the rank that went
    to the world collective before its TP one), {rank: (its op, how many wait in the others')}.
    Empty when the cycle's ops are waited in alike (two ranks that both send first)."""
    members = set(cycle)
    waiters: dict[wfg.Node, list[int]] = {}
    for r in ranks:
        for op in wf.graph.successors(wfg.rank_node(r)):
            if op in members and op[0] != "r":
                waiters.setdefault(op, []).append(r)
    if len(waiters) < 2:
        return {}
    op, fewest = min(waiters.items(), key=lambda item: len(item[1]))
    if len(fewest) >= max(len(w) for w in waiters.values()):
        return {}
    return {r: (wfg.describe(op, job), len(ranks) - len(fewest)) for r in fewest}


def _hang_finding(job: JobState, status: dict[int, str], sweep: HangSweep, threshold: float,
                  now: float, cfg: AnalysisConfig) -> Finding | None:
    hung, oldest = sweep.waiting, sweep.oldest
    # when the waiting began (service time): a heartbeat older than that proves nothing about now
    fresh_after = now - oldest
    wf, found = wfg.wait_for(job, status, hung, now, cfg, fresh_after, sweep)
    if not found:
        return None
    causes: list[RootCause] = []
    cycle = False
    sink_ranks = {n[1] for sink in found for n in sink.nodes if n[0] == "r"}
    lows: dict[str, tuple[int, int]] = {}  # group -> (fewest of its ops a member issued, that member): _late_why
    for sink in found:
        ranks = [n[1] for n in sink.nodes if n[0] == "r"]
        chain = " -> ".join(wfg.describe(n, job) for n in sink.path)
        if len(sink.nodes) > 1:
            cycle = True
            ops = {r: [f"{op.op} peer {op.peer} seq {op.seq}" if op.is_p2p else
                       f"{op.op} group {_group_name(job, op.group_id)} seq {op.seq}"
                       for op in job.ranks[r].inflight] for r in ranks if r in job.ranks}
            cyc = " -> ".join(wfg.describe(n, job) for n in sink.nodes)
            crossed = _crossed(job, wf, sink.nodes, ranks)
            for r in sorted(ranks, key=lambda r: (r not in crossed, r)):
                text = f"rank {r} is in a wait-for cycle ({cyc}); each member waits on the next"
                if r in crossed:
                    text = (f"rank {r} waits in {crossed[r][0]} while {crossed[r][1]} other rank(s) of the cycle wait "
                            f"in an op it has not issued: it took its ops in another order; " + text)
                causes.append(RootCause(r, RC_DEADLOCK, {
                    "text": text, "cycle": ranks, "in_flight": ops.get(r, []), "blocked_ranks": sink.blast,
                    "crossed_order": r in crossed}))
            continue
        node = sink.nodes[0]
        if node[0] == "r":
            decided: str | None = status.get(node[1], UNSEEN)
            if decided == ALIVE:
                decided = _corroborated_status(job, node[1], now, cfg, fresh_after)
            if decided is None:
                return None  # it just missed a heartbeat: dead or alive decides the verdict, wait
            sink_status = decided
            if sink_status == ALIVE and _in_group_setup(job, node[1], cfg):
                silent = _silent_ranks(job, status, now, cfg)
                if silent is None:
                    return None  # a rank just missed its heartbeat: the one setup waits for may be dead; wait
                if silent:  # it waits in setup for the members that never come: those are the cause
                    for lost in silent:
                        if lost in sink_ranks:
                            continue  # a sink of its own: named there
                        rc = _rank_evidence(job, lost, LOST if lost in job.ranks else UNSEEN, now, cfg)
                        rc.evidence["text"] += (f"; rank {node[1]} waits for it in process-group setup "
                                                "(a rendezvous of the group's members)")
                        rc.evidence["wait_chain"] = f"{chain} -> (setup) -> rank {lost}"
                        rc.evidence["blocked_ranks"] = sink.blast
                        causes.append(rc)
                    continue
            held = job.ranks.get(node[1])
            if sink_status == ALIVE and held is not None and held.device_async and held.completed \
                    and not held.inflight and held.idle_at(now) < threshold:
                # out of communication for less than the hang threshold: between two ops (computing), its
                # peers' wait is not yet its doing (NCCL: ranks that finished a collective another rank is
                # stuck in start the next one and wait for it); convicted once it stays out that long
                return None
            rc = _rank_evidence(job, node[1], sink_status, now, cfg)
            if sink_status == ALIVE and rc.kind == RC_NOT_ENTERED:
                why = _late_why(job, node[1], sink.path[-2] if len(sink.path) > 1 else None, now, cfg, lows)
                if why:
                    rc.evidence["late"] = why  # still on its way to the op: not a cause beside one that is
        else:
            members = _op_members(job, node)
            if not members:
                continue  # an op of a group we know nothing about convicts nobody
            if any(job.ranks.get(m) is not None and _corroborated_status(job, m, now, cfg, fresh_after) is None
                   for m in members):
                return None  # a member just went quiet: it may be dead rather than the link; wait
            device = any(r.device_async for r in map(job.ranks.get, members[:64]) if r is not None)
            if (_moved(job, node, members) and not device) or _posted_by_one_gone_on(job, node, members):
                # (NCCL: members that finished a collective others are stuck in is how a dead link looks
                # mid-collective -- downstream ranks got every chunk before it died -- not a late end)
                continue  # not a cause; the ranks still in it are named through their other sinks, if any
            if _youngest_issue_age(job, node, members, now) < threshold:
                return None  # the last member only just issued it: its completion is on the way; wait
            rc = _data_sink_cause(job, node)
        rc.evidence["wait_chain"] = chain
        rc.evidence["longest_wait_chain"] = " -> ".join(wfg.describe(n, job) for n in sink.longest)
        rc.evidence["blocked_ranks"] = sink.blast
        causes.append(rc)
    if any(not rc.evidence.get("late") for rc in causes):
        causes = [rc for rc in causes if not rc.evidence.get("late")]
    elif any(not str(rc.evidence["late"]).startswith("behind") for rc in causes):
        # every one still on its way: those behind a laggard of their group are not even next
        causes = [rc for rc in causes if not str(rc.evidence["late"]).startswith("behind")]
    if any(rc.rank is not None for rc in causes):
        # a p2p both sides issued that does not complete, beside a rank that holds its peers: on gloo a
        # posted p2p completes, as far as anyone sees, only in wait(), and a rank with several posted
        # (pipelining's batch_isend_irecv) waits in one of them: the rank that holds them is the cause
        causes = [rc for rc in causes if not (rc.kind == RC_LINK and rc.rank is None and "src" in rc.evidence)]
    # order: most blocking first; among lost ranks, the first to go silent first
    if not causes:
        return None
    causes.sort(key=lambda rc: (-int(rc.evidence.get("blocked_ranks", 0)),
                                spoke_at(job, job.ranks[rc.rank]) if rc.rank in job.ranks else 0.0))
    summary = wfg.summary(wf, found, job)
    kind = DEADLOCK if cycle and all(rc.kind == RC_DEADLOCK for rc in causes) else HANG
    names = ", ".join(f"rank {rc.rank} ({rc.kind})" if rc.rank is not None else rc.kind for rc in causes[:4])
    text = (f"{len(hung)} rank(s) stuck in communication for up to {oldest:.1f}s "
            f"(threshold {threshold:.1f}s); root cause: {names}")
    evidence: dict[str, Any] = {"hung_ranks": _first_ranks(job, hung), "threshold_s": round(threshold, 3),
                                "max_in_flight_s": round(oldest, 3), EVIDENCE_WAITED_OPS: _waited_ops(job, found)}
    severity, reason, pause = _hang_severity(job, causes, now, cfg, oldest) if kind == HANG else \
        (CRITICAL, "", None)
    if pause is not None:
        evidence["pause"] = pause
        text += f" - {pause['why']}"
    finding = Finding(job.job_id, kind, text, causes, summary, evidence, severity, reason)
    finding.draw = lambda: graph_view.hang_view(wf, found, job, [rc.to_dict() for rc in causes], now, now - oldest)
    return finding


def _waited_ops(job: JobState, found: list[wfg.Sink], limit: int = 32) -> list[str]:
    """The ops next to the hang's sinks (the sink when it is an op, else the op its chain enters it
    through), most blocking sink first, as the API names them: a standing hang keeps them."""
    ops: dict[str, None] = {}
    for sink in found:
        near = [n for n in (*sink.nodes, *reversed(sink.path)) if n[0] != "r"]
        if near:
            ops[wfg.describe(near[0], job)] = None
        if len(ops) >= limit:
            break
    return list(ops)


def _late_why(job: JobState, rank_id: int, via: wfg.Node | None, now: float, cfg: AnalysisConfig,
              lows: dict[str, tuple[int, int]]) -> str:
    """Why an alive rank that has not entered the op its peers wait in is late rather than a cause
    ('' when it is not): on a loaded node a healthy rank still computing toward the collective (DDP's
    backward before its last buckets) reads as not entered while the first rank already waits.
    - behind a laggard: another member of that group issued fewer of its ops; a group's ops complete
      in order, so the op this rank has not issued waits on that member's earlier one first;
    - computing: its stack moves from heartbeat to heartbeat and it has been outside communication for
      less than late_step_factor x its usual longest stretch outside communication (its op timeline)."""
    rank = job.ranks.get(rank_id)
    if rank is None:
        return ""
    if via is not None and via[0] == "c":
        gid = str(via[1])
        mine = rank.issued.get(gid, 0)
        low = lows.get(gid)
        if low is None:  # once per group and pass (the first 4096 members: a 16k-rank group's hang stays cheap)
            group = job.groups.get(gid)
            low = lows[gid] = min(((other.issued.get(gid, 0), member)
                                   for member in (group.ranks if group is not None else ())[:4096]
                                   if (other := job.ranks.get(member)) is not None), default=(mine, rank_id))
        if low[0] < mine:
            return (f"behind rank {low[1]}: it issued op {mine} of group {_group_name(job, gid)}, rank {low[1]} "
                    f"only {low[0]}; the group's ops complete in order")
    usual = _usual_out_s(rank.timeline)
    idle = rank.idle_at(now)
    if usual <= 0.0 or not rank.stack.strip() or idle >= cfg.late_step_factor * usual:
        return ""
    if _stack_still_s(job, rank_id, rank.stack, now) >= cfg.startup_still_intervals * rank.hb_interval:
        return ""  # one line for heartbeats on end: blocked there, however short its steps were
    return (f"computing: outside communication {idle:.1f}s, its usual longest stretch {usual:.1f}s, its stack "
            f"moving")


def _usual_out_s(timeline: Any) -> float:
    """The longest stretch outside communication between a rank's recent completed ops (its timeline of
    (start, end, group, seq), its own clock): a step's compute. 0.0 with fewer than two such stretches."""
    gaps: list[float] = []
    end: float | None = None
    for start, stop, _, _ in sorted(timeline):
        if end is not None and start > end:
            gaps.append(start - end)
        end = stop if end is None else max(end, stop)
    return max(gaps) if len(gaps) >= 2 else 0.0


def _in_group_setup(job: JobState, rank_id: int, cfg: AnalysisConfig) -> bool:
    """Its last stack is inside torch.distributed's process-group setup (new_group & co.)."""
    rank = job.ranks.get(rank_id)
    return rank is not None and any(frame in rank.stack for frame in cfg.setup_frames)


def _silent_ranks(job: JobState, status: dict[int, str], now: float, cfg: AnalysisConfig) -> list[int] | None:
    """The job's lost ranks, first silent first, then the ranks of its world that never reported
    (once the job has run longer than a rank may take to be lost); None while some rank is late
    but not lost yet, or the job is too young to tell a rank that never started from a slow one."""
    lost: list[int] = []
    for rank_id, rank in job.ranks.items():
        if status.get(rank_id) == LOST:
            lost.append(rank_id)
        elif status.get(rank_id) == ALIVE and late(job, rank, now, cfg):
            return None
    lost.sort(key=lambda r: spoke_at(job, job.ranks[r]))
    missing = _never_reported(job)
    if missing and too_young_to_miss(job, now, cfg):
        return None
    return lost + missing


def _first_ranks(job: JobState, ranks: frozenset[int], limit: int = 256) -> list[int]:
    """sorted(ranks)[:limit], once per set (a standing hang's 16k hung ranks are the same set object)."""
    found = job.memo.get("first_ranks")
    if found is None or found[0] is not ranks:
        found = job.memo["first_ranks"] = (ranks, sorted(ranks)[:limit])
    return list(found[1])


def _hang_severity(job: JobState, causes: list[RootCause], now: float, cfg: AnalysisConfig,
                   waited_s: float = 0.0) -> tuple[str, str, dict[str, Any] | None]:
    """Critical unless every holder is alive elsewhere in a normal pause, or its stack is still on the way."""
    quiet = [rc for rc in causes if rc.kind == RC_PROCESS_LOST and rc.rank in job.ranks]
    for rc in quiet:  # went silent inside an expected phase: a checkpoint or a compiler can starve the heartbeat
        assert rc.rank is not None
        rank = job.ranks[rc.rank]
        phase = pauses_mod.reported_phase(rank.phase == schema.PHASE_COMPILING, cfg.phases) or \
            (pauses_mod.match_phase(rank.stack, cfg.phases) if rank.stack else None)
        silent = now - spoke_at(job, rank)
        if phase is None or silent >= cfg.paused_silence_grace_s:
            break
    else:
        if quiet and len(quiet) == len(causes):
            return WARNING, (f"rank(s) {[rc.rank for rc in quiet]} went quiet inside an expected phase (its heartbeat "
                             f"thread may be starved); critical after {cfg.paused_silence_grace_s:g}s of silence"), None
    if any(rc.kind != RC_NOT_ENTERED or rc.rank is None or rc.rank not in job.ranks for rc in causes):
        return CRITICAL, "ranks are lost, gone or the data does not move", None
    pending: list[int] = []
    young: list[int] = []
    starting: list[int] = []
    pauses: list[pauses_mod.PauseVerdict] = []
    for rc in causes:
        assert rc.rank is not None
        rank = job.ranks[rc.rank]
        idle = rank.idle_at(now)
        if (idle <= 0.0 and rank.inflight) or (rank.idle_s == 0.0 and not rank.inflight and not rank.posted_only):
            # not entered, yet its heartbeat lists ops in flight: ops its peers finished (waited in C++, the
            # rank never saw them end), so it reads as busy forever; or it reported idle 0 for ops its own
            # frontier says are done (dropped from rank.inflight: a record its instrumentation lost track
            # of), so its idle restarts at every heartbeat. How long the others have waited on it is how
            # long it has been out
            idle = max(idle, waited_s)
        compiling = rank.phase == schema.PHASE_COMPILING
        if not compiling and not rank.stack.strip() and idle < cfg.stack_wait_s + rank.hb_interval:
            pending.append(rc.rank)
            continue
        if rc.evidence.get("late"):
            young.append(rc.rank)  # every cause named is still on its way to the op: none holds it yet
            continue
        verdict = pauses_mod.classify(rc.rank, rank.stack, idle, job.pauses, cfg, compiling)
        if verdict is None and not any(rank.completed.values()) and idle < cfg.startup_budget_s and \
                _stack_still_s(job, rc.rank, rank.stack, now) < cfg.startup_still_intervals * rank.hb_interval:
            # it never completed a collective and its stack moves: still starting (building its model,
            # loading data or weights) while faster peers wait in the first one; on a loaded host that
            # takes seconds and paged a healthy 8-rank start-up. A rank whose stack stands still at one
            # line is stuck there (blocked before its first step), as at any other time
            starting.append(rc.rank)
            continue
        if verdict is None and idle < cfg.page_idle_min_s:
            young.append(rc.rank)  # out of communication about a hang threshold: a slow step under load, so far
            continue
        if verdict is None:
            return CRITICAL, f"rank {rc.rank} is outside communication where this job does not pause", None
        if not verdict.within_budget:
            return CRITICAL, (f"rank {rc.rank}'s pause ({verdict.phase}) has lasted {verdict.age_s:.1f}s, over its "
                              f"budget of {verdict.budget_s:.1f}s"), None
        pauses.append(verdict)
    if pending:
        return WARNING, (f"waiting for the stack of rank(s) {pending} (at most one heartbeat interval) to tell a "
                         f"normal pause from a hang"), None
    if young:
        return WARNING, (f"rank(s) {young} outside communication for less than {cfg.page_idle_min_s:g}s, where this "
                         f"job does not pause: critical if they stay out"), None
    if starting:
        return WARNING, (f"rank(s) {starting} have not completed a collective yet: still starting (model, data, "
                         f"weights) or stuck before the first step; critical after the start-up budget of "
                         f"{cfg.startup_budget_s:g}s"), None
    top = max(pauses, key=lambda p: p.age_s / max(p.budget_s, 1e-9))
    return INFO, "a normal pause within its budget", {
        "phase": top.phase, "budget_s": round(top.budget_s, 3), "age_s": round(top.age_s, 3), "why": top.why}


def _stack_still_s(job: JobState, rank_id: int, stack: str, now: float) -> float:
    """How long the analysis has seen this rank's stack unchanged (0.0 when it just changed): the
    heartbeats resample it, so a rank at work shows another line each time, a blocked one the same."""
    seen: dict[int, tuple[str, float]] = job.memo.setdefault(STACK_SEEN_MEMO, {})
    last = seen.get(rank_id)
    if last is None or last[0] != stack:
        seen[rank_id] = (stack, now)
        return 0.0
    return now - last[1]


def _digest_text(job: JobState, mm: Mismatch, rank: int, name: str) -> str:
    group = job.groups[mm.group_id]
    values = group.digests.get(schema.digest_block(mm.seq), {})
    agree = len(values) - len(mm.minority)
    return (f"rank {rank}'s collectives in group {name} seqs {mm.seq}-{mm.seq + schema.DIGEST_BLOCK - 1} "
            f"differ from its peers' ({agree} of {len(values)} members agree on another op / size / dtype "
            f"signature digest): a mismatch that completed, e.g. equal sizes of different dtypes, "
            f"which computes wrong results without an error")


def _mismatch_finding(job: JobState, status: dict[int, str]) -> Finding | None:
    found = find_mismatches(job) or find_digest_mismatches(job)
    if not found:
        return None
    causes: list[RootCause] = []
    for mm in found[:8]:
        name = _group_name(job, mm.group_id)
        group = job.groups.get(mm.group_id)
        rec = group.seqs.get(mm.seq) if group is not None else None
        silent = [m for m in (group.ranks if group is not None else ()) if m not in mm.minority
                  and (rec is None or m not in rec.sigs)]
        peers = {m: status.get(m, UNSEEN) for m in silent[:16]}
        for rank, sig in mm.minority.items():
            if mm.basis == "digest":
                causes.append(RootCause(rank, RC_MISMATCH, {
                    "text": _digest_text(job, mm, rank, name), "group_id": mm.group_id, "seq": mm.seq,
                    "seqs": [mm.seq, mm.seq + schema.DIGEST_BLOCK - 1], "field": mm.field,
                    "compared_with": mm.basis}))
                continue
            where = "where the others issued" if mm.basis == "members" else "where this group always issued"
            text = (f"rank {rank} issued {sig[0]} ({sig[1]} bytes{', ' + sig[2] if sig[2] else ''}) "
                    f"at group {name} seq {mm.seq} {where} {mm.majority[0]} "
                    f"({mm.majority[1]} bytes{', ' + mm.majority[2] if mm.majority[2] else ''})")
            state = rec.states.get(rank) if rec is not None else None
            if state in ("error", "timeout"):
                text += f"; its op failed ({_error_text(job, rank, mm.group_id, mm.seq)})"
            gone = [m for m, s in peers.items() if s != ALIVE]
            if gone:
                text += f"; peer rank(s) {gone} then died or exited: a consequence"
            causes.append(RootCause(rank, RC_MISMATCH, {
                "text": text, "group_id": mm.group_id, "seq": mm.seq, "field": mm.field, "compared_with": mm.basis,
                "issued": {"op": sig[0], "bytes": sig[1], "dtype": sig[2]},
                "expected": {"op": mm.majority[0], "bytes": mm.majority[1], "dtype": mm.majority[2]},
                "peers_after": {str(m): s for m, s in peers.items()}}))
    first = found[0]
    text = (f"collective mismatch ({first.field}) in group {_group_name(job, first.group_id)} at seq "
            f"{first.seq}: rank(s) {sorted(first.minority)} diverge")
    return Finding(job.job_id, MISMATCH, text, causes, {},
                   {"mismatches": [{"group_id": m.group_id, "seq": m.seq, "field": m.field, "basis": m.basis,
                                    "minority": sorted(m.minority)} for m in found[:8]]})


def _error_text(job: JobState, rank: int, gid: str, seq: int) -> str:
    state = job.ranks.get(rank)
    for err_gid, err_seq, _op, message in reversed(state.errors if state is not None else ()):
        if err_gid == gid and err_seq == seq:
            return message[:200] or "error"
    return "error"


def _never_reported(job: JobState) -> list[int]:
    """The ranks of the job's world it has heard nothing from."""
    return [r for r in range(job.world_size) if r not in job.ranks] if len(job.ranks) < job.world_size else []


def _torn_down_unseen(job: JobState, now: float, cfg: AnalysisConfig) -> list[int]:
    """Ranks of the world that never reported, in a job its launcher tore down: every rank it
    heard from exited on a signal (torchrun SIGTERMs the others when one worker dies). A rank
    killed within moments of init_process_group sends nothing at all; its peers' final
    heartbeats are then all there is. Named once the job is older than a rank may take to be
    lost (a rank that is only slow to start is not one)."""
    if not job.ranks or len(job.ranks) >= job.world_size or too_young_to_miss(job, now, cfg):
        return []
    if not all(rank.final and rank.exit_reason.startswith("SIG") for rank in job.ranks.values()):
        return []
    return _never_reported(job)[:256]


def _crash_finding(job: JobState, status: dict[int, str], now: float, cfg: AnalysisConfig,
                   waited_on: bool = True) -> Finding | None:
    """Ranks silent without a final heartbeat. Critical, unless nothing corroborates the silence yet:
    it began inside a compilation, or no rank waits on anything and none has exited (a rank starved
    by load or a GIL-holding compiler is silent for a second or two; a frozen rank's peers soon wait
    on it, which is a hang that pages; a killed one's launcher tears the others down, which exits them)."""
    if LOST not in status.values():  # a scan in C: nobody is lost in almost every pass
        return _teardown_finding(job, now, cfg)
    lost = [r for r, s in status.items() if s == LOST]
    if not lost:
        return None
    causes = [_rank_evidence(job, r, LOST, now, cfg) for r in lost]
    causes.sort(key=lambda rc: spoke_at(job, job.ranks[rc.rank]) if rc.rank in job.ranks else 0.0)
    others = {s: sum(1 for v in status.values() if v == s) for s in (ALIVE, EXITED)}
    text = (f"{len(lost)} rank(s) stopped reporting without a final heartbeat: "
            f"{', '.join(str(rc.rank) for rc in causes[:8])}; {others[ALIVE]} alive, {others[EXITED]} exited")
    severity, reason = "", ""
    silent_s = [now - spoke_at(job, job.ranks[r]) if r in job.ranks else math.inf for r in lost]
    if all(job.ranks[r].phase == schema.PHASE_COMPILING and silent < cfg.paused_silence_grace_s
           for r, silent in zip(lost, silent_s, strict=True)):
        severity, reason = WARNING, (f"silent while compiling (a compiler holding the GIL starves the heartbeat "
                                     f"thread); critical after {cfg.paused_silence_grace_s:g}s of silence")
    elif not waited_on and not others[EXITED] and others[ALIVE] and max(silent_s) < cfg.unwaited_lost_grace_s:
        severity, reason = WARNING, (f"no rank waits on the silent rank(s) yet and none exited (a heartbeat starved by "
                                     f"load looks the same for a second); critical once peers wait on them or after "
                                     f"{cfg.unwaited_lost_grace_s:g}s of silence")
    return Finding(job.job_id, CRASH, text, causes, {},
                   {"lost_ranks": sorted(lost)[:256], "alive": others[ALIVE], "exited": others[EXITED],
                    "lost_after_s": round(lost_after(job.ranks[lost[0]], cfg), 3)}, severity, reason)


def _teardown_finding(job: JobState, now: float, cfg: AnalysisConfig) -> Finding | None:
    """A crash no rank's silence shows: the ranks that never reported, in a torn-down job."""
    unseen = _torn_down_unseen(job, now, cfg)
    if not unseen:
        return None
    exited = sorted(job.ranks)
    reasons = sorted({job.ranks[r].exit_reason for r in exited})
    causes = [RootCause(r, RC_PROCESS_LOST, {
        "text": f"rank {r} of {job.world_size} never reported (no heartbeat, no span), and every rank that did "
                f"was terminated ({', '.join(reasons)}): it died first, before its first heartbeat, and the "
                f"launcher tore the job down", "status": UNSEEN}) for r in unseen]
    text = (f"{len(unseen)} rank(s) never reported: {', '.join(map(str, unseen[:8]))}; the {len(exited)} that did "
            f"were all terminated ({', '.join(reasons)})")
    return Finding(job.job_id, CRASH, text, causes, {},
                   {"unseen_ranks": unseen, "exited": len(exited), "exit_reasons": reasons})


def _straggle_finding(job: JobState, cfg: AnalysisConfig) -> Finding | None:
    """A rank whose own compute explains the slowness (slowness.py), with the propagation."""
    found = find_straggle(job, cfg)
    if found is None:
        return None
    w = found.own
    chain = "; ".join(f"rank {v['rank']} waits +{float(v['extra_wait_share']):.0%} of its time"  # type: ignore[arg-type]
                      + (f", most in {v['waited_most_in']}" if v["waited_most_in"] else "") for v in found.victims[:6])
    if found.mode == "onset":
        text = (f"rank {found.rank} computes {w.recent:.0%} of its time (was {w.base:.0%}) while the others' "
                f"compute share fell: {found.excess:.0%} apart, in {found.persistence:.0%} of the recent intervals; "
                f"the job completes ops x{found.slowdown:.2f} slower" + (f"; waiting on it: {chain}" if chain else ""))
        strong = found.excess >= cfg.straggle_warning_spread and found.persistence >= 1.0
        severity = WARNING if found.slowdown >= cfg.straggle_warning_slowdown and strong else INFO
        reason = (f"job slowed x{found.slowdown:.2f}, spread {found.excess:.0%} in {found.persistence:.0%} of the "
                  f"intervals (warning from x{cfg.straggle_warning_slowdown:g} with a spread >= "
                  f"{cfg.straggle_warning_spread:.0%} in every interval)")
    else:
        text = (f"rank {found.rank} computes {w.recent:.0%} of its time, {found.excess:.0%} more than the ranks "
                f"that do the same work ({', '.join(map(str, found.peers[:8]))}): a persistently slower rank"
                + (f"; waiting on it: {chain}" if chain else ""))
        severity = WARNING if found.excess >= cfg.imbalance_warning_excess else INFO
        reason = (f"{'an' if severity == WARNING else 'a mild'} imbalance of {found.excess:.0%} compute share "
                  f"(warning from {cfg.imbalance_warning_excess:.0%})")
    evidence = {"text": text, "mode": found.mode, "compute_share": round(w.recent, 4),
                "baseline_compute_share": None if math.isnan(w.base) else round(w.base, 4),
                "excess_share": round(found.excess, 4),
                "persistence": round(found.persistence, 3), "job_slowdown": round(found.slowdown, 3),
                "peers": found.peers[:32], "waiting_on_it": found.victims}
    summary = f"job slowed down x{found.slowdown:.2f}: {text}" if found.mode == "onset" else text
    finding = Finding(job.job_id, SLOWDOWN, summary, [RootCause(found.rank, RC_STRAGGLER, evidence)], {},
                      {"mode": found.mode, "job_slowdown": round(found.slowdown, 3)}, severity, reason)
    waiting = [int(v["rank"]) for v in found.victims if isinstance(v.get("rank"), int)]  # type: ignore[call-overload]
    finding.draw = lambda: graph_view.slow_view(job, found.rank, [*waiting, *found.peers], job.last_seen)
    return finding


def _slow_link_finding(job: JobState, cfg: AnalysisConfig) -> Finding | None:
    """A moving ring paced by one rank's NIC / link / receive side / proxy: the links' dependencies over
    many heartbeats (flow_deps.py) once the job runs slower than its baseline; with no slowdown to go by,
    the same ledger on twice the evidence (a link slow since before the launch)."""
    slowdown = job_slowdown(job, cfg, cfg.slow_link_beats)
    dep = flow_deps.find(job)
    if dep is not None and (slowdown >= cfg.slow_link_min_slowdown or
                            (dep.score >= 2 * flow_deps.MIN_SCORE and dep.score >= 2 * dep.runner_up)):
        alone = slowdown < cfg.slow_link_min_slowdown
        evidence = dict(dep.evidence, job_slowdown=round(slowdown, 3), no_baseline=alone)
        pace = (f"the job completes ops x{slowdown:.2f} against its baseline (slow since before one was measured)"
                if alone else f"the job completes ops x{slowdown:.2f} slower")
        evidence["text"] = f"{dep.evidence['text']}; {pace}"
        reason = (f"one rank's {dep.locus} scored {dep.score:.1f} steps over the job's median link, "
                  f"{dep.runner_up:.1f} for the next rank" + ("" if alone else f"; job slowed x{slowdown:.2f}"))
        summary = (f"one rank's link is slower than the rest of its ring: {evidence['text']}" if alone
                   else f"job slowed down x{slowdown:.2f}: {evidence['text']}")
        finding = Finding(job.job_id, SLOWDOWN, summary, [RootCause(dep.rank, RC_LINK, evidence)], {},
                          {"mode": "link", "locus": dep.locus, "job_slowdown": round(slowdown, 3),
                           "no_baseline": alone}, WARNING, reason)
        peers = [dep.peer] if dep.peer >= 0 else []
        finding.draw = lambda: graph_view.slow_view(job, dep.rank, peers, job.last_seen)
        return finding
    if dep is not None or any(r.flow_history for r in job.ranks.values()):
        return None  # the ledger read the flows and names nobody: no snapshot rule overrides it
    found = find_slow_link(job, cfg, slowdown)
    if found is None:
        return None
    text = str(found.evidence["text"])
    if found.alone:
        reason = (f"one rank's {found.locus} held {cfg.slow_link_alone_factor:g}x more than any other rank's in "
                  f"each of {found.beats} sampled heartbeats, the job not x{cfg.slow_link_min_slowdown:g} slower than "
                  f"a baseline (slow since before one was measured)")
        summary = f"one rank's link is slower than the rest of its ring: {text}"
    else:
        reason = f"job slowed x{found.slowdown:.2f} by one rank's {found.locus} (from x{cfg.slow_link_min_slowdown:g})"
        summary = f"job slowed down x{found.slowdown:.2f}: {text}"
    finding = Finding(job.job_id, SLOWDOWN, summary,
                      [RootCause(found.rank, RC_LINK, found.evidence)], {},
                      {"mode": "link", "locus": found.locus, "job_slowdown": round(found.slowdown, 3),
                       "no_baseline": found.alone}, WARNING, reason)
    peers = [found.peer] if found.peer >= 0 else []
    finding.draw = lambda: graph_view.slow_view(job, found.rank, peers, job.last_seen)
    return finding


def _slowdown_finding(job: JobState, cfg: AnalysisConfig) -> Finding | None:
    straggle = _straggle_finding(job, cfg)
    if straggle is not None and straggle.severity != INFO:
        return straggle
    link = _slow_link_finding(job, cfg)
    if link is not None:
        return link  # a link the flows name outranks a mild compute imbalance (info)
    if straggle is not None:
        return straggle
    # without compute/wait heartbeats (older instrumentation, spans-only recordings) arrival
    # order is all there is; with them, a slowdown no rank's compute explains is the transport's
    has_work = any(rank.work for rank in job.ranks.values())
    found = [s for s in find_slowdowns(job, cfg) if not has_work or s.straggler is None]
    if has_work and found:
        waits = job_wait_growth(job, cfg)
        if waits is None or waits[0] < cfg.comm_min_wait_growth or waits[1] < cfg.slow_ratio ** 0.5:
            return None  # the ranks do not wait more, or the job is not slower: not the transport
    if not found:
        return None
    found.sort(key=lambda s: (s.straggler is None, -s.last_share, -s.ratio))
    causes: list[RootCause] = []
    seen: set[int | None] = set()
    for slow in found:
        if slow.straggler in seen:
            continue
        seen.add(slow.straggler)
        evidence = slow.as_evidence()
        name = _group_name(job, slow.group_id)
        if slow.straggler is not None:
            evidence["text"] = (f"rank {slow.straggler} arrived last at {slow.last_share:.0%} of the last "
                                f"{slow.samples} collectives of group {name}, {slow.lag_s * 1000:.0f} ms after the "
                                f"others (median); step interval {slow.baseline_s * 1000:.0f} -> "
                                f"{slow.recent_s * 1000:.0f} ms")
            causes.append(RootCause(slow.straggler, RC_STRAGGLER, evidence))
        else:
            evidence["text"] = (f"group {name}: interval {slow.baseline_s * 1000:.0f} -> "
                                f"{slow.recent_s * 1000:.0f} ms and communication time x{slow.comm_ratio:.1f} "
                                f"with normal arrival skew: the network / transport is slower")
            causes.append(RootCause(None, RC_COMMUNICATION, evidence))
    top = found[0]
    text = f"job slowed down x{top.ratio:.1f}: " + causes[0].evidence["text"]
    finding = Finding(job.job_id, SLOWDOWN, text, causes, {}, {"groups": [s.as_evidence() for s in found[:8]]})
    culprit = causes[0].rank
    finding.draw = lambda: graph_view.slow_view(job, culprit, [], job.last_seen)
    return finding


SLOWNESS_COSTLY_S = 0.005  # a slowness search slower than this is bounded (below); cheaper ones always run
SLOWNESS_SHARE = 0.05  # ... to about this share of the time: re-run after max(interval, cost / share) ...
SLOWNESS_MAX_HOLD = 2.0  # ... but at most this many heartbeat intervals (a slowdown is named within ~3)


def _slowdown_bounded(job: JobState, now: float, cfg: AnalysisConfig) -> Finding | None:
    """_slowdown_finding, bounded: its search is O(ranks) over per-interval samples (16k ranks:
    ~40 ms of CPU in one process, ~2x that in a busy service; work_table.py), and a slowness
    verdict is judged over 3-8 intervals anyway; so where it is costly the last result stands
    for max(one heartbeat interval, its cost / SLOWNESS_SHARE), capped at SLOWNESS_MAX_HOLD
    intervals (a first search pays one-off costs, ~0.2 s at 16k ranks: held 4 s, it hid a slow
    link for that long): at 16k ranks a search every 1-2 s (every pass was 10-20% of a core).
    A cheap one (1k ranks: ~3 ms) always runs."""
    memo = job.memo.get("slowdown")
    if memo is not None and memo[2] > SLOWNESS_COSTLY_S and 0.0 <= now - memo[0] < \
            min(max(job.hb_interval, memo[2] / SLOWNESS_SHARE), SLOWNESS_MAX_HOLD * job.hb_interval):
        return memo[1]
    started = time.thread_time()
    found = _slowdown_finding(job, cfg)
    job.memo["slowdown"] = (now, found, time.thread_time() - started)
    return found


def analyze_job(job: JobState, now: float, cfg: AnalysisConfig) -> list[Finding]:
    """State in, findings out: the primary finding first (empty when the job is healthy).

    Each finding's evidence names the job as its user did (OTEL_SERVICE_NAME) beside its run id.
    """
    findings = _analyze_job(job, now, cfg)
    if findings:
        name = job_name(job)
        for finding in findings:
            if name:
                finding.evidence.setdefault("job_name", name)
            if job.run_id:
                finding.evidence.setdefault("run_id", job.run_id)
    return findings


def _analyze_job(job: JobState, now: float, cfg: AnalysisConfig) -> list[Finding]:
    if job.agents:  # a multi-node launch: its nodes' agents may still wait for a node, before any rank
        nodes = _node_rendezvous_finding(job, now, cfg)
        if nodes is not None:
            return [nodes]
    if not job.groups:  # before any group exists, only a start-up hang can be told
        startup = _startup_finding(job, now, cfg)
        if startup is not None:
            return [startup]
    ranks = rank_table(job)  # statuses() and hang_sweep() of every rank, re-read where the fold touched it
    status = ranks.statuses(job, now, cfg)
    mismatch = _mismatch_finding(job, status)
    if mismatch is not None:
        return [mismatch]
    threshold = hang_threshold(job, cfg)
    sweep = ranks.hang_sweep(job, status, now, threshold, cfg)
    if sweep.waiting:
        hang = _hang_finding(job, status, sweep, threshold, now, cfg)
        if hang is not None:
            return [hang]
    crash = _crash_finding(job, status, now, cfg, waited_on=bool(sweep.waiting))
    if crash is not None:
        return [crash]
    if ALIVE in status.values():
        slow = _slowdown_bounded(job, now, cfg)
        if slow is not None and not _names_a_late_rank(job, slow, now, cfg):
            return [slow]
    return []


def _node_hosts(job: JobState) -> tuple[dict[int, str], int]:
    """(node index -> host, ranks per node) from the ranks that reported their launcher's facts."""
    hosts: dict[int, str] = {}
    per_node = 0
    for rank in job.ranks.values():
        resource = rank.resource or {}
        node = resource.get(schema.RES_NODE_RANK)
        if isinstance(node, int) and rank.host:
            hosts.setdefault(node, rank.host)
        size = resource.get(schema.RES_LOCAL_WORLD_SIZE)
        if isinstance(size, int) and size > 0:
            per_node = size
    return hosts, per_node


def startup_threshold_s(waits: list[float], hb_interval: float, cfg: AnalysisConfig) -> float:
    """How long ranks may wait in rendezvous before the absent ones are named: the floor, one heartbeat
    interval (a rank's first heartbeat may be that late), or a multiple of how far apart the waiting
    ranks arrived, whichever is longest."""
    spread = max(waits) - min(waits) if waits else 0.0
    return max(cfg.startup_min_s, hb_interval, cfg.startup_spread_factor * spread)


def _startup_finding(job: JobState, now: float, cfg: AnalysisConfig) -> Finding | None:
    """A start-up hang: ranks wait in rendezvous (init_process_group) for ranks of the world that are
    not there -- still before init (importing, loading data: its stack says where), or never heard
    from at all (not started, or stuck before Python ran). Named once the wait lasts startup_min_s, or
    startup_spread_factor times the spread of the waiting ranks' arrivals when they trickled in (a rank
    of a large job may arrive seconds after the first without being stuck); critical after
    startup_budget_s (a slow import is normal for seconds, not for a minute)."""
    waiting = [r for r in job.ranks.values() if r.phase == schema.PHASE_RENDEZVOUS and not r.final]
    if not waiting or job.world_size <= 0:
        return None
    waits = [r.phase_s + max(0.0, now - r.last_hb_at) for r in waiting]
    wait_s = max(waits)
    if wait_s < startup_threshold_s(waits, job.hb_interval, cfg):
        return None
    absent = [r for r in range(job.world_size)
              if r not in job.ranks or job.ranks[r].phase in ("", schema.PHASE_IMPORTING) or job.ranks[r].final]
    if not absent:
        return None
    hosts, per_node = _node_hosts(job)
    causes = []
    for r in absent[:256]:
        rank = job.ranks.get(r)
        node = r // per_node if per_node else -1
        host = rank.host if rank is not None and rank.host else hosts.get(node, "")
        where = f" on {host}" if host else (f" on node {node} (no rank of it reported)" if node >= 0 else "")
        if rank is None:
            text = (f"rank {r} of {job.world_size}{where} never reported: not started, or stuck before Python "
                    f"ran, while {len(waiting)} rank(s) wait for it in rendezvous for {wait_s:.1f}s")
            evidence: dict[str, Any] = {"text": text, "status": UNSEEN, "phase": "", "host": host}
        elif rank.final:
            text = f"rank {r}{where} exited ({rank.exit_reason}) before init_process_group"
            evidence = {"text": text, "status": EXITED, "phase": rank.phase, "host": host}
        else:
            text = (f"rank {r}{where} has not reached init_process_group ({rank.phase or 'no phase'} for "
                    f"{rank.phase_s:.1f}s) while {len(waiting)} rank(s) wait for it in rendezvous for {wait_s:.1f}s")
            evidence = {"text": text, "status": ALIVE, "phase": rank.phase, "host": host, "stack": rank.stack}
        causes.append(RootCause(r, RC_NOT_ARRIVED, evidence))
    critical = wait_s >= cfg.startup_budget_s
    reason = (f"rendezvous waiting {wait_s:.0f}s, over the start-up budget of {cfg.startup_budget_s:.0f}s"
              if critical else f"rendezvous waiting {wait_s:.1f}s, within the start-up budget of "
              f"{cfg.startup_budget_s:.0f}s: a rank may still be importing")
    text = (f"start-up hang: {len(waiting)} rank(s) wait in rendezvous for {wait_s:.1f}s; missing: "
            f"{', '.join(str(c.rank) for c in causes[:8])}")
    return Finding(job.job_id, HANG, text, causes, {},
                   {"phase": "startup", "waiting_ranks": sorted(r.rank for r in waiting)[:256],
                    "missing_ranks": absent[:256], "rendezvous_wait_s": round(wait_s, 3)},
                   CRITICAL if critical else WARNING, reason)


def _short_host(host: str) -> str:
    return host.split(".", 1)[0].lower()


def _node_rendezvous_finding(job: JobState, now: float, cfg: AnalysisConfig) -> Finding | None:
    """A multi-node start-up hang: the launcher agents of some nodes wait in the node rendezvous for
    nodes that never join (not scheduled, not started, their agent stuck), and no rank exists yet.

    Present: the agents that report, or as many nodes as the best-informed agent read in the round
    (c10d), whichever is more; missing: the rendezvous' minimum less those. Named by node index where
    the backend fixes it (static: the agents' node ranks) and by host where the launcher lists the
    job's hosts (SLURM_JOB_NODELIST, in node order), else counted. Named after node_rendezvous_min_s
    (or startup_threshold_s over the agents' arrivals), critical after node_rendezvous_budget_s."""
    def fresh(agent: AgentState) -> bool:
        return now - agent.last_at <= silent_limit(agent.interval_s, cfg)

    waiting = [a for a in job.agents.values() if not a.done and fresh(a)]
    if not waiting:
        return None
    if any(not r.final and now - r.last_hb_at <= lost_after(r, cfg) for r in job.ranks.values()):
        return None  # ranks run: the agents' rendezvous is done somewhere (an elastic re-join is the ranks' story)
    waits = [a.phase_s + max(0.0, now - a.last_at) for a in waiting]
    wait_s = max(waits)
    if wait_s < max(cfg.node_rendezvous_min_s, startup_threshold_s(waits, min(a.interval_s for a in waiting), cfg)):
        return None
    nodes_min = max(a.nodes_min for a in waiting)
    agents = [a for a in job.agents.values() if a.done or fresh(a)]
    present = max(len({(a.host, a.pid) for a in agents}), max((a.joined for a in waiting), default=0))
    if nodes_min - present <= 0:
        return None  # enough nodes: the round waits for more up to its maximum (its last call), not a hang
    expected = next((a.expected_hosts for a in agents if a.expected_hosts), ())
    here = {_short_host(h) for a in agents for h in (a.host, *a.joined_hosts)}
    ranks_in = {a.node_rank for a in agents if a.node_rank >= 0}
    backend = waiting[0].backend or "rendezvous"
    if ranks_in:  # static: every node's index is fixed, and the job's host list is in node order
        absent = [(n, expected[n] if n < len(expected) else "") for n in range(nodes_min) if n not in ranks_in]
    else:
        hosts = [h for h in expected if _short_host(h) not in here][:nodes_min - present]
        absent = [(-1, h) for h in hosts] + [(-1, "")] * (nodes_min - present - len(hosts))
    causes = []
    for node, host in absent[:256]:
        who = " ".join(filter(None, (f"node {node}" if node >= 0 else "a node", f"({host})" if host else "")))
        text = (f"{who} never joined the {backend} node rendezvous: {present} of {nodes_min} nodes there after "
                f"{wait_s:.1f}s, and no rank starts until it does")
        causes.append(RootCause(None, RC_NODE_NOT_ARRIVED,
                                {"text": text, "status": UNSEEN, "node": node, "host": host}))
    critical = wait_s >= cfg.node_rendezvous_budget_s
    reason = (f"node rendezvous waiting {wait_s:.0f}s, over its budget of {cfg.node_rendezvous_budget_s:.0f}s"
              if critical else f"node rendezvous waiting {wait_s:.1f}s, within its budget of "
              f"{cfg.node_rendezvous_budget_s:.0f}s: a node may still be starting")
    named = ", ".join(h or (f"node {n}" if n >= 0 else "?") for n, h in absent[:8])
    text = (f"multi-node start-up hang: {len(waiting)} node agent(s) wait in the {backend} node rendezvous for "
            f"{wait_s:.1f}s, {present} of {nodes_min} nodes there; missing {nodes_min - present}: {named}")
    return Finding(job.job_id, HANG, text, causes, {},
                   {"phase": schema.PHASE_NODE_RENDEZVOUS, "waiting_hosts": sorted({a.host for a in waiting})[:256],
                    "joined_hosts": sorted({h for a in waiting for h in a.joined_hosts})[:256],
                    "nodes_min": nodes_min, "nodes_present": present, "rendezvous_wait_s": round(wait_s, 3)},
                   CRITICAL if critical else WARNING, reason)


def _names_a_late_rank(job: JobState, finding: Finding, now: float, cfg: AnalysisConfig) -> bool:
    """A slowness verdict waits while a rank it blames has missed its heartbeat.

    A straggler or a slow NIC still heartbeats on time (the heartbeat thread does not wait on
    compute or the network). A rank that just crashed or froze looks like a straggler for a
    beat or two (its peers wait on it, its last samples show it computing) before it is
    lost; naming it "slow" first would page the wrong fault. The crash or hang verdict comes
    once it is lost; a rank that was only delayed is named when its heartbeat arrives.
    """
    for cause in finding.root_causes:
        rank = job.ranks.get(cause.rank) if cause.rank is not None else None
        if rank is not None and late(job, rank, now, cfg):
            return True
    return False
