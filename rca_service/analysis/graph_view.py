"""A bounded drawing of an incident: the condensed wait-for graph and the per-rank timeline.

The incident page (pages.py) draws what this returns; it is plain JSON, computed once
when an incident fires or its root causes change, and stored with the incident.

Condensation keeps a 16k-rank hang to a few dozen nodes: the root causes and every node
on their shortest and longest wait chains are drawn one by one; any other node joins an
aggregate keyed by (kind, group family, hops to the next drawn node, that node), so the
16383 ranks waiting in one all_reduce become one "16383 ranks" box pointing at the op,
and 512 stuck TP all_reduces one "512 tp ops" box. Columns are hops to the sink, so a
chain across TP -> PP -> DP reads left to right with the root cause on the right.

Pure functions of the graph, its sinks and the job state.
"""

from __future__ import annotations

import heapq
import itertools
import re
from collections import deque
from collections.abc import Iterable
from typing import Any

from ..ingest.state import JobState, RankState
from . import graph as wfg

VERSION = 1
MAX_NODES = 120  # drawn nodes; beyond it the rest is counted in "omitted"
MAX_EDGES = 400
MAX_RANKS_LISTED = 8  # members shown in an aggregate's label
TIMELINE_ROWS = 24
TIMELINE_OPS_PER_GROUP = 6
WORK_POINTS = 24
LAG_SEQS = 24

_FAMILY = re.compile(r"[\d_.:-]+$")


def family(name: str) -> str:
    """The kind of group a name says ("tp3" -> "tp"); numeric or empty names are "group"."""
    fam = _FAMILY.sub("", name)
    return fam or "group"


def _group_name(job: JobState, gid: str) -> str:
    """What people call the group: its description ("tp0") where torch has one, else its name."""
    group = job.groups.get(gid)
    if group is None:
        return gid
    return group.label


def _ranks_text(ranks: list[int]) -> str:
    """"0-3,8,10" for a sorted list, capped."""
    parts: list[str] = []
    i = 0
    while i < len(ranks) and len(parts) < MAX_RANKS_LISTED:
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(parts) + (",..." if i < len(ranks) else "")


def _to_sinks(g: Any, sinks: Iterable[wfg.Node], within: set[wfg.Node]) -> tuple[dict[wfg.Node, int],
                                                                                  dict[wfg.Node, wfg.Node | None]]:
    """Hops to the nearest sink and the next node towards it, for every node of `within`."""
    pred = g._pred
    dist: dict[wfg.Node, int] = {}
    parent: dict[wfg.Node, wfg.Node | None] = {}
    todo: deque[wfg.Node] = deque()
    for s in sinks:
        if s in within and s not in dist:
            dist[s], parent[s] = 0, None
            todo.append(s)
    while todo:
        node = todo.popleft()
        for prev in pred[node]:
            if prev in within and prev not in dist:
                dist[prev], parent[prev] = dist[node] + 1, node
                todo.append(prev)
    return dist, parent


def _op_names(job: JobState, ranks: Iterable[RankState]) -> dict[tuple[str, int], str]:
    out: dict[tuple[str, int], str] = {}
    for rank in ranks:
        for op in rank.inflight:
            if not op.is_p2p:
                out.setdefault((op.group_id, op.seq), op.op)
    return out


def hang_view(wf: wfg.WaitForGraph, found: list[wfg.Sink], job: JobState, causes: list[dict[str, Any]],
              now: float, onset: float) -> dict[str, Any]:
    """The drawing of a hang / deadlock: condensed graph + timeline around `onset` (service time).

    The condensed graph is drawn once per graph and set of root causes (kept on `wf`: a
    standing hang reuses its graph pass after pass, graph.wait_for, and its incident is
    redrawn every few seconds; at 16k ranks the condensing was ~0.1-0.2 s); the timeline is
    drawn anew each time.
    """
    root_ranks = {c.get("rank") for c in causes if c.get("rank") is not None}
    kinds = {c.get("rank"): str(c.get("kind", "")) for c in causes}
    mark = (found, sorted(kinds.items(), key=str))
    if wf.drawn and wf.drawn[0] is mark[0] and wf.drawn[1] == mark[1]:
        graph, reach = wf.drawn[2], wf.drawn[3]
    else:
        graph, reach = _hang_graph(wf, found, job, root_ranks, kinds)
        wf.drawn[:] = [*mark, graph, reach]
    return {**graph, "timeline": hang_timeline(job, wf.graph, found, reach, root_ranks, now, onset)}


def _hang_graph(wf: wfg.WaitForGraph, found: list[wfg.Sink], job: JobState, root_ranks: set[Any],
                kinds: dict[Any, str]) -> tuple[dict[str, Any], set[wfg.Node]]:
    """hang_view's condensed graph, and the nodes the hung ranks reach."""
    g = wf.graph
    succ = g._succ
    waiting = {wfg.rank_node(r) for r in wf.waiting} & set(succ)
    reach = wfg._reachable(g, waiting)
    sink_nodes = [n for s in found for n in s.nodes]
    dist, parent = _to_sinks(g, sink_nodes, reach)
    for node in reach:  # nodes that reach no sink (should not happen once sinks() ran): park them at the end
        if node not in dist:
            dist[node], parent[node] = 0, None
    key: list[wfg.Node] = []
    for s in found[:8]:
        for n in [*s.nodes, *s.path, *s.longest]:
            if n in reach and n not in key:
                key.append(n)
    keyset = set(key)
    # the op of a drawn op node: from a rank waiting in it (O(drawn), not O(ranks))
    pred = g._pred
    op_name = _op_names(job, (job.ranks[p[1]] for n in key if n[0] == "c"
                              for p in itertools.islice(pred[n], 1) if p[0] == "r" and p[1] in job.ranks))
    targets: dict[wfg.Node, tuple[wfg.Node, int]] = {n: (n, 0) for n in key}

    def target(node: wfg.Node) -> tuple[wfg.Node, int]:
        """The next drawn node towards the sink and the hops to it (memoised along the way)."""
        trail: list[wfg.Node] = []
        cur: wfg.Node | None = node
        while cur is not None and cur not in targets:
            trail.append(cur)
            cur = parent.get(cur)
        end, hops = targets[cur] if cur is not None else (node, 0)
        for back in reversed(trail):
            hops += 1
            targets[back] = (end, hops)
        return targets[node]

    families: dict[str, str] = {}

    def fam(node: wfg.Node) -> str:
        if node[0] == "r":
            nxt = next(iter(succ[node]), None)  # the op it waits in says which kind of rank it is
            return "waiting in " + fam(nxt) if nxt is not None and nxt[0] != "r" else "rank"
        if node[0] == "c":
            if node[1] not in families:
                families[node[1]] = family(_group_name(job, node[1]))
            return families[node[1]]
        return "p2p"

    drawn: dict[wfg.Node, str] = {}
    nodes: list[dict[str, Any]] = []
    members: dict[str, list[int]] = {}
    by_agg: dict[tuple[Any, ...], str] = {}
    for n in key:
        nid = f"n{len(nodes)}"
        drawn[n] = nid
        nodes.append(_node(job, n, nid, dist.get(n, 0), n in sink_nodes, root_ranks, kinds, op_name))
    omitted = 0
    for n in sorted(reach - keyset, key=lambda x: (dist.get(x, 0), x[0], x[1])):
        tgt, hops = target(n)
        agg_key = (n[0], fam(n), hops, tgt)
        nid_or_none = by_agg.get(agg_key)
        if nid_or_none is None:
            if len(nodes) >= MAX_NODES:
                omitted += 1
                continue
            nid_or_none = by_agg[agg_key] = f"n{len(nodes)}"
            nodes.append({"id": nid_or_none, "type": {"r": "ranks", "c": "ops", "p": "p2ps"}[n[0]],
                          "family": fam(n), "count": 0, "dist": dist.get(n, 0), "root": False, "label": ""})
        drawn[n] = nid_or_none
        agg = nodes[int(nid_or_none[1:])]
        agg["count"] += 1
        agg.setdefault("first", n)
        if n[0] == "r":
            members.setdefault(nid_or_none, []).append(n[1])
        else:
            agg.setdefault("seqs", set()).add(n[-1])
    for i, agg in enumerate(nodes):
        if agg["type"] in ("ranks", "ops", "p2ps") and agg["count"] == 1:  # an aggregate of one: the node itself
            nodes[i] = _node(job, agg["first"], agg["id"], agg["dist"], False, root_ranks, kinds, op_name)
            continue
        if agg["type"] in ("ranks", "ops", "p2ps"):
            agg.pop("first", None)
            ranks = sorted(members.get(agg["id"], []))
            seqs = sorted(agg.pop("seqs", set()))
            if agg["type"] == "ranks":
                agg["ranks"] = ranks[:MAX_RANKS_LISTED]
                agg["label"] = f"{agg['count']} ranks ({_ranks_text(ranks)})"
                agg["sub"] = agg["family"]
            else:
                kind = "p2p ops" if agg["type"] == "p2ps" else f"{agg['family']} ops"
                agg["label"] = f"{agg['count']} {kind}"
                agg["sub"] = "seq " + (f"{seqs[0]}" if len(seqs) == 1 else f"{seqs[0]}-{seqs[-1]}") if seqs else ""
    counts: dict[tuple[str, str], int] = {}
    for u in reach:
        du = drawn.get(u)
        if du is None:
            continue
        for v in succ[u]:
            dv = drawn.get(v)
            if dv is None or dv == du:
                continue
            counts[(du, dv)] = counts.get((du, dv), 0) + 1
    edges = [{"from": a, "to": b, "count": c} for (a, b), c in sorted(counts.items())[:MAX_EDGES]]
    chain_ids = [[drawn[n] for n in s.longest if n in drawn] for s in found[:8]]
    return {
        "version": VERSION, "kind": "hang",
        "nodes": nodes, "edges": edges, "chains": chain_ids,
        "omitted_nodes": omitted, "omitted_edges": max(0, len(counts) - MAX_EDGES),
        "graph_nodes": g.number_of_nodes(), "graph_edges": wf.sizes[1] if wf.sizes else g.number_of_edges(),
        "waiting_ranks": len(wf.waiting),
    }, reach


def _node(job: JobState, n: wfg.Node, nid: str, dist: int, is_sink: bool, root_ranks: set[Any],
          kinds: dict[Any, str], op_name: dict[tuple[str, int], str]) -> dict[str, Any]:
    if n[0] == "r":
        rank = job.ranks.get(n[1])
        sub = kinds.get(n[1], "") if n[1] in root_ranks else ("waiting" if rank is not None and rank.inflight
                                                               else "")
        return {"id": nid, "type": "rank", "rank": n[1], "label": f"rank {n[1]}", "sub": sub,
                "host": rank.host if rank is not None else "", "count": 1, "dist": dist,
                "root": n[1] in root_ranks}
    if n[0] == "c":
        name = _group_name(job, n[1])
        group = job.groups.get(n[1])
        op = op_name.get((n[1], n[2]), "collective")
        return {"id": nid, "type": "op", "group": name, "group_id": n[1], "seq": n[2], "op": op,
                "size": group.size if group is not None else 0, "label": f"{op} {name}",
                "sub": f"seq {n[2]}", "count": 1, "dist": dist, "root": is_sink}
    return {"id": nid, "type": "p2p", "group_id": n[1], "src": n[2], "dst": n[3], "seq": n[4],
            "label": f"p2p {n[2]}->{n[3]}", "sub": f"seq {n[4]}", "count": 1, "dist": dist, "root": is_sink}


def _timeline_ranks(found: list[wfg.Sink], reach: set[wfg.Node], root_ranks: set[Any]) -> list[tuple[int, str]]:
    rows: list[tuple[int, str]] = []
    seen: set[int] = set()

    def add(rank: int, role: str) -> None:
        if rank not in seen and len(rows) < TIMELINE_ROWS:
            seen.add(rank)
            rows.append((rank, role))

    for r in sorted(r for r in root_ranks if isinstance(r, int)):
        add(r, "root")
    for s in found[:8]:
        for n in [*s.longest, *s.path]:
            if n[0] == "r":
                add(n[1], "chain")
    for r in heapq.nsmallest(TIMELINE_ROWS, (n[1] for n in reach if n[0] == "r")):
        add(r, "waiting")
    return rows


def hang_timeline(job: JobState, g: Any, found: list[wfg.Sink], reach: set[wfg.Node], root_ranks: set[Any],
                  now: float, onset: float) -> dict[str, Any]:
    """Per shown rank, per group: its last completed ops, what it has in flight, what it never issued."""
    blocked_by: dict[int, list[tuple[str, int]]] = {}
    for n in reach:
        if n[0] == "c":
            for blocker in g._succ[n]:
                if blocker[0] == "r":
                    blocked_by.setdefault(blocker[1], []).append((n[1], n[2]))
    rows = []
    for rank_id, role in _timeline_ranks(found, reach, root_ranks):
        rank = job.ranks.get(rank_id)
        ops: list[dict[str, Any]] = []
        if rank is not None:
            per_group: dict[str, int] = {}
            for start, end, gid, seq in reversed(rank.timeline):
                if per_group.get(gid, 0) >= TIMELINE_OPS_PER_GROUP:
                    continue
                per_group[gid] = per_group.get(gid, 0) + 1
                ops.append({"group": _group_name(job, gid) if seq >= 0 else f"p2p {_group_name(job, gid)}",
                            "seq": abs(seq), "start": round(start - onset, 3), "end": round(end - onset, 3),
                            "state": "done"})
            for op in rank.inflight:
                began = op.observed_at - op.age_s
                ops.append({"group": _group_name(job, op.group_id) if not op.is_p2p
                            else f"p2p {_group_name(job, op.group_id)}", "seq": op.seq, "op": op.op,
                            "start": round(began - onset, 3), "end": None, "state": "in_flight"})
        missing = [{"group": _group_name(job, gid), "seq": seq}
                   for gid, seq in sorted(set(blocked_by.get(rank_id, [])))[:8]]
        rows.append({"rank": rank_id, "role": role, "ops": sorted(ops, key=lambda o: o["start"]),
                     "missing": missing, "idle_s": round(rank.idle_at(now), 3) if rank is not None else None,
                     "status": "seen" if rank is not None else "never reported"})
    return {"origin": "onset", "onset_unix": round(onset, 3), "now": round(now - onset, 3), "rows": rows}



def _work_series(rank: RankState, t0: float) -> list[list[float]]:
    """(time, compute share) per heartbeat interval in which the rank completed ops."""
    out: list[list[float]] = []
    samples = list(rank.work)
    for (ta, ca, na), (tb, cb, nb) in itertools.pairwise(samples):
        if tb <= ta or nb <= na or na == 0:
            continue
        share = max(0.0, 1.0 - min(1.0, (cb - ca) / (tb - ta)))
        out.append([round(tb - t0, 3), round(share, 4)])
    return out[-WORK_POINTS:]


def _lag_series(job: JobState, shown: list[int], t0: float) -> dict[int, list[list[float]]]:
    """Per shown rank: how long after the first member it issued each recent collective of its groups."""
    want = set(shown)
    out: dict[int, list[list[float]]] = {r: [] for r in shown}
    for group in job.groups.values():
        if len(group.ranks) < 2 or not want.intersection(group.ranks):
            continue
        for seq in sorted(group.seqs)[-LAG_SEQS:]:
            starts = group.seqs[seq].starts
            if len(starts) < len(group.ranks):
                continue  # not everyone issued it yet: no lag to speak of
            first = min(starts.values())
            for r in want.intersection(starts):
                out[r].append([round(first - t0, 3), round(starts[r] - first, 4)])
    for r in out:
        out[r] = sorted(out[r])[-2 * LAG_SEQS:]
    return out


def slow_view(job: JobState, culprit: int | None, others: Iterable[int], now: float) -> dict[str, Any]:
    """The drawing of a slowdown: per rank, compute share per interval and arrival lag per collective."""
    shown: list[int] = []
    roles: dict[int, str] = {}
    if culprit is not None and culprit in job.ranks:
        shown.append(culprit)
        roles[culprit] = "root"
    for r in others:
        if r in job.ranks and r not in roles and len(shown) < TIMELINE_ROWS:
            shown.append(r)
            roles[r] = "waiting"
    for r in sorted(job.ranks):  # fill up with the rest, so "everyone else" is visible at small scale
        if len(shown) >= min(TIMELINE_ROWS, 16):
            break
        if r not in roles:
            shown.append(r)
            roles[r] = "peer"
    ends = [job.ranks[r].work[-1][0] for r in shown if job.ranks[r].work]
    t0 = max(ends) if ends else now  # the newest heartbeat of a shown rank: times are seconds before it
    lags = _lag_series(job, shown, t0)
    rows = []
    for r in shown:
        rank = job.ranks[r]
        series = _work_series(rank, t0)
        lag = lags.get(r, [])
        rows.append({"rank": r, "role": roles[r], "compute": series, "lag": lag,
                     "mean_compute": round(sum(p[1] for p in series) / len(series), 4) if series else None,
                     "mean_lag_s": round(sum(p[1] for p in lag) / len(lag), 4) if lag else None})
    return {"version": VERSION, "kind": "slowdown", "origin": "last heartbeat", "rows": rows,
            "ranks": len(job.ranks), "culprit": culprit}

