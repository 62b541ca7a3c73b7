"""Tunables of the processor and the default addresses every deployment agrees on.

The defaults are the contract between the code, the CLI and otel-config/: a test
checks that every configuration file uses these ports.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Final

# Where ranks send by default (the standard OTLP ports): the embedded collector listens here.
COLLECTOR_OTLP_GRPC: Final = "127.0.0.1:4317"
COLLECTOR_OTLP_HTTP: Final = "127.0.0.1:4318"
# The standalone processor service (`mycroft processor serve`), one hop behind a collector.
PROCESSOR_OTLP_GRPC: Final = "127.0.0.1:14317"
PROCESSOR_OTLP_HTTP: Final = "127.0.0.1:14318"
# Where an otelcol-contrib collector receives the processor's output back (otel-config/otelcol).
PROCESSED_OTLP_GRPC_PORT: Final = 24317
# The RCA service's OTLP gRPC port: `mycroft rca serve`'s default, on its own host ...
RCA_OTLP_GRPC_PORT: Final = 4317
# ... and where it listens when it shares a host with a collector that owns 4317
RCA_SHARED_HOST_OTLP_GRPC_PORT: Final = 4327
RCA_SHARED_HOST_OTLP_HTTP_PORT: Final = 4328


@dataclass(frozen=True, slots=True)
class ProcessorConfig:
    """Windows, memory caps and anomaly thresholds of the processor core.

    Every cap exists so that a flood (a misbehaving rank, a huge job, native step detail
    at full rate) costs a counter, never unbounded memory or delay.
    """

    # join window: how long after a collective's first span its members may still arrive
    window_s: float = 10.0
    # once every member reported, wait this long for trailing native detail, then emit
    linger_s: float = 0.25
    # open collectives held at once; the oldest is closed early ("evicted") beyond this
    max_open: int = 20_000
    # raw native detail spans buffered across all open collectives / per collective
    max_detail_total: int = 50_000
    max_detail_per_collective: int = 10_000
    # distinct flows condensed per collective (rank x channel x peer x direction)
    max_flows_per_collective: int = 8_192
    # closed collectives remembered, so that late detail follows the same keep/condense decision
    max_decisions: int = 65_536
    # per (group, op, bytes) duration baselines remembered for the "slow" rule
    max_baselines: int = 8_192
    # anomaly rules for keeping raw detail
    skew_threshold_s: float = 0.05  # arrival skew at or above this is "skewed"
    slow_factor: float = 3.0  # effective time >= slow_factor x baseline is "slow"
    slow_min_samples: int = 3  # baseline samples needed before "slow" can fire
    baseline_alpha: float = 0.2  # EWMA weight of a new sample

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if value < 0 or (item.name in ("max_open", "max_decisions", "max_baselines") and value < 1):
                raise ValueError(f"ProcessorConfig.{item.name} must be positive, got {value!r}")
        if not 0 < self.baseline_alpha <= 1:
            raise ValueError("ProcessorConfig.baseline_alpha must be in (0, 1]")
