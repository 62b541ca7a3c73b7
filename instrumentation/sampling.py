"""The trace budget: which op spans a rank sends, so that a job's trace volume stays what a
backend can take while every rank makes the same choice for one collective.

Pure state machine, fed on the background thread (runtime._drain_ops); no torch, no I/O.

A collective's span is kept when its trace id is under a threshold (`schema.keep_trace`,
OTel's TraceIdRatioBased rule): the trace id is the same on every member, so members with the
same threshold keep or drop it alike, and a kept collective is whole. The threshold is set per
*stream* -- a process group's collectives, or one p2p pair's ops -- from that stream's own rate:

- the job budget `B` (op spans per second, MYCROFT_TRACE_BUDGET) gives every stream `B / world`
  kept collectives per second: a stream of n members then sends at most `n * B / world` spans/s,
  so a job whose ranks each take part in one busy stream sends at most B (k busy streams per
  rank: k * B);
- the rate is measured over seq epochs (EPOCH seqs): epoch j's duration is the time between the
  completions of seqs j*EPOCH and (j+1)*EPOCH, which a synchronising collective ends at nearly
  the same moment on every member, so every member measures nearly the same rate;
- the keep probability is 2^(-level/4) (quarter octaves), and epoch e uses the level computed
  from epoch e-LAG's rate: it goes up at once when the rate is over the allowance and down only
  when the rate fits the next level with room (HYSTERESIS), landing mid-band (MID), so the level
  of a steady stream does not move and members agree on it. Members can disagree only for the epoch in which a rate
  change crosses a threshold by less than their measuring difference (the completion skew over
  an epoch's duration): then a collective can be kept on some members only.
- anomalies go whatever the budget: failed / timed-out ops and ops slower than keep_slow_s
  (the RCA's evidence and what an operator opens a trace for).

The first LAG epochs of a stream are kept whole (no rate measured yet; a budget of 0 keeps none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mycroft import schema

EPOCH = 16  # seqs per rate measurement
LAG = 3  # epoch e is sampled at the level measured on epoch e - LAG (seqs complete in order, nearly)
STEPS_PER_OCTAVE = 4  # keep probability 2^(-level / 4): budget kept within (0.59 .. 1.0] of the allowance
HYSTERESIS = 0.7  # a level goes down only when the rate fits the lower level at 70% of the allowance
MID = 0.85  # a level that moves lands where the stream keeps at most 85% of its allowance
MAX_LEVEL = 40 * STEPS_PER_OCTAVE
KEPT_LEVELS = 8  # epochs whose level is remembered for ops that complete late


def keep_probability(level: int) -> float:
    return 1.0 if level <= 0 else 2.0 ** (-level / STEPS_PER_OCTAVE)


def level_for(rate: float, allowance: float) -> int:
    """The least level whose probability brings `rate` (collectives/s) to at most `allowance`."""
    if rate <= allowance:
        return 0
    if allowance <= 0.0:
        return MAX_LEVEL
    return min(MAX_LEVEL, math.ceil(STEPS_PER_OCTAVE * math.log2(rate / allowance) - 1e-9))


def next_level(level: int, rate: float, allowance: float) -> int:
    """A level moves only when its kept rate leaves (HYSTERESIS * allowance / one step, allowance]:
    over the allowance, or fitting the next lower level with room. It then lands mid-band (MID),
    so a rate that wobbles by less than ~15% after a move does not move it again."""
    over = rate * keep_probability(level) > allowance
    room = level > 0 and rate * keep_probability(level - 1) <= allowance * HYSTERESIS
    return level_for(rate, allowance * MID) if over or room else level


@dataclass(slots=True)
class Stream:
    """One group's collectives (or one p2p pair's ops) as this rank saw them complete."""

    marks: dict[int, int] = field(default_factory=dict)  # k -> end_ns of seq k * EPOCH
    levels: dict[int, int] = field(default_factory=dict)  # epoch -> its level (recent ones)
    epoch: int = -1  # the newest epoch whose level is set
    level: int = 0
    # the last decided epoch and its keep threshold (schema.keep_threshold): the other seqs of an
    # epoch, nearly every op, are then decided without level_of (TraceBudget.keep's first lines)
    decided_epoch: int = -1
    threshold: int = 0
    probability: float = 1.0  # the decided epoch's keep probability (on its kept spans)

    def level_of(self, epoch: int, allowance: float) -> int | None:
        """The level of `epoch` (None: older than what is remembered)."""
        if epoch - self.epoch > KEPT_LEVELS + LAG:  # a jump (first op seen late): no marks in between
            self.epoch = epoch - KEPT_LEVELS - LAG
        while self.epoch < epoch:
            self.epoch += 1
            j = self.epoch - LAG
            start, end = self.marks.get(j), self.marks.get(j + 1)
            if start is not None and end is not None and end > start:
                self.level = next_level(self.level, EPOCH * 1e9 / (end - start), allowance)
            self.levels[self.epoch] = self.level
            self.levels.pop(self.epoch - KEPT_LEVELS, None)
            self.marks.pop(j - 1, None)
        return self.levels.get(epoch)


@dataclass(slots=True)
class Counts:
    kept: int = 0  # op spans sent under the budget
    anomalies: int = 0  # op spans sent whatever the budget (failed, timed out, slow)
    sampled_out: int = 0  # op spans not sent


class TraceBudget:
    """This rank's keep / drop decisions for its op spans (one per rank, one thread)."""

    def __init__(self, budget_spans_s: float, world_size: int, ratio: float = 1.0, keep_slow_s: float = 1.0) -> None:
        self.budget = budget_spans_s  # the job's; math.inf: none
        self.allowance = budget_spans_s / max(1, world_size)  # kept collectives per second per stream
        self.ratio = ratio  # MYCROFT_OP_SPAN_SAMPLE: a fixed ceiling on top of the budget
        self.keep_slow_ns = keep_slow_s * 1e9
        self.streams: dict[tuple[str, int, int], Stream] = {}
        self.counts = Counts()
        # the keep probability behind the last True keep() answered (1.0: kept whatever the budget):
        # a kept span carries it, so a backend can weigh it and members' decisions can be compared
        self.kept_probability = 1.0

    def keep(self, trace_id: int, stream: tuple[str, int, int], seq: int, state: str, start_ns: int,
             end_ns: int) -> bool:
        """Whether this op's span is sent; counts the answer."""
        counts = self.counts
        s = self.streams.get(stream)
        if (s is not None and seq % EPOCH and seq // EPOCH == s.decided_epoch and state == schema.STATE_COMPLETED
                and end_ns - start_ns < self.keep_slow_ns):
            # the common op: completed in time, in the epoch decided last, not a rate mark
            if trace_id & schema.TRACE_ID_LOW_BITS < s.threshold:
                counts.kept += 1
                self.kept_probability = s.probability
                return True
            counts.sampled_out += 1
            return False
        if state != schema.STATE_COMPLETED or (end_ns and end_ns - start_ns >= self.keep_slow_ns):
            counts.anomalies += 1
            self.kept_probability = 1.0
            return True
        probability = self.ratio
        if self.allowance != math.inf:
            if s is None:
                # no rate measured yet: kept whole, unless the budget is none at all
                s = self.streams[stream] = Stream(level=MAX_LEVEL if self.allowance <= 0.0 else 0)
            if seq % EPOCH == 0 and end_ns:
                s.marks[seq // EPOCH] = end_ns
            level = s.level_of(seq // EPOCH, self.allowance)
            if level is None:  # completed more than KEPT_LEVELS epochs late: a slow op by any measure
                counts.anomalies += 1
                self.kept_probability = 1.0
                return True
            probability = min(probability, keep_probability(level))
            s.decided_epoch, s.threshold, s.probability = seq // EPOCH, schema.keep_threshold(probability), probability
        if schema.keep_trace(trace_id, probability):
            counts.kept += 1
            self.kept_probability = probability
            return True
        counts.sampled_out += 1
        return False

    def levels(self) -> dict[tuple[str, int, int], int]:
        """Each stream's current level (tests, the benchmark)."""
        return {key: s.level for key, s in self.streams.items()}
