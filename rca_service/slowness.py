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

from .config import AnalysisConfig
from .state import JobState, RankState


@dataclass(slots=True)
class WorkWindow:
    """One rank's compute share (1 - comm time / elapsed) over its recent and baseline heartbeats."""

    rank: int
    base: float
    recent: float
    recent_intervals: list[float]  # per-interval compute shares (progressing intervals only)
    base_rate: float  # ops completed per second
    recent_rate: float
    recent_span: tuple[float, float]  # rank-clock time range of the recent window


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


def _share(samples: list[tuple[float, float, int]]) -> tuple[float, float] | None:
    """(compute share, op rate) between the first and last sample, progressing intervals only."""
    busy = elapsed = 0.0
    ops = 0
    for (t0, c0, n0), (t1, c1, n1) in itertools.pairwise(samples):
        if n1 <= n0 or t1 <= t0 or n0 == 0:
            continue  # no op completed: paused (or hung), not slow; or start-up (ranks still joining)
        busy += max(0.0, c1 - c0)
        elapsed += t1 - t0
        ops += n1 - n0
    if elapsed <= 0:
        return None
    return max(0.0, 1.0 - min(1.0, busy / elapsed)), ops / elapsed


def _intervals(samples: list[tuple[float, float, int]]) -> list[float]:
    out = []
    for (t0, c0, n0), (t1, c1, n1) in itertools.pairwise(samples):
        if n1 > n0 and t1 > t0 and n0 > 0:
            out.append(max(0.0, 1.0 - min(1.0, (c1 - c0) / (t1 - t0))))
    return out


def work_window(rank: RankState, cfg: AnalysisConfig, beats: int) -> WorkWindow | None:
    """The last `beats` intervals, and the baseline before them where there is one (nan otherwise).

    Memoized on the rank (rank.windows): its samples change only when a heartbeat adds one
    (strictly newer, so length and last sample say "unchanged"); a 16k-rank pass otherwise
    recomputes 16k windows that did not move since the last pass.
    """
    work = rank.work
    key = (len(work), work[-1] if work else None)
    found = rank.windows.get(beats)
    if found is not None and found[0] is cfg and found[1] == key:
        return found[2]
    window = _work_window(rank, cfg, beats)
    rank.windows[beats] = (cfg, key, window)
    return window


def _work_window(rank: RankState, cfg: AnalysisConfig, beats: int) -> WorkWindow | None:
    samples = [s for s in rank.work if s[2] > 0] or list(rank.work)[-1:]  # from the first op on
    if len(samples) < beats + 1:
        return None
    recent = samples[-(beats + 1):]
    r = _share(recent)
    intervals = _intervals(recent)
    if r is None or len(intervals) < cfg.straggle_persistence * beats:
        return None  # the window holds a pause (checkpoint, evaluation, a hang): not a verdict on speed
    base = samples[-(beats + cfg.slow_base_beats + 1):-beats]
    b = _share(base) if len(base) >= cfg.slow_base_min_beats + 1 else None
    return WorkWindow(rank.rank, b[0] if b else math.nan, r[0], intervals, b[1] if b else math.nan,
                      r[1], (recent[0][0], recent[-1][0]))


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
    groups = {frozenset(g.ranks) for g in ran}
    by_size = sorted(groups, key=len)
    minimal = [g for i, g in enumerate(by_size) if not any(o < g for o in by_size[:i])]
    out: dict[int, list[frozenset[int]]] = defaultdict(list)
    for members in minimal:
        for r in members:
            out[r].append(members)
    job.memo["peer_groups"] = (len(ran), out)
    return out


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
    windows = [w for rank in job.ranks.values() if (w := work_window(rank, cfg, cfg.slow_recent_beats)) is not None
               and not math.isnan(w.base)]
    if len(windows) < 2:
        return None
    drop = statistics.median(w.base - w.recent for w in windows)
    recent_rate = statistics.median(w.recent_rate for w in windows)
    base_rate = statistics.median(w.base_rate for w in windows)
    return drop, (base_rate / recent_rate if recent_rate > 0 else 1.0)


def _slowdown(windows: dict[int, WorkWindow]) -> float:
    """Job op rate, baseline over recent (medians over the ranks; 1.0 without a baseline)."""
    based = [w.base_rate for w in windows.values() if not math.isnan(w.base)]
    if not windows or not based:
        return 1.0
    recent_rate = statistics.median(w.recent_rate for w in windows.values())
    return statistics.median(based) / recent_rate if recent_rate > 0 else 1.0


def job_slowdown(job: JobState, cfg: AnalysisConfig, beats: int) -> float:
    """How much slower the job completes ops over its last `beats` intervals than before."""
    return _slowdown({r: w for r, rank in job.ranks.items() if (w := work_window(rank, cfg, beats)) is not None})


def _onset(job: JobState, cfg: AnalysisConfig, beats: int, min_growth: float, min_slowdown: float,
           min_persistence: float) -> Straggle | None:
    """A rank whose compute share held or grew while everyone else's fell (they wait on it)."""
    windows = {r: w for r, rank in job.ranks.items() if (w := work_window(rank, cfg, beats)) is not None}
    based = {r: w for r, w in windows.items() if not math.isnan(w.base)}
    if len(based) < 2:
        return None
    slowdown = _slowdown(windows)
    growth = {r: w.recent - w.base for r, w in based.items()}
    top = max(growth, key=growth.__getitem__)
    rest = [r for r in growth if r != top]
    own = based[top]
    spread = growth[top] - statistics.median(growth[r] for r in rest)
    if growth[top] < -min_growth / 3 or spread < min_growth or slowdown < min_slowdown:
        return None
    base_gap = own.base - statistics.median(based[r].base for r in rest)
    gaps = _aligned_gaps(own, [based[r] for r in rest])
    persistence = _persistence([g - base_gap for g in gaps], spread / 2)
    if persistence < min_persistence:
        return None
    return Straggle(top, "onset", spread, persistence, slowdown, own, victims=_victims(job, windows, top))


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
    windows = {r: w for r, rank in job.ranks.items()
               if (w := work_window(rank, cfg, cfg.imbalance_beats)) is not None}
    if len(windows) < 2:
        return None
    slowdown = _slowdown(windows)
    groups = peer_groups(job)
    # a rank can only exceed its peers' median by as much as it exceeds the lowest of its groups'
    # medians (when its groups share no one but itself): most ranks are ruled out without a union
    unique = {g for mine in groups.values() for g in mine}
    floors = {g: _median_floor(sorted(windows[p].recent for p in g if p in windows)) for g in unique}
    best: Straggle | None = None
    for r, w in windows.items():
        mine = groups.get(r, [])
        if not mine:
            continue
        disjoint = all(len(a & b) <= 1 for a, b in itertools.combinations(mine, 2))
        if disjoint and w.recent - min(floors[g] for g in mine) < cfg.imbalance_min_excess:
            continue
        mates = sorted({p for g in mine for p in g if p != r and p in windows})
        if not mates:
            continue
        reference = statistics.median(windows[p].recent for p in mates)
        excess = w.recent - reference
        if excess < cfg.imbalance_min_excess or (best is not None and excess <= best.excess):
            continue
        per_interval = [f - reference for f in w.recent_intervals]
        persistence = _persistence(per_interval, excess / 2)
        if persistence >= cfg.straggle_persistence:
            best = Straggle(r, "imbalance", excess, persistence, slowdown, w, mates,
                            victims=_victims(job, windows, r))
    return best
