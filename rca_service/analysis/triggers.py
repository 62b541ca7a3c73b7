"""Anomaly triggers over one job's state: pure functions of (state, now, config).

Each trigger answers one question cheaply, so the costly wait-for graph is only built
when something is actually stuck.
"""

from __future__ import annotations

import collections
import itertools
import math
import operator
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any

from mycroft import schema

from ..config import AnalysisConfig
from ..ingest.state import GroupState, JobState, RankState, SeqRecord, Sig

ALIVE = "alive"
LOST = "lost"  # silent without a goodbye
EXITED = "exited"  # final heartbeat seen
UNSEEN = "unseen"  # member of a group that never reported



def lost_after(rank: RankState, cfg: AnalysisConfig) -> float:
    return silent_limit(rank.hb_interval, cfg)


def silent_limit(interval_s: float, cfg: AnalysisConfig) -> float:
    """How long a reporter on this heartbeat interval may be silent before it counts as lost."""
    return cfg.lost_intervals * interval_s + cfg.lost_slack_s


def too_young_to_miss(job: JobState, now: float, cfg: AnalysisConfig) -> bool:
    """The job has not run longer than a rank may take to be lost: a rank of its world not heard
    from yet may only be slow to start."""
    return now - job.first_seen <= cfg.lost_intervals * job.hb_interval + cfg.lost_slack_s


def spoke_at(job: JobState, rank: RankState) -> float:
    """When the rank last proved it was alive; 0.0 where liveness cannot be judged."""
    return rank.spoke_at(job.heartbeats > 0)


def rank_status(job: JobState, rank_id: int, now: float, cfg: AnalysisConfig) -> str:
    rank = job.ranks.get(rank_id)
    if rank is None:
        return UNSEEN
    if rank.final:
        return EXITED
    spoke = spoke_at(job, rank)
    if spoke and now - spoke > lost_after(rank, cfg):
        return LOST
    # spans-only data (no rank of the job heartbeats): silence proves nothing, an idle rank sends no spans
    return ALIVE


def statuses(job: JobState, now: float, cfg: AnalysisConfig) -> dict[int, str]:
    """rank_status of every rank of the job, in one sweep (every pass needs it: at 16k ranks
    the per-rank calls cost more than the rule)."""
    heartbeats = job.heartbeats > 0
    intervals, slack = cfg.lost_intervals, cfg.lost_slack_s
    out: dict[int, str] = {}
    for rank_id, rank in job.ranks.items():
        if rank.final:
            out[rank_id] = EXITED
            continue
        spoke = rank.last_hb_at or (rank.first_seen if heartbeats else 0.0)  # RankState.spoke_at
        out[rank_id] = LOST if spoke and now - spoke > intervals * rank.hb_interval + slack else ALIVE
    return out


def hang_threshold(job: JobState, cfg: AnalysisConfig) -> float:
    """Adaptive: a multiple of how long ops usually take in this job, never below the floor.

    Only ends seen where they happened count: compiled collectives on gloo end when the Flight
    Recorder's frontier says so, seconds late, and learning from those once made a 6 s threshold
    (tp_compiled in benchmarks/framework_matrix.py: the blocked rank named after 5-6 s)."""
    samples: list[float] = []
    for group in job.groups.values():
        if not group.timed:
            continue  # no op span completed in it (a heartbeat-only job: every group, every pass)
        samples.extend(list(group.timed)[-64:])
        if len(samples) > 4096:
            break
    if len(samples) < 8:
        # no op span ends (heartbeats only, the default at scale: op spans sampled away): learn how long
        # ops stay in flight from the heartbeats themselves, so a collective that merely slowed past the
        # 1 s floor is not a hang (issue 44: a slowed collective read as "not entered", a GPU straggler paged)
        samples = list(heartbeat_durations(job))
        if len(samples) < 8:
            # nothing learned yet: an op that ended just after a heartbeat reads in flight until the next
            # one, so without op spans no op is judged on less than two heartbeat intervals
            return max(cfg.hang_min_s, 2.0 * job.hb_interval) if _spans_sampled_away(job) else cfg.hang_min_s
    samples.sort()
    p95 = samples[min(len(samples) - 1, int(0.95 * len(samples)))]
    return min(cfg.hang_max_s, max(cfg.hang_min_s, cfg.hang_factor * p95))


def _spans_sampled_away(job: JobState) -> bool:
    """The ranks say the trace budget sends (almost) none of their op spans: heartbeats are all there is."""
    ranks = list(itertools.islice(job.ranks.values(), 8))
    return bool(ranks) and all(r.spans_sampled_out > 4 * r.spans_kept for r in ranks)


HB_DURATIONS = "hb_op_durations"  # job.memo: in-flight ops seen in heartbeats, and the durations learned
HB_DURATION_RANKS = 256  # ranks read per pass (a sample: every member of a collective sees it in flight)


def heartbeat_durations(job: JobState) -> Any:
    """Durations of the job's collectives as heartbeats saw them: per rank and op, the longest age it
    reported the op in flight, once that rank reports it completed (a lower bound of the op's duration
    on that rank; an op stuck on a rank never gives one). Kept in job.memo, folded from the heartbeats
    a pass sees (at most HB_DURATION_RANKS ranks per pass)."""
    memo = job.memo.get(HB_DURATIONS)
    if memo is None:
        memo = job.memo[HB_DURATIONS] = ({}, collections.deque(maxlen=256), [0])
    seen: dict[int, dict[tuple[str, int], float]] = memo[0]
    done: collections.deque[float] = memo[1]
    cursor: list[int] = memo[2]
    ranks = list(itertools.islice(job.ranks.values(), cursor[0], cursor[0] + HB_DURATION_RANKS))
    cursor[0] = 0 if cursor[0] + HB_DURATION_RANKS >= len(job.ranks) else cursor[0] + HB_DURATION_RANKS
    for rank in ranks:
        mine = seen.setdefault(rank.rank, {})
        for op in rank.inflight:
            if not op.is_p2p and op.age_s > mine.get((op.group_id, op.seq), -1.0):
                mine[(op.group_id, op.seq)] = op.age_s
        for key in [k for k in mine if rank.completed.get(k[0], 0) >= k[1]]:
            done.append(mine.pop(key))
        if len(mine) > 64:  # ops it never reported completed (a hang, a restart): keep the newest
            for key in sorted(mine, key=lambda k: k[1])[:len(mine) - 64]:
                del mine[key]
    return done


def late(job: JobState, rank: RankState, now: float, cfg: AnalysisConfig) -> bool:
    """Missed a heartbeat: what it last said may no longer hold (it may be dead)."""
    spoke = spoke_at(job, rank)
    return bool(spoke) and now - spoke > cfg.suspect_intervals * rank.hb_interval + cfg.suspect_slack_s


def hung_ranks(job: JobState, status: dict[int, str], now: float, threshold: float,
               cfg: AnalysisConfig) -> dict[int, float]:
    """Alive ranks with an op in flight longer than the threshold -> that op's age.

    A rank that missed its heartbeat is not counted: its in-flight age is an extrapolation
    from a snapshot that a dead process can no longer correct. Between heartbeats an op's
    age is extrapolated by at most 3/4 of the threshold, so a heartbeat delayed in transit
    (a collector or decoder backlog) cannot age a young healthy op past the threshold; only
    an op its snapshot already saw in flight for a quarter of it can be convicted before the
    next heartbeat says how old it really is.
    """
    hung = hang_sweep(job, status, now, threshold, cfg).hung
    assert hung is not None
    return hung


@dataclass(slots=True)
class HangSweep:
    """hung_ranks() and what its sweep saw on the way, for the wait-for graph (graph.wait_for)."""

    waiting: frozenset[int]  # the hung ranks ...
    oldest: float  # ... and the age of the oldest op among them (0.0 when none)
    # every alive, not late rank with an op in flight, in job order; None when the sweep
    # skipped ranks whose ops were all young before looking at their status
    watched: list[RankState] | None
    oldest_heartbeat: float  # the oldest last heartbeat (received time, > 0) among `watched`
    hung: dict[int, float] | None = None  # hung rank -> its oldest op's age (the per-rank sweep fills it)
    epochs: Any = None  # rank_table: per watched rank, how often its ops in flight changed shape


def hang_sweep(job: JobState, status: dict[int, str], now: float, threshold: float,
               cfg: AnalysisConfig) -> HangSweep:
    """One sweep over every rank (16k at scale, every pass): the cheap tests first, one op inlined."""
    hung: dict[int, float] = {}
    watched: list[RankState] | None = []
    oldest = math.inf
    reach = 0.75 * threshold
    young = threshold - reach  # an op seen this young cannot be extrapolated past the threshold
    heartbeats = job.heartbeats > 0
    intervals, slack = cfg.suspect_intervals, cfg.suspect_slack_s
    for rank_id, rank in job.ranks.items():
        inflight = rank.inflight
        if not inflight:
            continue
        if len(inflight) == 1:
            op = inflight[0]
            if op.age_s <= young:
                watched = None
                continue
        elif all(op.age_s <= young for op in inflight):
            watched = None
            continue
        if status.get(rank_id) != ALIVE:
            continue
        last = rank.last_hb_at
        spoke = last or (rank.first_seen if heartbeats else 0.0)  # late(), inlined
        if spoke and now - spoke > intervals * rank.hb_interval + slack:
            continue
        if watched is not None:
            watched.append(rank)
            if last and last < oldest:
                oldest = last
        if len(inflight) == 1:  # the rule below for one op, without the builtin calls
            age, since = op.age_s, now - op.observed_at
            if since < 0.0:
                since = 0.0
            if age + (since if since <= reach else reach) > threshold:
                hung[rank_id] = age + since  # op.age_at(now)
            continue
        seen = max(op.age_s + min(max(0.0, now - op.observed_at), reach) for op in inflight)
        if seen > threshold:
            hung[rank_id] = max(op.age_at(now) for op in inflight)
    return HangSweep(frozenset(hung), max(hung.values(), default=0.0), watched, oldest, hung)


# --------------------------------------------------------------------------------------
# mismatch
# --------------------------------------------------------------------------------------
@dataclass(slots=True)
class Mismatch:
    group_id: str
    seq: int
    minority: dict[int, Sig]
    majority: Sig
    field: str  # op / bytes / dtype
    basis: str = "members"  # "members": compared with the others at this seq; "history": with earlier seqs


def _differs(a: Sig, b: Sig) -> str:
    if a[0] != b[0]:
        return "op"
    if a[0] in schema.EQUAL_BYTES_OPS and a[1] and b[1] and a[1] != b[1]:
        return "bytes"
    if a[2] and b[2] and a[2] != b[2]:
        return "dtype"
    return ""


def _canonical(sig: Sig, reference: Sig) -> Sig:
    """Heartbeats carry no dtype: compare on what both sides know."""
    return (sig[0], sig[1] if sig[0] in schema.EQUAL_BYTES_OPS else 0, sig[2] if reference[2] else "")


def find_mismatches(job: JobState, recent: int = 4) -> list[Mismatch]:
    """Sequence numbers at which members of a group issued different ops.

    The minority diverges; ties are broken by which signature the group used before
    (training repeats itself, so history says what "normal" looks like).

    A group's answer is a function of its seq records, and the fold bumps `group.version` with
    every change of them: a group found clean is read again only once it changed (at 16k ranks
    the 4k groups' newest seqs were half of every analysis pass, most of them unchanged).
    """
    groups = list(job.groups.values())
    versions = list(map(_VERSION, groups))
    memo = job.memo.get(f"mismatches/{recent}")
    newest: dict[str, tuple[int, int, list[int]]] = job.memo.setdefault(f"newest_seqs/{recent}", {})
    if memo is not None and len(memo[0]) == len(groups) and all(map(operator.is_, memo[0], groups)):
        results: list[list[Mismatch] | None] = memo[2]  # None: clean
        todo = sorted({*itertools.compress(range(len(groups)), map(operator.ne, versions, memo[1])),
                       *(i for i, found in enumerate(results) if found is not None)})
    else:
        results, todo = [None] * len(groups), list(range(len(groups)))
    for i in todo:
        results[i] = _group_mismatches(groups[i], recent, newest)
    job.memo[f"mismatches/{recent}"] = (groups, versions, results)
    return [m for found in results if found is not None for m in found]


def _group_mismatches(group: GroupState, recent: int, newest: dict[str, tuple[int, int, list[int]]]) \
        -> list[Mismatch] | None:
    """find_mismatches of one group: its mismatches (maybe none yet), or None when it is clean."""
    seqs = group.seqs
    if not seqs:
        return None
    last = next(reversed(seqs))
    known = newest.get(group.group_id)
    if known is None or known[0] != len(seqs) or known[1] != last:
        known = newest[group.group_id] = (len(seqs), last, _newest_seqs(seqs, recent, known))
    found: list[Mismatch] = []
    all_clean = True
    for seq in known[2]:
        rec = seqs[seq]
        clean = rec.clean
        if clean is not None and clean[0] == rec.version:
            continue  # found agreeing and without failures, and unchanged since (every change bumps the version)
        sigs, states = rec.sigs, rec.states
        mark = (rec.version, len(sigs), len(states), rec.rewrites)
        first = next(iter(sigs.values()), None)
        if first is None:
            all_clean = False
            continue
        # found clean, and since then the fold only added members' signatures and states (or wrote
        # the same ones again), it replaced none: only the new ones need reading (heartbeats and
        # sampled op spans add 16k of them to a world seq over a second; each pass used to compare
        # them all again). Dicts keep insertion order: the new ones are the last.
        if clean is not None and mark[3] == clean[3] and \
                not any(_differs(first, s) for s in itertools.islice(sigs.values(), clean[1], None)) and \
                not any(st in _FAILED for st in itertools.islice(states.values(), clean[2], None)):
            rec.clean = mark
            continue
        if len(sigs) >= 2 and any(_differs(first, s) for s in sigs.values()):
            found.append(_split(group, seq, sigs))
            continue
        novel = _novel_failure(group, seq)
        if novel is not None:
            found.append(novel)
        elif not any(st in _FAILED for st in states.values()):
            rec.clean = mark  # a pure function of this record: stays clean until it changes
        else:
            all_clean = False
    return None if all_clean and not found else found


def _newest_seqs(seqs: dict[int, SeqRecord], recent: int, known: tuple[int, int, list[int]] | None) -> list[int]:
    """sorted(seqs)[-recent:], from the last answer where there is one.

    The fold adds a seq at the end of the window and drops its oldest one beyond the window's
    size, so (size, last added) says "the same seqs", and the newest ones now are among the
    newest before (those still there) and the seqs added after the last added then (at most a
    few per pass; sorting 256 seqs of each of 2k groups every pass was most of the check).
    """
    if known is not None and known[1] in seqs:
        added = list(itertools.takewhile(known[1].__ne__, reversed(seqs)))
        candidates = sorted({*added, *(s for s in known[2] if s in seqs)})[-recent:]
        if len(candidates) == min(recent, len(seqs)):
            return candidates
    return sorted(seqs)[-recent:]


_FAILED = (schema.STATE_ERROR, schema.STATE_TIMEOUT)
_VERSION = operator.attrgetter("version")


def find_digest_mismatches(job: JobState, recent_blocks: int = 4) -> list[Mismatch]:
    """Blocks of seqs whose signature digests (heartbeats) differ between members of a group.

    What op spans would show when they are sampled away: the minority of the members that
    reported the block diverged; without a strict majority (two members, or a tie so far)
    nothing is said. `seq` is the block's first seq; the signatures themselves are unknown.
    """
    found: list[Mismatch] = []
    unknown: Sig = ("", 0, "")
    for group in job.groups.values():
        if not group.digests:
            continue
        for block in sorted(group.digests)[-recent_blocks:]:
            values = group.digests[block]
            if len(values) < 3 or len(set(values.values())) == 1:
                continue
            usual, agree = Counter(values.values()).most_common(1)[0]
            if 2 * agree <= len(values):
                continue
            minority = {r: unknown for r, v in values.items() if v != usual}
            found.append(Mismatch(group.group_id, block * schema.DIGEST_BLOCK + 1, minority, unknown,
                                  "signature", basis="digest"))
    return found


def _novel_failure(group: GroupState, seq: int) -> Mismatch | None:
    """A failed op whose signature this group never used, while no member matched it.

    The library may abort the peer that detects a size / dtype difference (gloo: SIGABRT
    "Received data size doesn't match expected size") before it reports anything: then the
    divergent rank's failed op is the only signature at that seq, and the group's history
    (training repeats itself) is what it diverged from.
    """
    rec = group.seqs[seq]
    if not rec.states:
        return None  # no op span at this seq (heartbeats only): nothing failed
    failed = {r: sig for r, sig in rec.sigs.items()
              if rec.states.get(r) in (schema.STATE_ERROR, schema.STATE_TIMEOUT)}
    if not failed or len(failed) != len(rec.sigs):
        return None  # somebody else issued this seq with the same signature: not a divergence
    history: Counter[Sig] = Counter()
    for other_seq, other in group.seqs.items():
        if other_seq != seq:
            history.update(sig for r, sig in other.sigs.items() if other.states.get(r) != schema.STATE_ERROR)
    if sum(history.values()) < 2:
        return None
    usual = history.most_common(1)[0][0]
    minority: dict[int, Sig] = {}
    field = ""
    for rank, sig in failed.items():
        if any(not _differs(sig, seen) for seen in history):
            continue  # a signature this group has used before: it failed for another reason
        minority[rank] = sig
        field = field or _differs(usual, sig) or "signature"
    if not minority:
        return None
    return Mismatch(group.group_id, seq, minority, usual, field, basis="history")


def _split(group: GroupState, seq: int, sigs: dict[int, Sig]) -> Mismatch:
    classes: list[list[int]] = []
    reps: list[Sig] = []
    for rank, sig in sigs.items():
        for i, rep in enumerate(reps):
            if not _differs(rep, sig):
                classes[i].append(rank)
                break
        else:
            reps.append(sig)
            classes.append([rank])
    history: Counter[Sig] = Counter()
    for other_seq, rec in group.seqs.items():
        if other_seq != seq:
            history.update(rec.sigs.values())

    def weight(i: int) -> tuple[int, int]:
        """Members first, then how often the group issued a signature that agrees with it before
        (op, bytes and dtype as _differs compares them: a dtype-only tie of two members is broken
        by the dtype the group always used)."""
        return (len(classes[i]), sum(n for sig, n in history.items() if not _differs(reps[i], sig)))

    major = max(range(len(classes)), key=weight)
    minority = {rank: sigs[rank] for i, members in enumerate(classes) if i != major for rank in members}
    field = _differs(reps[major], next(iter(minority.values())))
    return Mismatch(group.group_id, seq, minority, reps[major], field)


# --------------------------------------------------------------------------------------
# slowdown
# --------------------------------------------------------------------------------------
@dataclass(slots=True)
class Slowdown:
    group_id: str
    baseline_s: float
    recent_s: float
    straggler: int | None
    last_share: float
    lag_s: float
    comm_ratio: float
    samples: int
    reason: str

    @property
    def ratio(self) -> float:
        return self.recent_s / self.baseline_s if self.baseline_s > 0 else 0.0

    def as_evidence(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id, "baseline_interval_s": round(self.baseline_s, 4),
            "recent_interval_s": round(self.recent_s, 4), "slowdown_ratio": round(self.ratio, 2),
            "last_arrival_share": round(self.last_share, 2), "median_arrival_lag_s": round(self.lag_s, 4),
            "comm_time_ratio": round(self.comm_ratio, 2), "seqs_considered": self.samples,
            "reason": self.reason,
        }


CompleteSeq = tuple[int, float, dict[int, float], float]


def _complete_seqs(group: GroupState) -> list[CompleteSeq]:
    """(seq, completion time, starts, min duration) of seqs every member reported (op spans only
    write starts and ends: only the seqs they wrote are read)."""
    size = group.size
    out = []
    seqs = group.seqs
    for seq in sorted(s for s in group.op_seqs if s in seqs):
        rec = seqs[seq]
        if size < 2 or len(rec.ends) < size or len(rec.starts) < size:
            continue
        durations = [rec.ends[r] - rec.starts[r] for r in rec.ends if r in rec.starts]
        out.append((seq, max(rec.ends.values()), rec.starts, min(durations) if durations else 0.0))
    return out


def _complete_seqs_since(group: GroupState, known: tuple[tuple[int, int], list[CompleteSeq], list[SeqRecord]] | None) \
        -> tuple[tuple[int, int], list[CompleteSeq], list[SeqRecord]]:
    """_complete_seqs, from the last answer while no op span was folded into the group since.

    Only op spans write a seq's starts and ends; heartbeats add seqs (without ends: never
    complete) and the window drops the oldest. So with the same op-span count and size the
    complete seqs are the last ones still held, as the same records (a seq dropped and made
    again by a late heartbeat is a new, empty record). At 16k ranks every TP group gains seqs
    every beat: recomputing ~2k groups' 256 seqs cost ~0.1 s a search."""
    key = (group.op_spans, group.size)
    seqs = group.seqs
    if known is not None and known[0] == key:
        keep = [seqs.get(c[0]) is rec for c, rec in zip(known[1], known[2], strict=True)]
        if all(keep):
            return known
        return key, list(itertools.compress(known[1], keep)), list(itertools.compress(known[2], keep))
    complete = _complete_seqs(group)
    return key, complete, [seqs[c[0]] for c in complete]


def _last_arrivals(window: list[tuple[int, float, dict[int, float], float]]) -> tuple[int | None, float, float]:
    """The rank that most often issued last, its share of last arrivals and its median lag."""
    lasts: Counter[int] = Counter()
    lags: dict[int, list[float]] = {}
    for _, _, starts, _ in window:
        ordered = sorted(starts.items(), key=lambda kv: kv[1])
        last_rank, last_t = ordered[-1]
        lasts[last_rank] += 1
        others = [t for r, t in ordered if r != last_rank]
        lags.setdefault(last_rank, []).append(last_t - statistics.median(others) if others else 0.0)
    if not lasts:
        return None, 0.0, 0.0
    rank, count = lasts.most_common(1)[0]
    return rank, count / len(window), statistics.median(lags[rank])


def find_slowdowns(job: JobState, cfg: AnalysisConfig) -> list[Slowdown]:
    found: list[Slowdown] = []
    # a group's complete seqs change only with an op span folded into it, or a seq dropped
    # (_complete_seqs_since): at 16k ranks re-reading every seq record of 4k groups was ~0.1 s a search
    memo: dict[str, tuple[tuple[int, int], list[CompleteSeq], list[SeqRecord]]] = \
        job.memo.setdefault("complete_seqs", {})
    for gid, group in job.groups.items():
        if not group.durations:
            continue  # no op span completed in it (heartbeats only): no seq every member reported
        known = memo[gid] = _complete_seqs_since(group, memo.get(gid))
        seqs = known[1]
        if len(seqs) < cfg.slow_window + 2:
            continue
        times = [s[1] for s in seqs]
        intervals = [b - a for a, b in itertools.pairwise(times)]
        recent_iv = intervals[-cfg.slow_window:]
        base_iv = intervals[:-cfg.slow_window]
        recent = statistics.median(recent_iv)
        window = seqs[-cfg.slow_window:]
        straggler, share, lag = _last_arrivals(window)
        if len(base_iv) >= cfg.slow_baseline_min:
            baseline = statistics.median(base_iv)
            base_comm = statistics.median(s[3] for s in seqs[:-cfg.slow_window]) or 1e-9
            comm_ratio = statistics.median(s[3] for s in window) / base_comm
            if recent > cfg.slow_ratio * baseline and recent - baseline > cfg.slow_min_delta_s:
                if share >= cfg.straggler_share and lag > 0.5 * (recent - baseline):
                    found.append(Slowdown(group.group_id, baseline, recent, straggler, share, lag, comm_ratio,
                                          len(window), "interval up, one rank arrives last"))
                elif comm_ratio >= cfg.slow_ratio:
                    found.append(Slowdown(group.group_id, baseline, recent, None, share, lag, comm_ratio,
                                          len(window), "interval up, communication time up, normal skew"))
                continue
        long_window = seqs[-cfg.straggler_lag_only_window:]
        if len(long_window) < cfg.straggler_lag_only_window:
            continue
        straggler, share, lag = _last_arrivals(long_window)
        long_iv = intervals[-cfg.straggler_lag_only_window:]
        med = statistics.median(long_iv)
        if (share >= cfg.straggler_lag_only_share and lag >= cfg.straggler_lag_only_fraction * med
                and lag > cfg.slow_min_delta_s):
            found.append(Slowdown(group.group_id, med - lag, med, straggler, share, lag, 1.0, len(long_window),
                                  "one rank arrives last by most of a step, every step"))
    return found
