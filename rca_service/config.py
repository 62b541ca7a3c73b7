"""Analysis thresholds in one place, so tests, the service and the CLI agree on them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AnalysisConfig:
    """Knobs of the pure analysis. Defaults aim at seconds-level detection without false alarms."""

    # hang: an op in flight longer than max(hang_min_s, hang_factor * recent p95 op time)
    hang_min_s: float = 1.0
    hang_factor: float = 6.0
    hang_max_s: float = 120.0
    # lost heartbeats: silent for lost_intervals * interval + lost_slack_s
    lost_intervals: float = 2.5
    lost_slack_s: float = 0.3
    # a rank others wait on: suspect after this many missed intervals (verdict deferred),
    # convicted as lost after corroborated_lost_intervals (its peers' hang corroborates)
    suspect_intervals: float = 1.2
    corroborated_lost_intervals: float = 2.0
    suspect_slack_s: float = 0.15
    # stall: nothing in flight, nothing completing, for max(stall_min_s, stall_factor * interval)
    stall_min_s: float = 30.0
    stall_factor: float = 20.0
    # slowdown: recent median interval vs baseline median interval
    slow_ratio: float = 1.6
    slow_min_delta_s: float = 0.01
    slow_window: int = 8
    slow_baseline_min: int = 8
    # straggler: same rank last to arrive in >= this share of the window
    straggler_share: float = 0.75
    # lag-only straggler (no baseline shift needed): stricter
    straggler_lag_only_share: float = 0.9
    straggler_lag_only_window: int = 16
    straggler_lag_only_fraction: float = 0.5  # lag >= fraction * median interval
    # a condition must clear for this long before its incident resolves
    resolve_after_s: float = 3.0
    # bounded memory
    max_seqs_per_group: int = 256
    max_groups_per_job: int = 4096
    max_ranks_per_job: int = 131072
    max_stack_chars: int = 4000
    job_ttl_s: float = 3600.0
    max_jobs: int = 256
