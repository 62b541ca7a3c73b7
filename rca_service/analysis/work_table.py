"""Compute/wait windows of the ranks' heartbeat samples: one rank's, and every rank's at once.

Every heartbeat says how long the rank had an op in flight so far (mycroft.hb.comm_s) and how
many ops it completed, on its own clock (RankState.work); over a window of intervals that
splits into a compute share and an op rate (slowness.py reads them). work_window() computes
one rank's window and is the reference. A slowness search wants every rank's windows for
three window lengths: in Python that is ~20 us per rank, 0.3 s per search at 16,384 ranks
(and every rank adds a sample per heartbeat). WorkTable keeps each rank's last samples in
numpy arrays, appends only what heartbeats added since the last search (the fold only
appends, so the identity of the deque's newest sample says how far it got), and computes
the windows of all ranks at once with the same float operations in the same order as
work_window(): the same values (tests/rca/test_incremental.py compares them rank by rank).
A rank whose samples go back to "no op completed" after some did is left to work_window().
"""

from __future__ import annotations

import itertools
import math
import operator
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import AnalysisConfig
from ..ingest.state import JobState, RankState

Sample = tuple[float, float, int]  # (heartbeat time on the rank's clock, cumulative comm s, cumulative ops)
_NEWEST = operator.itemgetter(-1)


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



def _share(samples: list[Sample]) -> tuple[float, float] | None:
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


def _intervals(samples: list[Sample]) -> list[float]:
    out = []
    for (t0, c0, n0), (t1, c1, n1) in itertools.pairwise(samples):
        if n1 > n0 and t1 > t0 and n0 > 0:
            out.append(max(0.0, 1.0 - min(1.0, (c1 - c0) / (t1 - t0))))
    return out


# --------------------------------------------------------------------------------------
# one rank (the reference)
# --------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------
# every rank at once
# --------------------------------------------------------------------------------------
def table_length(cfg: AnalysisConfig) -> int:
    """Samples a row keeps: the longest window and its baseline (work_window reads no further back)."""
    return max(cfg.straggle_fast_beats, cfg.slow_recent_beats, cfg.imbalance_beats, cfg.slow_link_beats) \
        + cfg.slow_base_beats + 1


@dataclass(slots=True)
class Windows:
    """work_window(rank, cfg, beats) of every row of a WorkTable, as arrays (a row per rank, job order)."""

    beats: int
    ranks: list[RankState]
    ok: np.ndarray  # bool: a window exists (work_window is not None); the floats are nan where not
    base: np.ndarray  # compute share over the baseline (nan: none)
    recent: np.ndarray
    base_rate: np.ndarray  # ops completed per second
    recent_rate: np.ndarray
    span: np.ndarray  # (rows, 2): rank-clock time range of the recent window
    shares: np.ndarray  # (rows, beats): each recent interval's compute share ...
    progressing: np.ndarray  # ... and whether it counts (an op completed in it)
    overrides: dict[int, WorkWindow | None] = field(default_factory=dict)  # rows work_window() computed

    def window(self, row: int) -> WorkWindow | None:
        """The WorkWindow of one row, as work_window() builds it."""
        if row in self.overrides:
            return self.overrides[row]
        if not self.ok[row]:
            return None
        intervals = [v for v, p in zip(self.shares[row].tolist(), self.progressing[row].tolist(), strict=True) if p]
        return WorkWindow(self.ranks[row].rank, float(self.base[row]), float(self.recent[row]), intervals,
                          float(self.base_rate[row]), float(self.recent_rate[row]),
                          (float(self.span[row, 0]), float(self.span[row, 1])))

    def as_dict(self) -> dict[int, WorkWindow]:
        """rank -> WorkWindow of every row that has one, in job order (what the rare, detailed rules read)."""
        out: dict[int, WorkWindow] = {}
        for row in np.flatnonzero(self.ok).tolist():
            w = self.window(row)
            if w is not None:
                out[w.rank] = w
        return out


@dataclass(slots=True)
class _Row:
    work: deque[Sample]  # the rank's samples (RankState.work is never replaced; a restart is a new rank)
    positive: bool = False  # a sample with ops > 0 was seen
    irregular: bool = False  # a sample without ops after one with: left to work_window()


class WorkTable:
    """The job's ranks' last samples (a ring of `length` per rank) and every rank's windows over them."""

    def __init__(self, cfg: AnalysisConfig) -> None:
        self.cfg = cfg
        self.length = table_length(cfg)
        self._reset()

    def _reset(self) -> None:
        self.ranks: list[RankState] = []
        self.row_of: dict[int, int] = {}  # rank id -> row
        self.rows: list[_Row] = []
        self.head = np.zeros(0, dtype=np.int64)  # samples with ops > 0 appended per row (ring slot: head % length)
        self.samples = np.zeros((0, self.length, 3))  # the rings: [row, slot] = (t, comm, ops)
        self._windows: dict[int, Windows] = {}
        self._pairs: _Pairs | None = None
        self._folded: tuple[int, int, int] | None = None
        self._irregular = False  # some row is (work_window computes it)
        self._newest: list[Sample | None] = []  # per row: its newest sample as of the last refresh
        self._works: list[deque[Sample]] = []  # per row: the rank's samples

    def refresh(self, job: JobState) -> None:
        """Append what the ranks' heartbeats added since the last refresh (a new rank gets a row)."""
        # every record the fold applies counts as a heartbeat or a span of the job, and only applied
        # heartbeats add samples: the same counts (and ranks) say nothing changed since the last refresh
        folded = (job.heartbeats, job.spans, len(job.ranks))
        if folded == self._folded:
            return
        ranks = job.ranks
        if len(ranks) < len(self.ranks) or not all(map(operator.is_, self.ranks, ranks.values())):
            self._reset()  # a rank restarted (a new RankState) or was dropped: start over
        self._folded = folded
        if len(ranks) > len(self.ranks):
            added = list(ranks.values())[len(self.ranks):]
            self.row_of.update((rank.rank, len(self.ranks) + i) for i, rank in enumerate(added))
            self.ranks.extend(added)
            self.rows.extend(_Row(rank.work) for rank in added)
            self._works.extend(rank.work for rank in added)
            self.head = np.concatenate([self.head, np.zeros(len(added), dtype=np.int64)])
            self.samples = np.concatenate([self.samples, np.zeros((len(added), self.length, 3))])
        slots: list[int] = []
        values: list[float] = []
        length = self.length
        heads = self.head.tolist()
        add_slot, add_values = slots.append, values.extend
        rows = self.rows
        try:  # every row's newest sample, in C (a rank whose heartbeats carry no comm time has none)
            newest_now: list[Sample | None] = list(map(_NEWEST, self._works))
        except IndexError:
            newest_now = [work[-1] if work else None for work in self._works]
        before = self._newest if len(self._newest) == len(rows) else [None] * len(rows)
        self._newest = newest_now
        # rows whose newest sample is another object than at the last refresh (a scan in C)
        for i in itertools.compress(range(len(rows)), map(operator.is_not, newest_now, before)):
            row = rows[i]
            work = row.work
            newest, last = newest_now[i], before[i]
            if newest is None:
                continue
            if last is not None and row.positive and not row.irregular:  # (a deque of 1 has no last)
                # one or two new samples that completed ops: the common case (a search every 1-2 s)
                previous = work[-2]
                if previous is last and newest[2] > 0:
                    add_slot(i * length + heads[i] % length)
                    add_values(newest)
                    heads[i] += 1
                    continue
                if len(work) > 2 and work[-3] is last and previous[2] > 0 and newest[2] > 0:
                    add_slot(i * length + heads[i] % length)
                    add_values(previous)
                    add_slot(i * length + (heads[i] + 1) % length)
                    add_values(newest)
                    heads[i] += 2
                    continue
            new, complete = _since(work, last)
            if complete:  # the last refresh's newest sample is gone from the deque: rebuild the row
                heads[i], row.positive, row.irregular = 0, False, False
            kept = [s for s in new if s[2] > 0]  # work_window's filter (samples from the first op on)
            if len(kept) < len(new) and not row.irregular:
                seen = row.positive
                for s in new:
                    if s[2] > 0:
                        seen = True
                    elif seen:
                        row.irregular = self._irregular = True  # the ops count went back: no suffix is kept
                        break
            row.positive = row.positive or bool(kept)
            for s in kept[-length:]:  # older ones fell out of the ring (and the window) anyway
                add_slot(i * length + heads[i] % length)
                add_values(s)
                heads[i] += 1
        if slots:
            self.samples.reshape(-1, 3)[np.asarray(slots)] = np.fromiter(values, float, len(values)).reshape(-1, 3)
        self.head = np.asarray(heads, dtype=np.int64)
        self._windows.clear()
        self._pairs = None

    def _intervals(self) -> _Pairs:
        """Every row's intervals between consecutive samples (computed once per refresh)."""
        if self._pairs is None:
            length = self.length
            slots = (self.head[:, None] + np.arange(length)[None, :]) % length  # oldest sample first
            aligned = self.samples[np.arange(len(self.rows))[:, None], slots]
            missing = np.arange(length)[None, :] < (length - np.minimum(self.head, length))[:, None]
            aligned[missing] = (np.nan, np.nan, 0.0)  # right-aligned; no sample: t nan, ops 0
            t, c, n = aligned[:, :, 0], aligned[:, :, 1], aligned[:, :, 2]
            with np.errstate(invalid="ignore"):
                dt, dc, dn = np.diff(t, axis=1), np.diff(c, axis=1), np.diff(n, axis=1)
                prog = (dn > 0) & (dt > 0) & (n[:, :-1] != 0)  # an op completed in it (_share, _intervals)
                self._pairs = _Pairs(t, dt, dc, prog, np.where(prog, np.fmax(0.0, dc), 0.0),  # max(0.0, nan): 0.0
                                     np.where(prog, dt, 0.0), np.where(prog, dn, 0.0), np.minimum(self.head, length))
        return self._pairs

    def windows(self, beats: int) -> Windows:
        """work_window(rank, cfg, beats) for every row (computed once per refresh)."""
        found = self._windows.get(beats)
        if found is None:
            found = self._windows[beats] = self._compute(beats)
        return found

    def _compute(self, beats: int) -> Windows:
        """_work_window() over arrays: the same operations on the same floats, in the same order."""
        cfg, length = self.cfg, self.length
        p = self._intervals()
        t, dt, dc, prog, busy, elapsed, ops, count = p.t, p.dt, p.dc, p.prog, p.busy, p.elapsed, p.ops, p.count
        with np.errstate(invalid="ignore", divide="ignore"):
            recent = slice(length - 1 - beats, length - 1)  # intervals of samples[-(beats + 1):]
            r_busy, r_el, r_ops = _seq_sum(busy[:, recent]), _seq_sum(elapsed[:, recent]), _seq_sum(ops[:, recent])
            shares = np.fmax(0.0, 1.0 - np.fmin(1.0, dc[:, recent] / dt[:, recent]))
            progressing = prog[:, recent]
            ok = (count >= beats + 1) & (r_el > 0) & (progressing.sum(axis=1) >= cfg.straggle_persistence * beats)
            recent_share = np.fmax(0.0, 1.0 - np.fmin(1.0, r_busy / r_el))
            recent_rate = r_ops / r_el
            first = length - (beats + cfg.slow_base_beats + 1)  # samples[-(beats + base + 1):-beats]
            based = slice(first, length - beats - 1)
            b_busy, b_el, b_ops = _seq_sum(busy[:, based]), _seq_sum(elapsed[:, based]), _seq_sum(ops[:, based])
            base_len = np.minimum(count, beats + cfg.slow_base_beats + 1) - beats
            has_base = ok & (base_len >= cfg.slow_base_min_beats + 1) & (b_el > 0)
            base_share = np.where(has_base, np.fmax(0.0, 1.0 - np.fmin(1.0, b_busy / b_el)), np.nan)
            base_rate = np.where(has_base, b_ops / b_el, np.nan)
        nan = np.nan
        windows = Windows(beats, self.ranks, ok, base_share, np.where(ok, recent_share, nan), base_rate,
                          np.where(ok, recent_rate, nan),
                          np.stack([t[:, length - 1 - beats], t[:, length - 1]], axis=1), shares, progressing)
        for i in [i for i, row in enumerate(self.rows) if row.irregular] if self._irregular else ():
            w = windows.overrides[i] = _work_window(self.ranks[i], cfg, beats)
            windows.ok[i] = w is not None
            windows.base[i], windows.recent[i], windows.base_rate[i], windows.recent_rate[i] = \
                (w.base, w.recent, w.base_rate, w.recent_rate) if w is not None else (nan, nan, nan, nan)
        return windows


@dataclass(slots=True)
class _Pairs:
    """Every row's samples (right-aligned) and the intervals between them: what each window sums."""

    t: np.ndarray  # (rows, length) sample times; nan: no sample
    dt: np.ndarray  # (rows, length - 1) per interval
    dc: np.ndarray
    prog: np.ndarray  # it counts: an op completed in it
    busy: np.ndarray  # max(0, comm time), where it counts (else 0)
    elapsed: np.ndarray
    ops: np.ndarray
    count: np.ndarray  # (rows,) samples held (from the first op on, at most `length`)


def _seq_sum(a: np.ndarray) -> np.ndarray:
    """Row sums added left to right from 0.0, as the Python loops add (np.sum adds pairwise)."""
    out = np.zeros(a.shape[0])
    for j in range(a.shape[1]):
        out += a[:, j]
    return out


def _since(work: deque[Sample], last: Sample | None) -> tuple[list[Sample], bool]:
    """The samples appended after `last`, and whether that is the whole deque (`last` gone or None)."""
    if last is not None:
        for back in range(2, len(work) + 1):
            if work[-back] is last:
                return [work[-k] for k in range(back - 1, 0, -1)], False
    return list(work), True


def work_table(job: JobState, cfg: AnalysisConfig) -> WorkTable:
    """The job's table (job.memo), brought up to date with its ranks' samples."""
    table: Any = job.memo.get("work_table")
    if not isinstance(table, WorkTable) or table.cfg is not cfg:
        table = job.memo["work_table"] = WorkTable(cfg)
    table.refresh(job)
    return table
