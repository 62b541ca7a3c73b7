"""Configuration from MYCROFT_* environment variables (plus the standard OTEL_* ones).

Every knob has a sane default so `opentelemetry-instrument torchrun ...` needs none.
A malformed value falls back to its default with one warning: configuration must
never stop a training job.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

log = logging.getLogger("mycroft.instrumentation")

ENV_ENABLED = "MYCROFT_ENABLED"
ENV_JOB_ID = "MYCROFT_JOB_ID"
ENV_HEARTBEAT_INTERVAL = "MYCROFT_HEARTBEAT_INTERVAL"
ENV_STACK_AFTER = "MYCROFT_STACK_AFTER"
ENV_STACK_DEPTH = "MYCROFT_STACK_DEPTH"
ENV_QUEUE_SIZE = "MYCROFT_QUEUE_SIZE"
ENV_EXPORT_BATCH = "MYCROFT_EXPORT_BATCH"
ENV_EXPORT_DELAY = "MYCROFT_EXPORT_DELAY"
ENV_DDP_HOOK = "MYCROFT_DDP_HOOK"
ENV_CATCH_SIGNALS = "MYCROFT_CATCH_SIGNALS"
ENV_NATIVE = "MYCROFT_NATIVE"
ENV_HOT_PATH = "MYCROFT_HOT_PATH"
ENV_COMPLETION_POLL_MS = "MYCROFT_COMPLETION_POLL_MS"
ENV_MAX_PENDING_WORKS = "MYCROFT_MAX_PENDING_WORKS"
ENV_OP_SPAN_SAMPLE = "MYCROFT_OP_SPAN_SAMPLE"
ENV_KEEP_SLOW_OPS = "MYCROFT_KEEP_SLOW_OPS_S"
ENV_TRACE_BUDGET = "MYCROFT_TRACE_BUDGET"

#: op spans per second for the whole job (instrumentation/sampling.py). Tempo's default per-tenant
#: ingestion limit is 30 MB/s (modules/overrides/config.go, 2026-08); at ~600 B a span this is
#: ~1.2 MB/s per busy process group, so a 1,024-rank job with 3 busy groups per rank sends ~3.7 MB/s
DEFAULT_TRACE_BUDGET = 2048.0


def _float(name: str, default: float, minimum: float = 0.0) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
        if value < minimum:
            raise ValueError(f"below {minimum}")
        return value
    except ValueError as exc:
        log.warning("mycroft: ignoring %s=%r (%s); using %s", name, raw, exc, default)
        return default


def _int(name: str, default: int, minimum: int = 1) -> int:
    return int(_float(name, float(default), float(minimum)))


def _bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if raw.strip().lower() in ("0", "false", "no", "off"):
        return False
    log.warning("mycroft: ignoring %s=%r (not a boolean); using %s", name, raw, default)
    return default


@dataclass(frozen=True)
class MycroftConfig:
    """Resolved settings of one process. Read once, at instrument() time."""

    enabled: bool = True
    job_id: str | None = None  # None: negotiated through the c10d store at init
    heartbeat_interval_s: float = 1.0
    stack_after_s: float = 0.5
    stack_depth: int = 8
    queue_size: int = 65536
    export_batch: int = 512
    export_delay_s: float = 1.0
    # DDP's gradient all-reduce through the tracer: True, False, or None (auto: on for host-
    # synchronous backends such as gloo; off for NCCL-like ones, where a Python hook costs tens
    # of us per bucket and the Flight Recorder's frontier covers the C++ all-reduce instead)
    ddp_hook: bool | None = None
    catch_signals: tuple[str, ...] = field(default=("SIGTERM",))
    native: bool = True
    # sync collectives on host-synchronous groups recorded by the compiled hot path (_hotpath.c) where
    # it is built; off: every call through the Python wrapper (its definition)
    hot_path: bool = True
    completion_poll_s: float = 0.001  # device-async backends: how often pending Works are polled
    max_pending_works: int = 1024  # Works (and their tensors) held at most for completion polling
    native_linger_s: float = 0.02  # at exit: the plugin's linger + tick, waited once before its last flush
    # the telemetry diet (instrumentation/sampling.py): op spans per second for the whole job, kept by
    # trace id (the same on every rank, so a kept collective is whole; inf: no budget), under a fixed
    # share of collectives (op_span_sample); failed ops and ops slower than keep_slow_s always go
    trace_budget: float = DEFAULT_TRACE_BUDGET
    op_span_sample: float = 1.0
    keep_slow_s: float = 1.0

    @classmethod
    def from_env(cls) -> MycroftConfig:
        job = os.environ.get(ENV_JOB_ID) or None
        if job is None:
            run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
            if run_id and run_id != "none":
                job = run_id
        signals = tuple(
            name.strip().upper() for name in os.environ.get(ENV_CATCH_SIGNALS, "SIGTERM").split(",")
            if name.strip()
        )
        return cls(
            enabled=_bool(ENV_ENABLED, True) and not _bool("OTEL_SDK_DISABLED", False),
            job_id=job,
            heartbeat_interval_s=_float(ENV_HEARTBEAT_INTERVAL, 1.0, 0.01),
            stack_after_s=_float(ENV_STACK_AFTER, 0.5, 0.0),
            stack_depth=_int(ENV_STACK_DEPTH, 8),
            queue_size=_int(ENV_QUEUE_SIZE, 65536, 16),
            export_batch=_int(ENV_EXPORT_BATCH, 512),
            export_delay_s=_float(ENV_EXPORT_DELAY, 1.0, 0.0),
            ddp_hook=None if os.environ.get(ENV_DDP_HOOK, "auto").strip().lower() in ("", "auto")
            else _bool(ENV_DDP_HOOK, True),
            catch_signals=signals,
            native=_bool(ENV_NATIVE, True),
            hot_path=_bool(ENV_HOT_PATH, True),
            completion_poll_s=_float(ENV_COMPLETION_POLL_MS, 1.0, 0.05) / 1000.0,
            max_pending_works=_int(ENV_MAX_PENDING_WORKS, 1024, 1),
            trace_budget=_float(ENV_TRACE_BUDGET, DEFAULT_TRACE_BUDGET, 0.0),
            op_span_sample=min(1.0, _float(ENV_OP_SPAN_SAMPLE, 1.0, 0.0)),
            keep_slow_s=_float(ENV_KEEP_SLOW_OPS, 1.0, 0.0),
        )
