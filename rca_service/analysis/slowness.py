"""Who makes the job slow: the rank whose own compute grew, not the one that arrived last.

In a TP x PP x DP job lateness propagates: a slow rank makes its TP peer wait, that peer
arrives late at its DP all-reduce, its DP peers arrive late at their pipeline sends...
Arrival order convicts the whole replica. What does not propagate is *compute*: every
heartbeat says how long the rank had an op in flight so far (`mycroft.hb.comm_s`), on its
own clock, so per interval each rank splits into compute and wait. The straggler is the
rank whose compute share grew while everyone else's wait grew; a persistently slower rank
is one that computes more than the peers it shares a collective group with (same stage,
same work). Only intervals in which the rank completed ops count: a pause (checkpoint,
evaluation) is not slowness, and the hang path reports it.

Pure functions of the job state.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import AnalysisConfig
from ..ingest.state import JobState, RankState
from .work_table import Windows, WorkTable, WorkWindow, work_table, work_window

__all__ = ["Straggle", "WorkWindow", "find_straggle", "job_slowdown", "job_wait_growth", "peer_groups",
           "work_window"]


@dataclass(slots=True)
class Straggle:
    rank: int
    mode: str  # "onset": its own compute grew; "imbalance": it computes more than its peers
    excess: float  # compute share above its baseline (onset) or its peers (imbalance)
    persistence: float  # share of recent intervals that show it
    slowdown: float  # job op rate, baseline / recent (1.0 = not slower)
    own: WorkWindow
    peers: list[int] = field(default_factory=list)
    victims: list[dict[str, object]] = field(default_factory=list)


def peer_groups(job: JobState) -> dict[int, list[frozenset[int]]]:
    """Ranks that do the same work: each rank's minimal collective groups (its peers are their union).

    A group that strictly contains another group of the job (the world group of a 3D job)
    mixes pipeline stages; TP and DP groups do not. Kept as groups, not as per-rank peer
    sets: at 16k ranks a DP group has 2k members, and a set per rank would be 33M entries.
    """
    # groups that ran collectives (pipeline p2p groups span stages: their members do different work);
    # that set only grows (members are set once, seq windows never empty): memoized on its size
    ran = [g for g in job.groups.values() if len(g.ranks) >= 2 and g.seqs]
    found = job.memo.get("peer_groups")
    if found is not None and found[0] == len(ran):
        return found[1]
    out: dict[int, list[frozenset[int]]] = defaultdict(list)
    for members in _minimal({frozenset(g.ranks) for g in ran}):
        for r in members:
            out[r].append(members)
    job.memo["peer_groups"] = (len(ran), out)
    return out


def _minimal(groups: set[frozenset[int]]) -> list[frozenset[int]]:
    """The groups that strictly contain no other group, smallest first.

    A group inside `g` has its smallest member in `g`: only the groups whose smallest member is
    one of g's are compared (all pairs was 16M subset tests for 4k groups at 16k ranks, 0.35 s,
    and the memo above turns over each time another DP group's first sampled collective lands).
    """
    by_least: dict[int, list[frozenset[int]]] = defaultdict(list)
    for g in groups:
        if g:
            by_least[min(g)].append(g)
    return sorted((g for g in groups if not any(o < g for m in g for o in by_least.get(m, ()))), key=len)


def _median_floor(values: list[float]) -> float:
    """A floor of the median of `values` (sorted) with any one of them removed."""
    return values[(len(values) - 2) // 2] if len(values) >= 2 else math.inf


def _victims(job: JobState, windows: dict[int, WorkWindow], culprit: int, limit: int = 8) -> list[dict[str, object]]:
    """Who waited more, and in which group (from their recent completed ops)."""
    out = []
    for r, w in windows.items():
        if r == culprit:
            continue
        if culprit in windows and not math.isnan(w.base):
            extra_wait = w.base - w.recent  # compute share down = wait share up
        else:  # no baseline: how much more it waits than the culprit
            extra_wait = windows[culprit].recent - w.recent if culprit in windows else 0.0
        if extra_wait <= 0.01:
            continue
        rank = job.ranks[r]
        t0, t1 = w.recent_span
        per_group: dict[str, float] = defaultdict(float)
        for start, end, gid, seq in rank.timeline:
            if end >= t0 and start <= t1:
                per_group[gid if seq >= 0 else f"p2p:{gid}"] += end - start
        where = max(per_group, key=per_group.__getitem__) if per_group else ""
        group = job.groups.get(where.removeprefix("p2p:"))
        name = (group.name or where) if group is not None else where
        out.append({"rank": r, "extra_wait_share": round(extra_wait, 3),
                    "waited_most_in": ("p2p " if where.startswith("p2p:") else "group ") + name if where else ""})
    out.sort(key=lambda v: -float(v["extra_wait_share"]))  # type: ignore[arg-type]
    return out[:limit]


def _aligned_gaps(own: WorkWindow, others: list[WorkWindow]) -> list[float]:
    """Per recent interval: the rank's compute share minus the others' median (aligned from the end)."""
    out = []
    for i in range(1, len(own.recent_intervals) + 1):
        theirs = [w.recent_intervals[-i] for w in others if len(w.recent_intervals) >= i]
        if theirs:
            out.append(own.recent_intervals[-i] - statistics.median(theirs))
    return out


def _persistence(values: list[float], floor: float) -> float:
    return sum(v > floor for v in values) / len(values) if values else 0.0


def job_wait_growth(job: JobState, cfg: AnalysisConfig) -> tuple[float, float] | None:
    """(median drop of the ranks' compute share, op-rate slowdown) over the recent window, if known.

    A transport slowdown makes every rank wait more; without that, slower intervals between a
    group's collectives are noise (small ops after an evaluation phase, say).
    """
    w = work_table(job, cfg).windows(cfg.slow_recent_beats)
    based = w.ok & ~np.isnan(w.base)
    if np.count_nonzero(based) < 2:
        return None
    drop = _median(w.base[based] - w.recent[based])
    recent_rate = _median(w.recent_rate[based])
    base_rate = _median(w.base_rate[based])
    return drop, (base_rate / recent_rate if recent_rate > 0 else 1.0)


def _median(values: np.ndarray) -> float:
    """statistics.median of the values (the middle one, or the mean of the middle two)."""
    return float(np.median(values))


def _rates(w: Windows) -> tuple[float, float] | None:
    """Job op rate (median over the ranks): over the baseline, and recently; None without a baseline."""
    based = w.ok & ~np.isnan(w.base)
    if not w.ok.any() or not based.any():
        return None
    return _median(w.base_rate[based]), _median(w.recent_rate[w.ok])


def _slowdown(w: Windows) -> float:
    """Job op rate, baseline over recent (medians over the ranks; 1.0 without a baseline)."""
    rates = _rates(w)
    if rates is None:
        return 1.0
    base_rate, recent_rate = rates
    return base_rate / recent_rate if recent_rate > 0 else 1.0


HELD_RATE = "held_rate"  # job.memo: (the job's op rate before it slowed, since when it is held)


def job_slowdown(job: JobState, cfg: AnalysisConfig, beats: int) -> float:
    """How much slower the job completes ops over its last `beats` intervals than before it slowed.

    The baseline window slides: a slowdown that lasts (a NIC capped to a third of its bandwidth)
    fills it with slow intervals, and within ~5 intervals the job "is not slower" while its link
    still paces it. So once the job runs `cfg.straggle_min_slowdown` slower, the rate it ran at
    before is held (job.memo) and measured against, for at most `cfg.slow_baseline_hold_s`, until
    the job is back to that pace; a baseline that is faster than the held one replaces it.
    """
    rates = _rates(work_table(job, cfg).windows(beats))
    if rates is None:
        return 1.0
    base_rate, recent_rate = rates
    held = job.memo.get(HELD_RATE)
    if held is not None and (held[0] <= base_rate or not 0.0 <= job.last_seen - held[1] <= cfg.slow_baseline_hold_s):
        held = None
    reference = held[0] if held is not None else base_rate
    slowdown = reference / recent_rate if recent_rate > 0 else 1.0
    if slowdown < cfg.straggle_min_slowdown:
        job.memo.pop(HELD_RATE, None)
    elif held is None:
        job.memo[HELD_RATE] = (base_rate, job.last_seen)
    return slowdown


def _onset(job: JobState, cfg: AnalysisConfig, beats: int, min_growth: float, min_slowdown: float,
           min_persistence: float) -> Straggle | None:
    """A rank whose compute share held or grew while everyone else's fell (they wait on it)."""
    w = work_table(job, cfg).windows(beats)
    rows = np.flatnonzero(w.ok & ~np.isnan(w.base))  # ranks with a window and its baseline, job order
    if len(rows) < 2:
        return None
    slowdown = _slowdown(w)
    growth = w.recent[rows] - w.base[rows]
    top = int(np.argmax(growth))  # the first of the largest, as max() over the ranks in job order
    rest = np.delete(np.arange(len(rows)), top)
    spread = float(growth[top]) - _median(growth[rest])
    if growth[top] < -min_growth / 3 or spread < min_growth or slowdown < min_slowdown:
        return None
    own = w.window(int(rows[top]))
    assert own is not None
    base_gap = own.base - _median(w.base[rows[rest]])
    others = [x for r in rows[rest].tolist() if (x := w.window(r)) is not None]
    gaps = _aligned_gaps(own, others)
    persistence = _persistence([g - base_gap for g in gaps], spread / 2)
    if persistence < min_persistence:
        return None
    return Straggle(own.rank, "onset", spread, persistence, slowdown, own, victims=_victims(job, w.as_dict(), own.rank))


@dataclass(slots=True)
class _PeerRows:
    """peer_groups() as rows of the work table: its groups bucketed by size, per row a flag."""

    groups: Any  # the peer_groups() result this was built from
    ranks: list[RankState]  # the table's ranks it was built for ...
    rows: int  # ... and how many they were
    buckets: list[np.ndarray]  # (groups of that size, size) member rows; len(ranks) for a rank with no row
    grouped: np.ndarray  # bool per row: the rank has minimal groups
    disjoint: np.ndarray  # bool per row: its groups share no one but itself


def _peer_rows(job: JobState, table: WorkTable, groups: dict[int, list[frozenset[int]]]) -> _PeerRows:
    found = job.memo.get("peer_rows")
    if isinstance(found, _PeerRows) and found.groups is groups and found.ranks is table.ranks and \
            found.rows == len(table.ranks):
        return found
    missing = len(table.ranks)
    sizes: dict[int, list[list[int]]] = defaultdict(list)
    for g in {g for mine in groups.values() for g in mine}:
        sizes[len(g)].append([table.row_of.get(p, missing) for p in g])
    grouped = np.zeros(missing, dtype=bool)
    disjoint = np.zeros(missing, dtype=bool)
    for rank, mine in groups.items():
        row = table.row_of.get(rank)
        if row is not None and mine:
            grouped[row] = True
            disjoint[row] = all(len(a & b) <= 1 for a, b in itertools.combinations(mine, 2))
    rows = _PeerRows(groups, table.ranks, missing, [np.asarray(m, dtype=np.int64) for m in sizes.values()],
                     grouped, disjoint)
    job.memo["peer_rows"] = rows
    return rows


def _lowest_floors(w: Windows, peers: _PeerRows) -> np.ndarray:
    """Per row: the lowest _median_floor over its groups of their members' recent compute shares."""
    recent = np.append(w.recent, np.nan)  # the slot of members without a row: no window
    lowest = np.full(len(recent), np.inf)
    for members in peers.buckets:
        values = np.sort(recent[members], axis=1)  # nan (no window) sorts last
        counts = np.count_nonzero(~np.isnan(values), axis=1)
        at = np.maximum(counts - 2, 0) // 2
        floors = np.where(counts >= 2, values[np.arange(len(values)), at], np.inf)
        np.minimum.at(lowest, members.ravel(), np.repeat(floors, members.shape[1]))
    return lowest[:-1]


def find_straggle(job: JobState, cfg: AnalysisConfig) -> Straggle | None:
    """The rank whose compute explains the job's slowness, if one does.

    A strong onset (compute share up 20 points against the others', the job 15% slower, in
    every interval) is named from a short window, so a big straggler is named in about
    three heartbeats; a milder one needs the longer window.
    """
    fast = _onset(job, cfg, cfg.straggle_fast_beats, cfg.straggle_fast_growth, cfg.straggle_fast_slowdown, 1.0)
    if fast is not None:
        return fast
    onset = _onset(job, cfg, cfg.slow_recent_beats, cfg.straggle_min_growth, cfg.straggle_min_slowdown,
                   cfg.straggle_persistence)
    if onset is not None:
        return onset
    # imbalance: a rank computing more than the ranks that do the same work (a longer window)
    table = work_table(job, cfg)
    w = table.windows(cfg.imbalance_beats)
    if np.count_nonzero(w.ok) < 2:
        return None
    slowdown = _slowdown(w)
    groups = peer_groups(job)
    peers = _peer_rows(job, table, groups)
    # a rank can only exceed its peers' median by as much as it exceeds the lowest of its groups'
    # medians (when its groups share no one but itself): most ranks are ruled out without a union
    ruled_out = peers.disjoint & (w.recent - _lowest_floors(w, peers) < cfg.imbalance_min_excess)
    recent, ok, row_of = w.recent.tolist(), w.ok.tolist(), table.row_of
    best: Straggle | None = None
    for row in np.flatnonzero(w.ok & peers.grouped & ~ruled_out).tolist():
        r = table.ranks[row].rank
        mine = groups.get(r, [])
        mates = sorted({p for g in mine for p in g if p != r and p in row_of and ok[row_of[p]]})
        if not mates:
            continue
        reference = statistics.median(recent[row_of[p]] for p in mates)
        excess = recent[row] - reference
        if excess < cfg.imbalance_min_excess or (best is not None and excess <= best.excess):
            continue
        own = w.window(row)
        assert own is not None
        per_interval = [f - reference for f in own.recent_intervals]
        persistence = _persistence(per_interval, excess / 2)
        if persistence >= cfg.straggle_persistence:
            best = Straggle(r, "imbalance", excess, persistence, slowdown, own, mates,
                            victims=_victims(job, w.as_dict(), r))
    return best
