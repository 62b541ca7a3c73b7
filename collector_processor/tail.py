"""The tail-keeping rule: which collectives keep their raw native detail.

Raw step detail is what an engineer opens when a collective went wrong, and noise
otherwise. A collective "looks anomalous" when it is incomplete (members missing),
failed on some rank, arrived skewed, or ran slow against its own recent history
(an EWMA per job / group / op / size, in a bounded LRU). Only those keep raw detail.
"""

from __future__ import annotations

from dataclasses import dataclass

from mycroft import schema

from .config import ProcessorConfig
from .join import CollectiveKey, CollectiveStats
from .window import BoundedLru

BaselineKey = tuple[str, str, str, int]  # (job, group, op, bytes)


@dataclass(slots=True)
class Baseline:
    mean_s: float
    samples: int


class TailPolicy:
    """Judges a closed collective; learns per-shape duration baselines as it goes."""

    def __init__(self, config: ProcessorConfig) -> None:
        self.config = config
        self._baselines: BoundedLru[BaselineKey, Baseline] = BoundedLru(config.max_baselines)

    def judge(self, key: CollectiveKey, stats: CollectiveStats) -> str:
        """Comma-separated anomaly reasons, "" for a normal collective (then update the baseline)."""
        reasons: list[str] = []
        if not stats.complete or stats.missing:
            reasons.append(schema.ANOMALY_INCOMPLETE)
        if stats.error_ranks:
            reasons.append(schema.ANOMALY_ERROR)
        if len(stats.ranks) > 1 and stats.arrival_skew_s >= self.config.skew_threshold_s:
            reasons.append(schema.ANOMALY_SKEWED)
        bkey: BaselineKey = (key.job_id, key.group_id, key.op, key.rank_bytes)
        base = self._baselines.get(bkey)
        if (base is not None and base.samples >= self.config.slow_min_samples
                and stats.effective_s >= self.config.slow_factor * base.mean_s > 0):
            reasons.append(schema.ANOMALY_SLOW)
        if stats.complete and not stats.error_ranks:
            # every complete sample moves the baseline, so a lasting change becomes the new normal
            # after a few collectives (the transition is what gets kept)
            if base is None:
                self._baselines.put(bkey, Baseline(stats.effective_s, 1))
            else:
                alpha = self.config.baseline_alpha
                base.mean_s = (1 - alpha) * base.mean_s + alpha * stats.effective_s
                base.samples += 1
        return ",".join(reasons)
