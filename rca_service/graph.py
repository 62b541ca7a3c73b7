"""The wait-for graph of a job: an edge A -> B means "A cannot progress until B does".

Nodes are ranks ("r", rank) and the ops they wait in ("c", group, seq) for collectives,
("p", group, src, dst, seq) for p2p. A waiting rank points at its op; the op points at
the members that block it (have not issued it, or are dead / gone). Routing through op
nodes keeps the graph O(ranks) even for a 16k-member group, and chains across groups
(TP -> DP -> ...) fall out of following edges. Root causes are the sinks reachable from
the hung ranks, or sink cycles (deadlock).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from mycroft import schema

from .state import InFlight, JobState, RankState
from .triggers import ALIVE, LOST, UNSEEN

Node = tuple[Any, ...]


def rank_node(rank: int) -> Node:
    return ("r", rank)


@dataclass(slots=True)
class WaitForGraph:
    graph: nx.DiGraph
    waiting: set[int]  # hung ranks the analysis starts from
    data_sinks: set[Node] = field(default_factory=set)  # ops everyone issued that do not complete


def _blocks_collective(job: JobState, member: int, status: str, gid: str, seq: int) -> bool:
    rank = job.ranks.get(member)
    if rank is None:
        return True  # never reported: cannot have issued
    if rank.completed.get(gid, 0) >= seq:
        return False
    if status != ALIVE:
        return True
    return rank.issued.get(gid, 0) < seq


def _p2p_blocker(job: JobState, me: RankState, op: InFlight, status: dict[int, str]) -> bool:
    """Whether the peer of an in-flight p2p op has not issued its matching half."""
    peer = job.ranks.get(op.peer)
    if peer is None or status.get(op.peer, UNSEEN) != ALIVE:
        return True
    key = (op.group_id, op.peer, me.rank) if op.op == schema.OP_RECV else (op.group_id, me.rank, op.peer)
    return peer.p2p_issued.get(key, 0) < op.seq


def build(job: JobState, status: dict[int, str], waiting: Iterable[int]) -> WaitForGraph:
    """Edges from every rank with an op in flight; analysis starts from `waiting`."""
    g = nx.DiGraph()
    wf = WaitForGraph(graph=g, waiting=set(waiting))
    blockers_cache: dict[Node, list[int]] = {}
    for rank in job.ranks.values():
        if status.get(rank.rank) != ALIVE or not rank.inflight:
            continue
        me = rank_node(rank.rank)
        for op in rank.inflight:
            if op.is_p2p:
                src, dst = (rank.rank, op.peer) if op.op == schema.OP_SEND else (op.peer, rank.rank)
                node: Node = ("p", op.group_id, src, dst, op.seq)
                g.add_edge(me, node, op=op.op)
                if _p2p_blocker(job, rank, op, status):
                    g.add_edge(node, rank_node(op.peer))
                elif g.out_degree(node) == 0:
                    wf.data_sinks.add(node)
                continue
            node = ("c", op.group_id, op.seq)
            g.add_edge(me, node, op=op.op)
            if node in blockers_cache:
                continue
            group = job.groups.get(op.group_id)
            members = group.ranks if group is not None else ()
            blockers = [m for m in members if m != rank.rank
                        and _blocks_collective(job, m, status.get(m, UNSEEN), op.group_id, op.seq)]
            blockers_cache[node] = blockers
            for m in blockers:
                g.add_edge(node, rank_node(m))
            if not blockers:
                wf.data_sinks.add(node)
    for node in list(wf.data_sinks):
        if g.out_degree(node):
            wf.data_sinks.discard(node)
    return wf


def _reachable(g: nx.DiGraph, sources: Iterable[Node]) -> set[Node]:
    seen: set[Node] = set()
    todo = deque(s for s in sources if s in g)
    seen.update(todo)
    while todo:
        node = todo.popleft()
        for nxt in g.successors(node):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


@dataclass(slots=True)
class Sink:
    nodes: list[Node]  # one node, or the members of a sink cycle
    path: list[Node]  # a shortest wait chain from a hung rank into the sink
    longest: list[Node]  # the longest shortest-chain: how far the blockage has spread (TP -> DP -> ...)
    blast: int  # hung ranks that (transitively) wait on it


def sinks(wf: WaitForGraph, max_sinks: int = 64) -> list[Sink]:
    """Sink nodes and sink cycles reachable from the waiting ranks, most blocking first."""
    g = wf.graph
    sources = [rank_node(r) for r in wf.waiting]
    reach = _reachable(g, sources)
    if not reach:
        return []
    sub = g.subgraph(reach)
    cond = nx.condensation(sub)
    members: dict[int, list[Hashable]] = {n: list(cond.nodes[n]["members"]) for n in cond.nodes}
    found: list[Sink] = []
    waiting_nodes = set(sources)
    for comp in cond.nodes:
        if cond.out_degree(comp):
            continue
        nodes = sorted(members[comp], key=str)
        if len(nodes) == 1 and nodes[0] in waiting_nodes and g.out_degree(nodes[0]) == 0:
            continue  # a waiting rank with nothing known to wait on
        found.append(Sink(nodes=nodes, path=[], longest=[], blast=0))  # type: ignore[arg-type]
    found = found[: max_sinks]
    for sink in found:
        sink.path, sink.longest, sink.blast = _chain(sub, set(sink.nodes), waiting_nodes)
    found.sort(key=lambda s: (-s.blast, str(s.nodes)))
    return found


def _chain(g: nx.DiGraph, targets: set[Node], waiting: set[Node]) -> tuple[list[Node], list[Node], int]:
    """Reverse BFS from a sink: the nearest and the farthest waiting rank's chains, how many wait on it."""
    parent: dict[Node, Node | None] = {t: None for t in targets}
    todo = deque(targets)
    nearest: Node | None = None
    farthest: Node | None = None
    blast = 0
    while todo:
        node = todo.popleft()
        if node in waiting and node not in targets:
            blast += 1
            farthest = node
            if nearest is None:
                nearest = node
        for prev in g.predecessors(node):
            if prev not in parent:
                parent[prev] = node
                todo.append(prev)

    def walk(start: Node | None) -> list[Node]:
        if start is None:
            return list(targets)[:1]
        path = [start]
        while parent[path[-1]] is not None:
            path.append(parent[path[-1]])  # type: ignore[arg-type]
        return path

    return walk(nearest), walk(farthest), blast


def describe(node: Node, job: JobState) -> str:
    if node[0] == "r":
        return f"rank {node[1]}"
    if node[0] == "c":
        group = job.groups.get(node[1])
        name = group.name if group is not None and group.name else node[1]
        return f"[group {name} seq {node[2]}]"
    return f"[p2p {node[2]}->{node[3]} seq {node[4]}]"


def summary(wf: WaitForGraph, found: list[Sink], job: JobState, limit: int = 16) -> dict[str, Any]:
    """What the API shows: sizes, sinks, cycles and the chains that lead to them."""
    g = wf.graph
    ranks = [n for n in g.nodes if n[0] == "r"]
    return {
        "nodes": g.number_of_nodes(),
        "edges": g.number_of_edges(),
        "ranks": len(ranks),
        "waiting_ranks": len(wf.waiting),
        "sinks": [[describe(n, job) for n in s.nodes] for s in found[:limit]],
        "cycles": [[describe(n, job) for n in s.nodes] for s in found[:limit] if len(s.nodes) > 1],
        "chains": [" -> ".join(describe(n, job) for n in s.path) for s in found[:limit]],
        "longest_chains": [" -> ".join(describe(n, job) for n in s.longest) for s in found[:limit]],
    }


def lost_status(status: str) -> bool:
    return status in (LOST, UNSEEN)
