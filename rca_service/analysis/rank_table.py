"""Every rank's liveness and in-flight age as arrays: the per-pass triggers at 16k ranks.

Each analysis pass asks of every rank whether it is alive (triggers.statuses) and whether
an op of it has been in flight too long (triggers.hang_sweep); triggers.py answers rank by
rank and is the reference. At 16,384 ranks and five passes a second those sweeps were a
third of the analysis thread, although a rank changes only when the fold applies one of
its heartbeats (a second apart) or retires one of its ops: both give it a new in-flight list
(the fold replaces it, never changes it in place). So this table keeps, per rank, what the
rules read of it (final, last heartbeat, interval, its ops' largest age and when they were
observed), re-reads only the ranks whose list is another object than at the last pass (a
scan in C), and applies the rules to all ranks at once with the same float operations:
the same statuses, hung ranks and ages (tests/rca/test_incremental.py compares them pass by
pass). Ranks whose ops were observed at different times, or whose ages are not numbers,
are left to the reference (the whole job then takes it: no instrumentation sends those).
"""

from __future__ import annotations

import itertools
import math
import operator
from typing import Any

import numpy as np

from ..config import AnalysisConfig
from ..ingest.state import JobState, RankState
from .triggers import ALIVE, EXITED, LOST, HangSweep, hang_sweep

_INFLIGHT = operator.attrgetter("inflight")
_FINAL, _LAST_HB, _INTERVAL = (operator.attrgetter(a) for a in ("final", "last_hb_at", "hb_interval"))
_AGE_S, _OBSERVED = operator.attrgetter("age_s"), operator.attrgetter("observed_at")
_FIRST = operator.itemgetter(0)
_SHAPE = operator.attrgetter("seq", "group_id", "peer", "op")  # what the wait-for graph reads of an op
_CODES = (ALIVE, LOST, EXITED)


class RankTable:
    """What statuses() and hang_sweep() read of each rank, a row per rank in job order."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.ranks: list[RankState] = []
        self.ids = np.zeros(0, dtype=np.int64)
        self._lists: list[Any] = []  # per row: the in-flight list as of the last refresh ...
        self._checked: list[Any] = []  # ... and as of the last shape_epochs()
        self._heartbeats = False  # job.heartbeats > 0 as of the last refresh
        self.final = np.zeros(0, dtype=bool)
        self.last_hb = np.zeros(0)  # received time of the last heartbeat (0: none)
        self.first_seen = np.zeros(0)
        self.interval = np.zeros(0)
        self.has_ops = np.zeros(0, dtype=bool)
        self.max_age = np.zeros(0)  # the largest age of its ops in flight, as their heartbeat said
        self.observed = np.zeros(0)  # when that heartbeat was received
        self.irregular: set[int] = set()  # rows the arrays cannot hold exactly
        # per row: how often what the wait-for graph reads of its ops in flight changed (graph.wait_for)
        self.epoch = np.zeros(0, dtype=np.int64)
        self._codes: np.ndarray | None = None  # the last statuses() as codes, and its dict
        self._status: dict[int, str] = {}
        self._hung: np.ndarray | None = None  # the last hang_sweep's hung rows and their ids
        self._waiting: frozenset[int] = frozenset()
        self._watched: tuple[np.ndarray, list[RankState]] | None = None  # and its watched rows and ranks

    def refresh(self, job: JobState) -> None:
        """Re-read the ranks the fold touched since the last refresh (new ranks get a row)."""
        ranks = job.ranks
        if len(ranks) < len(self.ranks) or not all(map(operator.is_, self.ranks, ranks.values())):
            self._reset()  # a rank restarted (a new RankState): start over
        known = len(self.ranks)
        if len(ranks) > known:
            added = list(ranks.values())[known:]
            grow = len(added)
            self.ranks.extend(added)
            self._lists.extend([()] * grow)  # not a rank's list: every new row is read
            self._checked.extend([()] * grow)
            self.epoch = np.concatenate([self.epoch, np.zeros(grow, dtype=np.int64)])
            self.ids = np.concatenate([self.ids, np.fromiter((r.rank for r in added), np.int64, grow)])
            self.first_seen = np.concatenate([self.first_seen, np.fromiter((r.first_seen for r in added), float,
                                                                           grow)])
            for name in ("final", "has_ops"):
                setattr(self, name, np.concatenate([getattr(self, name), np.zeros(grow, dtype=bool)]))
            for name in ("last_hb", "interval", "max_age", "observed"):
                setattr(self, name, np.concatenate([getattr(self, name), np.zeros(grow)]))
        lists = list(map(_INFLIGHT, self.ranks))
        before = self._lists
        self._lists = lists
        heartbeats = job.heartbeats > 0
        if heartbeats != self._heartbeats:
            self._heartbeats = heartbeats
            touched = [True] * len(lists)
        else:  # rows whose list is another object than at the last refresh (a scan in C)
            touched = list(map(operator.is_not, lists, before))
        rows = list(itertools.compress(range(len(lists)), touched))
        if not rows:
            return
        at = np.asarray(rows, dtype=np.int64)
        picked = list(itertools.compress(self.ranks, touched))
        self.final[at] = list(map(_FINAL, picked))
        self.last_hb[at] = list(map(_LAST_HB, picked))
        self.interval[at] = list(map(_INTERVAL, picked))
        ops = list(itertools.compress(lists, touched))
        counts = list(map(len, ops))
        self.has_ops[at] = counts
        one = list(map((1).__eq__, counts))
        if all(one):  # one op in flight each: the common case, read in C
            self._read_single(rows, ops)
        elif not any(one):
            self._read_ops(rows, ops)
        else:  # a few ranks with none or several (a rank outside communication, a p2p pair)
            self._read_single(list(itertools.compress(rows, one)), list(itertools.compress(ops, one)))
            other = [not x for x in one]
            self._read_ops(list(itertools.compress(rows, other)), list(itertools.compress(ops, other)))

    def _read_single(self, rows: list[int], lists: list[list[Any]]) -> None:
        """_read_ops for rows with one op in flight each, in C."""
        firsts = list(map(_FIRST, lists))
        ages = list(map(_AGE_S, firsts))
        seen = list(map(_OBSERVED, firsts))
        if any(map(math.isnan, ages)):
            self._read_ops(rows, lists)
            return
        if self.irregular:
            self.irregular.difference_update(rows)
        at = np.asarray(rows, dtype=np.int64)
        self.max_age[at], self.observed[at] = ages, seen

    def shape_epochs(self) -> np.ndarray:
        """Per row, how often what the wait-for graph reads of its ops in flight (group, seq, peer,
        op) changed, as seen at the calls of this (graph.wait_for compares these counts instead of
        the ops; counted only while a hang is analysed, against the lists of the last call)."""
        lists, checked = self._lists, self._checked
        self._checked = lists
        touched = list(map(operator.is_not, lists, checked))
        if not any(touched):
            return self.epoch
        rows = list(itertools.compress(range(len(lists)), touched))
        ops = list(itertools.compress(lists, touched))
        old = list(itertools.compress(checked, touched))
        both = list(map(operator.and_, map((1).__eq__, map(len, ops)), map((1).__eq__, map(len, old))))
        changed = list(itertools.compress(itertools.compress(rows, both), map(  # one op then and now: in C
            operator.ne, map(_SHAPE, map(_FIRST, itertools.compress(ops, both))),
            map(_SHAPE, map(_FIRST, itertools.compress(old, both))))))
        if not all(both):  # the few with none or several ops, now or then
            others = itertools.compress(zip(rows, ops, old, strict=True), map(operator.not_, both))
            changed.extend(i for i, now, then in others if list(map(_SHAPE, now)) != list(map(_SHAPE, then)))
        if changed:
            self.epoch[changed] += 1
        return self.epoch

    def _read_ops(self, rows: list[int], lists: list[list[Any]]) -> None:
        """Each row's largest op age and when its heartbeat was received (0 without ops)."""
        ages: list[float] = []
        seen: list[float] = []
        irregular = self.irregular
        for i, ops in zip(rows, lists, strict=True):
            if not ops:
                ages.append(0.0)
                seen.append(0.0)
                irregular.discard(i)
                continue
            op = ops[0]
            oldest, observed = op.age_s, op.observed_at
            bad = oldest != oldest  # nan
            if len(ops) > 1:
                oldest = max(op.age_s for op in ops)
                bad = any(op.observed_at != observed or math.isnan(op.age_s) for op in ops)
            if bad:
                irregular.add(i)  # the per-rank rules would not reduce to one age and one time
            else:
                irregular.discard(i)
            ages.append(oldest)
            seen.append(observed)
        at = np.asarray(rows, dtype=np.int64)
        self.max_age[at] = ages
        self.observed[at] = seen

    def spoke(self) -> np.ndarray:
        """RankState.spoke_at of every row: its last heartbeat, else its first record (heartbeat jobs)."""
        return np.where(self.last_hb != 0, self.last_hb, self.first_seen if self._heartbeats else 0.0)

    def statuses(self, job: JobState, now: float, cfg: AnalysisConfig) -> dict[int, str]:
        """triggers.statuses(job, now, cfg); the same dict object while no status changed."""
        spoke = self.spoke()
        lost = (spoke != 0) & (now - spoke > cfg.lost_intervals * self.interval + cfg.lost_slack_s)
        codes = np.where(self.final, 2, np.where(lost, 1, 0)).astype(np.int8)
        if self._codes is None or not np.array_equal(codes, self._codes):
            names = np.asarray(_CODES, dtype=object)[codes].tolist()
            self._status = dict(zip(self.ids.tolist(), names, strict=True))
            self._codes = codes
        return self._status

    def hang_sweep(self, job: JobState, status: dict[int, str], now: float, threshold: float,
                   cfg: AnalysisConfig, with_ages: bool = False) -> HangSweep:
        """triggers.hang_sweep(job, status, now, threshold, cfg); the same `waiting` and `watched`
        objects while they hold the same ranks (the hung ranks' ages only with `with_ages`)."""
        if self.irregular:
            return hang_sweep(job, status, now, threshold, cfg)
        reach = 0.75 * threshold
        young = threshold - reach
        spoke = self.spoke()
        alive = self._codes == 0 if self._codes is not None and status is self._status else \
            np.fromiter((status.get(r) == ALIVE for r in self.ids.tolist()), bool, len(self.ids))
        old = self.has_ops & ~(self.max_age <= young)  # some op not young (the cheap test of the sweep)
        late = (spoke != 0) & (now - spoke > cfg.suspect_intervals * self.interval + cfg.suspect_slack_s)
        watched = old & alive & ~late
        since = np.fmax(0.0, now - self.observed)
        hung = watched & (self.max_age + np.minimum(since, reach) > threshold)
        rows = np.flatnonzero(hung)
        ages = self.max_age[rows] + since[rows]  # op.age_at(now) of each one's oldest op
        if self._hung is None or not np.array_equal(rows, self._hung):  # the same ranks: the same set object
            self._hung, self._waiting = rows, frozenset(self.ids[rows].tolist())
        oldest = float(ages.max()) if len(ages) else 0.0
        found = dict(zip(self.ids[rows].tolist(), ages.tolist(), strict=True)) if with_ages else None
        if (self.has_ops & (self.max_age <= young)).any():
            return HangSweep(self._waiting, oldest, None, math.inf, found)
        rows = np.flatnonzero(watched)
        if self._watched is None or not np.array_equal(rows, self._watched[0]):
            ranks = self.ranks
            self._watched = (rows, [ranks[i] for i in rows.tolist()])
        beats = self.last_hb[rows]
        beats = beats[beats != 0]
        epochs = self.shape_epochs()[rows] if len(ages) else None  # only a hang consults the graph
        return HangSweep(self._waiting, oldest, self._watched[1], float(beats.min()) if len(beats) else math.inf,
                         found, epochs)


def rank_table(job: JobState) -> RankTable:
    """The job's table (job.memo), up to date with its ranks."""
    table: Any = job.memo.get("rank_table")
    if not isinstance(table, RankTable):
        table = job.memo["rank_table"] = RankTable()
    table.refresh(job)
    return table

