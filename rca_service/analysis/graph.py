"""The wait-for graph of a job: an edge A -> B means "A cannot progress until B does".

Nodes are ranks ("r", rank) and the ops they wait in ("c", group, seq) for collectives,
("p", group, src, dst, seq) for p2p. A waiting rank points at its op; the op points at
the members that block it (have not issued it, or are dead / gone). An op its peers have
finished (every other member completed the collective; the receiver completed the send)
is no wait: the rank's own completion is late to arrive (a wait the instrumentation could
not see end, e.g. funcol's C++ wait_tensor), and the rank gets no edge to it. Nor does a
collective whose call returned on this rank and that some member completed (every member
entered it): a rank in its own code still lists an op its C++ waits lazily. Nor does a
rank that posted its ops and waits on none (schema.ATTR_HB_POSTED_ONLY): it is in its own
code, and may be the sink its peers wait on. Routing through op
nodes keeps the graph O(ranks) even for a 16k-member group, and chains across groups
(TP -> DP -> ...) fall out of following edges. Root causes are the sinks reachable from
the hung ranks, or sink cycles (deadlock).
"""

from __future__ import annotations

import itertools
import operator
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np

from mycroft import schema

from ..config import AnalysisConfig
from ..ingest.state import InFlight, JobState, RankState
from .triggers import ALIVE, LOST, UNSEEN, HangSweep

Node = tuple[Any, ...]


def rank_node(rank: int) -> Node:
    return ("r", rank)


@dataclass(slots=True)
class WaitForGraph:
    graph: nx.DiGraph
    waiting: set[int]  # hung ranks the analysis starts from
    data_sinks: set[Node] = field(default_factory=set)  # ops everyone issued that do not complete
    sizes: list[int] = field(default_factory=list)  # [nodes, edges, rank nodes] once summary() counted them
    drawn: list[Any] = field(default_factory=list)  # graph_view.hang_view's condensed drawing of it, once drawn


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


def _unfinished_members(job: JobState, members: tuple[int, ...], gid: str, seq: int) -> list[int]:
    """The first two members that have not completed the collective (two tell whether anyone but
    a given rank is still in it); stops early, so a 16k-member op in a hang costs a few lookups."""
    found: list[int] = []
    ranks = job.ranks
    for m in members:
        rank = ranks.get(m)
        if rank is None or rank.completed.get(gid, 0) < seq:
            found.append(m)
            if len(found) == 2:
                break
    return found


def _peers_finished(unfinished: list[int], members: tuple[int, ...], me: int) -> bool:
    """Every member but `me` completed the op (a group we know no members of finished nothing)."""
    return bool(members) and (not unfinished or unfinished == [me])


def completed_by_a_member(job: JobState, members: Iterable[int], gid: str, seq: int) -> bool:
    """Some member completed the collective: every member entered it, so no one waits in it for a rank."""
    ranks = job.ranks
    for m in members:
        rank = ranks.get(m)
        if rank is not None and rank.completed.get(gid, 0) >= seq:
            return True
    return False


def received(job: JobState, gid: str, src: int, dst: int, seq: int) -> bool:
    """The receiver completed its recv of p2p seq `seq` from `src`: the data arrived."""
    receiver = job.ranks.get(dst)
    return receiver is not None and receiver.p2p_completed.get((gid, src, dst), 0) >= seq


def _receiver_finished(job: JobState, me: RankState, op: InFlight) -> bool:
    """The receiver of this send completed its recv: the data arrived, the send is done."""
    if op.op != schema.OP_SEND:
        return False  # a completed send does not say the data arrived (it may sit in a buffer)
    return received(job, op.group_id, me.rank, op.peer, op.seq)


def _graphed(job: JobState, status: dict[int, str], now: float, cfg: AnalysisConfig,
             fresh_after: float) -> list[RankState]:
    """The ranks that get outgoing edges: alive, an op in flight, a heartbeat neither late nor
    older than `fresh_after`."""
    ranks: list[RankState] = []
    heartbeats = job.heartbeats > 0
    intervals, slack = cfg.suspect_intervals, cfg.suspect_slack_s
    for rank in job.ranks.values():
        inflight = rank.inflight
        if not inflight or rank.posted_only or status.get(rank.rank) != ALIVE:
            continue
        last = rank.last_hb_at
        spoke = last or (rank.first_seen if heartbeats else 0.0)  # triggers.late(), inlined
        if (spoke and now - spoke > intervals * rank.hb_interval + slack) or (last and last < fresh_after):
            continue
        ranks.append(rank)
    return ranks


_INFLIGHT = operator.attrgetter("inflight")
_POSTED = operator.attrgetter("posted_only")
_SHAPE = operator.attrgetter("seq", "group_id", "peer", "op")  # what the graph reads of an op in flight
_FIRST = operator.itemgetter(0)


def _same_shape(ops: list[InFlight], before: list[InFlight]) -> bool:
    """The same ops in flight (what the graph reads of them; their ages may differ)."""
    if len(ops) != len(before):
        return False
    return all(_SHAPE(a) == _SHAPE(b) for a, b in zip(ops, before, strict=True))


@dataclass(slots=True)
class _Built:
    """One graph and what it was built from: the next pass reuses it while none of that changed."""

    cfg: AnalysisConfig
    ranks: list[RankState]  # the job's rank objects (a restarted process is a new object)
    status: dict[int, str]
    graphed: list[RankState]  # the ranks with edges out ...
    inflight: list[list[InFlight]]  # ... and their ops in flight as last seen (the fold replaces the list)
    groups: list[tuple[str, Any, tuple[int, ...]]]  # (group id, its GroupState or None, its members) per op node
    blockers: list[tuple[Node, int, InFlight | None]]  # (op node, blocking member, the p2p op) per edge out of an op
    # the rank -> op edges kept: (op node, a peer that had not finished the op) -> the p2p op; while that
    # peer has not, the edges stand (a finished op stays finished: completions only grow). Keyed, so a
    # 16k-rank hang in one op checks its two witnesses, not 16k edges
    unfinished: dict[tuple[Node, int], InFlight | None]
    wf: WaitForGraph
    epochs: Any = None  # rank_table's shape epochs of `graphed` when it was checked (or built)
    waiting: set[int] | frozenset[int] = field(default_factory=set)  # of the last sinks() over it ...
    found: list[Sink] = field(default_factory=list)  # ... and their result


def build(job: JobState, status: dict[int, str], waiting: Iterable[int], now: float,
          cfg: AnalysisConfig, fresh_after: float = 0.0) -> WaitForGraph:
    """Edges from every rank with an op in flight; analysis starts from `waiting`.

    A rank whose last heartbeat is late, or older than `fresh_after` (when the waiting
    began), gets no outgoing edges: what it was waiting for is a stale snapshot, so it ends
    up a sink whose liveness the verdict then decides.
    """
    return _build(job, status, waiting, cfg, _graphed(job, status, now, cfg, fresh_after)).wf


def _issued_beyond(job: JobState, members: tuple[int, ...], gid: str, seq: int, memo: dict[Node, bool],
                   node: Node) -> bool:
    """A member of the group issued a collective after `seq` (memoized per op node: a 16k-rank hang in
    one op looks once)."""
    found = memo.get(node)
    if found is None:
        ranks = job.ranks
        found = memo[node] = any(rank.issued.get(gid, 0) > seq for rank in map(ranks.get, members)
                                 if rank is not None)
    return found


def _build(job: JobState, status: dict[int, str], waiting: Iterable[int], cfg: AnalysisConfig,
           graphed: list[RankState]) -> _Built:
    edges: list[tuple[Node, Node]] = []
    blockers_cache: dict[Node, list[int]] = {}
    op_nodes: set[Node] = set()
    groups: list[tuple[str, Any, tuple[int, ...]]] = []
    blocked: list[tuple[Node, int, InFlight | None]] = []
    unfinished: dict[tuple[Node, int], InFlight | None] = {}
    left: dict[Node, tuple[tuple[int, ...], list[int]]] = {}  # op node -> its members, the first unfinished
    beyond: dict[Node, bool] = {}  # op node -> a member issued a later op of its group
    for rank in graphed:
        me = rank_node(rank.rank)
        for op in rank.inflight:
            if op.is_p2p:
                if _receiver_finished(job, rank, op):
                    continue
                src, dst = (rank.rank, op.peer) if op.op == schema.OP_SEND else (op.peer, rank.rank)
                node: Node = ("p", op.group_id, src, dst, op.seq)
                unfinished[node, op.peer] = op
                edges.append((me, node))
                op_nodes.add(node)
                if _p2p_blocker(job, rank, op, status):
                    edges.append((node, rank_node(op.peer)))
                    blocked.append((node, rank.rank, op))
                continue
            node = ("c", op.group_id, op.seq)
            if node not in left:
                group = job.groups.get(op.group_id)
                members = group.ranks if group is not None else ()
                groups.append((op.group_id, group, members))
                left[node] = members, _unfinished_members(job, members, op.group_id, op.seq)
            members, not_done = left[node]
            if _peers_finished(not_done, members, rank.rank):
                continue
            if rank.device_async:
                pass  # NCCL: a returned op is in flight on the device until the rank says it completed
            elif op.returned and completed_by_a_member(job, members, op.group_id, op.seq):
                # this rank is not inside the call, and a member finished the op (so all entered it): the
                # rank's completion is one it cannot see (a C++ wait that is lazy, as DDP's unused-parameter
                # all-reduce; gloo's Flight Recorder marks an op completed only when it is waited), no wait
                continue
            elif op.returned and _issued_beyond(job, members, op.group_id, op.seq, beyond, node):
                # nor while a member issued a later op of the group: the members wait in that one (or are
                # not inside any call), and this op's completion may only show at its lazy wait (DDP's
                # unused-parameter all-reduce is waited in the next backward: until then, every member
                # reads in flight in it, and a rank blocked between forward and backward read as a link)
                continue
            unfinished[node, next(m for m in not_done if m != rank.rank) if members else -1] = None
            edges.append((me, node))
            op_nodes.add(node)
            if node in blockers_cache:
                continue
            blockers = [m for m in members if m != rank.rank
                        and _blocks_collective(job, m, status.get(m, UNSEEN), op.group_id, op.seq)]
            blockers_cache[node] = blockers
            edges.extend((node, rank_node(m)) for m in blockers)
            blocked.extend((node, m, None) for m in blockers)
    g = nx.DiGraph()
    g.add_edges_from(edges)
    wf = WaitForGraph(graph=g, waiting=set(waiting))
    wf.data_sinks = {n for n in op_nodes if not g._succ[n]}
    return _Built(cfg, list(job.ranks.values()), status, graphed, list(map(_INFLIGHT, graphed)), groups, blocked,
                  unfinished, wf)


def _still_holds(job: JobState, status: dict[int, str], cfg: AnalysisConfig, built: _Built,
                 graphed: list[RankState], epochs: Any = None) -> bool:
    """Whether `built` is the graph build() would make now.

    The same rank objects with the same statuses, the same of them graphed, with the same
    ops in flight give the same rank -> op edges; a rank's ops are compared only when its
    list is another object than last time (the fold replaces it with every heartbeat, and
    a pass sees a few of the 16k heartbeats of a second). An op's blockers are members that
    have not completed it and are dead or have not issued it; frontiers only grow (a restart
    is a new rank object), so a member that did not block cannot start to without a status
    change: only the edges out of op nodes need a second look (and the groups, whose members
    may have become known).
    """
    if built.cfg is not cfg or built.status != status or len(built.ranks) != len(job.ranks) or \
            not all(map(operator.is_, built.ranks, job.ranks.values())) or (graphed is not built.graphed and (
                len(graphed) != len(built.graphed) or not all(map(operator.is_, graphed, built.graphed)))):
        return False
    if epochs is not None and built.epochs is not None:  # the rank table counted every change of shape
        if not np.array_equal(epochs, built.epochs):
            return False
        return _blockers_hold(job, status, built)
    lists = list(map(_INFLIGHT, graphed))
    before = built.inflight
    changed = list(itertools.compress(range(len(lists)), map(operator.is_not, lists, before)))
    now_ops, then_ops = [lists[i] for i in changed], [before[i] for i in changed]
    if changed and set(map(len, now_ops)) == {1} == set(map(len, then_ops)):  # one op each: compared in C
        if list(map(_SHAPE, map(_FIRST, now_ops))) != list(map(_SHAPE, map(_FIRST, then_ops))):
            return False
    elif not all(map(_same_shape, now_ops, then_ops)):
        return False
    built.inflight = lists  # the same shapes: the next pass compares with these lists
    built.epochs = epochs
    return _blockers_hold(job, status, built)


def _blockers_hold(job: JobState, status: dict[int, str], built: _Built) -> bool:
    """The groups of the op nodes are the same, every op a rank was given an edge to is still
    unfinished by the peer that showed it, and every edge out of an op node still blocks."""
    groups = job.groups
    if not all(groups.get(gid) is group and (group is None or group.ranks is members)
               for gid, group, members in built.groups):
        return False
    ranks = job.ranks
    for (node, peer), op in built.unfinished.items():
        if op is not None:
            if op.op == schema.OP_SEND and received(job, *node[1:]):
                return False
            continue
        rank = ranks.get(peer)  # None: never reported (its first report changes the rank objects, which rebuilds)
        if rank is not None and rank.completed.get(node[1], 0) >= node[2]:
            return False
    for node, member, op in built.blockers:
        if op is None:
            if not _blocks_collective(job, member, status.get(member, UNSEEN), node[1], node[2]):
                return False
        elif not _p2p_blocker(job, ranks[member], op, status):
            return False
    return True


def wait_for(job: JobState, status: dict[int, str], waiting: Iterable[int], now: float, cfg: AnalysisConfig,
             fresh_after: float = 0.0, sweep: HangSweep | None = None) -> tuple[WaitForGraph, list[Sink]]:
    """build() and sinks(), reusing the last pass's graph (job.memo) while its inputs hold.

    A hang freezes the frontier: pass after pass, 16k ranks report the same ops in flight,
    and rebuilding their graph was most of a pass. What is checked instead is one sweep
    over the ranks (who gets edges, with which ops) and the edges out of op nodes; the
    trigger's sweep (triggers.hang_sweep) already found who gets edges when it saw every
    rank with an op in flight and none of them is older than `fresh_after`.
    """
    waiting = waiting if isinstance(waiting, set | frozenset) else set(waiting)
    if sweep is not None and sweep.watched is not None and sweep.oldest_heartbeat >= fresh_after:
        graphed = sweep.watched
        if any(map(_POSTED, graphed)):  # in their own code: no edges (a new list: the memo compares members)
            graphed = [rank for rank in graphed if not rank.posted_only]
    else:
        graphed = _graphed(job, status, now, cfg, fresh_after)
    epochs = sweep.epochs if sweep is not None and graphed is sweep.watched else None
    built = job.memo.get("wait_for")
    if built is None or not _still_holds(job, status, cfg, built, graphed, epochs):
        built = job.memo["wait_for"] = _build(job, status, waiting, cfg, graphed)
        built.epochs = epochs
        built.found = sinks(built.wf)
        built.waiting = waiting
    elif built.waiting is not waiting and built.waiting != waiting:
        old = built.wf
        built.wf = WaitForGraph(old.graph, set(waiting), old.data_sinks, old.sizes)
        built.found = sinks(built.wf)
        built.waiting = waiting
    return built.wf, built.found


def _reachable(g: nx.DiGraph, sources: Iterable[Node]) -> set[Node]:
    succ = g._succ
    seen: set[Node] = set()
    todo = deque(s for s in sources if s in succ)
    seen.update(todo)
    while todo:
        node = todo.popleft()
        for nxt in succ[node]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


@dataclass(slots=True)
class Sink:
    nodes: list[Node]  # one node, or the members of a sink cycle
    path: list[Node] = field(default_factory=list)  # a shortest wait chain from a hung rank into the sink
    longest: list[Node] = field(default_factory=list)  # the farthest hung rank's chain: how far it spread
    blast: int = 0  # hung ranks that wait on it (each counted for its nearest sink)


def sinks(wf: WaitForGraph, max_sinks: int = 64) -> list[Sink]:
    """Sink nodes and sink cycles reachable from the waiting ranks, most blocking first.

    O(nodes + edges): one forward sweep for what the hung ranks wait on, one reverse
    multi-source sweep from the sinks that attributes every hung rank to its nearest sink.
    Only nodes that reach no sink can sit in a sink cycle; networkx condenses just those.
    """
    g = wf.graph
    succ, pred = g._succ, g._pred
    # a hung rank whose ops its peers all finished waits on nothing: it may be a sink itself
    waiting = {node for node in map(rank_node, wf.waiting) if succ.get(node)}
    reach = _reachable(g, waiting)
    targets: list[Sink] = []
    owner: dict[Node, int] = {}
    # sinks in a fixed order (sets iterate in string-hash order, which differs per process): the
    # first of two equally near sinks gets the ranks waiting on both, the same in every run
    for node in sorted((n for n in reach if not succ[n] and n not in waiting), key=str):
        owner[node] = len(targets)
        targets.append(Sink(nodes=[node]))
    unresolved = [n for n in reach if n not in owner]
    parent: dict[Node, Node | None] = {n: None for n in owner}
    # cycles: reachable nodes that reach no sink node hold the sink cycles
    reaches_sink = _reverse_closure(pred, set(owner), reach)
    trapped = sorted((n for n in unresolved if n not in reaches_sink), key=str)
    if trapped:
        sub = nx.DiGraph(g.subgraph(trapped))
        cond = nx.condensation(sub)
        for comp in cond.nodes:
            if cond.out_degree(comp):
                continue
            members = sorted(cond.nodes[comp]["members"], key=str)
            if len(members) == 1 and not succ[members[0]]:
                continue
            index = len(targets)
            targets.append(Sink(nodes=members))
            for m in members:
                owner[m] = index
                parent[m] = None
    # reverse BFS from every sink at once: nearest-sink attribution, chains and blast
    todo = deque(n for n in owner)
    while todo:
        node = todo.popleft()
        for prev in pred[node]:
            if prev in reach and prev not in owner:
                owner[prev] = owner[node]
                parent[prev] = node
                todo.append(prev)
    nearest: dict[int, Node] = {}
    farthest: dict[int, Node] = {}
    blast: dict[int, int] = {}
    order = {n: i for i, n in enumerate(owner)}  # BFS order: later = farther
    for node in sorted(waiting & set(owner), key=order.__getitem__):
        i = owner[node]
        if node in targets[i].nodes:
            continue
        blast[i] = blast.get(i, 0) + 1
        nearest.setdefault(i, node)
        farthest[i] = node
    for i, sink in enumerate(targets):
        sink.blast = blast.get(i, 0)
        sink.path = _walk(parent, nearest.get(i)) or sink.nodes[:1]
        sink.longest = _walk(parent, farthest.get(i)) or sink.nodes[:1]
    targets.sort(key=lambda s: (-s.blast, str(s.nodes)))
    return targets[:max_sinks]


def _reverse_closure(pred: Any, starts: set[Node], within: set[Node]) -> set[Node]:
    seen = set(starts)
    todo = deque(starts)
    while todo:
        node = todo.popleft()
        for prev in pred[node]:
            if prev in within and prev not in seen:
                seen.add(prev)
                todo.append(prev)
    return seen


def _walk(parent: dict[Node, Node | None], start: Node | None) -> list[Node]:
    if start is None:
        return []
    path = [start]
    nxt = parent.get(start)
    while nxt is not None:
        path.append(nxt)
        nxt = parent.get(nxt)
    return path


def describe(node: Node, job: JobState) -> str:
    if node[0] == "r":
        return f"rank {node[1]}"
    if node[0] == "c":
        group = job.groups.get(node[1])
        name = group.label if group is not None else node[1]
        return f"[group {name} seq {node[2]}]"
    return f"[p2p {node[2]}->{node[3]} seq {node[4]}]"


def summary(wf: WaitForGraph, found: list[Sink], job: JobState, limit: int = 16) -> dict[str, Any]:
    """What the API shows: sizes, sinks, cycles and the chains that lead to them."""
    g = wf.graph
    if not wf.sizes:  # counted once per graph (a memoized graph is summarized every pass)
        wf.sizes[:] = [g.number_of_nodes(), len(g.edges), sum(1 for n in g._node if n[0] == "r")]
    return {
        "nodes": wf.sizes[0],
        "edges": wf.sizes[1],
        "ranks": wf.sizes[2],
        "waiting_ranks": len(wf.waiting),
        "sinks": [[describe(n, job) for n in s.nodes] for s in found[:limit]],
        "cycles": [[describe(n, job) for n in s.nodes] for s in found[:limit] if len(s.nodes) > 1],
        "chains": [" -> ".join(describe(n, job) for n in s.path) for s in found[:limit]],
        "longest_chains": [" -> ".join(describe(n, job) for n in s.longest) for s in found[:limit]],
    }


def lost_status(status: str) -> bool:
    return status in (LOST, UNSEEN)
