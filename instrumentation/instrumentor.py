"""MycroftInstrumentor: the `opentelemetry_instrumentor` entry point for torch.distributed.

    opentelemetry-instrument torchrun --nproc-per-node 8 train.py     # no code change
    MycroftInstrumentor().instrument(tracer_provider=provider)        # OTel set up in code

instrument() only patches functions; the background runtime starts when
torch.distributed is initialised, so a script that never initialises it runs as before.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping
from typing import Any

from mycroft.instrumentation import agent, patching
from mycroft.instrumentation.config import MycroftConfig
from mycroft.instrumentation.recorder import Recorder
from mycroft.instrumentation.startup import StartupReporter, init_environment, launch_facts
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

log = logging.getLogger("mycroft.instrumentation")

STARTUP_OWNER_ENV = "MYCROFT_STARTUP_PID"  # the pid of the process that reports a rank's start-up


def _name_nccl_plugin() -> None:
    """NCCL_PROFILER_PLUGIN names Mycroft's plugin from process start (instrumentation/nccl_plugin.py);
    said once per process, at info (warning where the plugin is missing: NCCL's inside goes unseen)."""
    from mycroft.instrumentation import nccl_plugin
    from mycroft.native import installed_plugin

    try:
        choice = nccl_plugin.name_plugin(os.environ, installed_plugin())
    except Exception as exc:  # a broken environment never stops the job
        log.info("mycroft: NCCL profiler plugin not named (%r)", exc)
        return
    if choice.outcome == "kept_ours" and os.environ.get(nccl_plugin.NAMED_BY_MYCROFT_ENV) == "1":
        log.debug("%s", choice.message)  # every worker of a launch inherits it: said by the first only
    else:
        log.log(logging.WARNING if choice.outcome in ("missing", "kept_both") else logging.INFO, "%s", choice.message)


class MycroftInstrumentor(BaseInstrumentor):
    """Traces every collective and p2p op of torch.distributed, and heartbeats per rank.

    Keyword arguments of instrument():
      tracer_provider: an SDK TracerProvider; Mycroft's spans then go through its span
        processors (and its exporters) instead of Mycroft's own OTLP exporter.
      span_exporter: a SpanExporter to use instead of the one OTEL_* variables select.
      config: a MycroftConfig (default: read from MYCROFT_* variables).
    """

    _recorder: Recorder | None = None
    _runtime: Any = None
    _startup: Any = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("torch >= 2.4",)

    def _instrument(self, **kwargs: Any) -> None:
        config: MycroftConfig = kwargs.get("config") or MycroftConfig.from_env()
        if not config.enabled:
            log.info("mycroft: disabled by configuration")
            return
        try:
            import torch.distributed as dist
        except Exception as exc:  # torch without distributed support
            log.warning("mycroft: torch.distributed unavailable (%r); nothing to trace", exc)
            return
        if not dist.is_available():
            return
        _name_nccl_plugin()
        recorder = Recorder(config.queue_size, config.completion_poll_s, config.max_pending_works)
        self._recorder = recorder
        self._patcher = patching.Patcher()
        provider = kwargs.get("tracer_provider")
        deliver = getattr(provider, "_active_span_processor", None) if provider is not None else None
        base_resource = getattr(provider, "resource", None) if provider is not None else None
        exporter = kwargs.get("span_exporter")

        def start_reporting(env: Mapping[str, str]) -> Any:
            """Heartbeats from here on, where the launcher (or init's arguments) tell who we are."""
            try:
                facts = launch_facts(env)
                # only the process the launcher started: its children (spawned DataLoader workers, a
                # subprocess) inherit its environment and would report as the same rank
                owner = os.environ.get(STARTUP_OWNER_ENV)
                if facts is None or (owner and owner != str(os.getpid())):
                    return None
                os.environ[STARTUP_OWNER_ENV] = str(os.getpid())
                return StartupReporter(facts, config, base_resource, exporter, deliver)
            except Exception as exc:
                log.info("mycroft: no start-up heartbeats (%r)", exc)
                return None

        self._startup = start_reporting(os.environ) if not dist.is_initialized() else None
        if self._startup is None and not dist.is_initialized():
            # torchrun's own process, the node's agent: a multi-node launch waits there for the other nodes
            # before any rank exists (instrumentation/agent.py)
            try:
                agent.install(self._patcher, config, base_resource, exporter, deliver)
            except Exception as exc:
                log.info("mycroft: no node rendezvous reports (%r)", exc)

        def entering_init(init_kwargs: Mapping[str, Any]) -> None:
            from mycroft import schema

            if self._startup is None and self._runtime is None:
                # mp.spawn's workers learn their rank only now (the parent sets RANK in the child,
                # or passes rank= / world_size=): report the rendezvous from here on
                self._startup = start_reporting(init_environment(os.environ, init_kwargs))
            if self._startup is not None:
                self._startup.enter(schema.PHASE_RENDEZVOUS)

        def start_runtime() -> None:
            if self._runtime is not None:
                return
            from mycroft.instrumentation.runtime import Runtime

            early, self._startup = self._startup, None
            self._runtime = Runtime(config, recorder, exporter=exporter, deliver=deliver,
                                    base_resource=base_resource, startup=early)

        def stop_runtime() -> None:
            runtime, self._runtime = self._runtime, None
            if runtime is not None:  # bounded whatever the collector does (runtime.TEARDOWN_S)
                runtime.teardown(exit_reason="destroy_process_group")
            recorder.groups.reset()

        patching.install(self._patcher, recorder, config.ddp_hook, start_runtime, stop_runtime, entering_init,
                         hot_path=config.hot_path)
        if dist.is_initialized():
            start_runtime()

    def _uninstrument(self, **kwargs: Any) -> None:
        patcher = getattr(self, "_patcher", None)
        if patcher is not None:
            patcher.uninstall()
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            try:
                runtime.teardown(exit_reason="uninstrument")
            except Exception as exc:  # never into the caller's code
                log.warning("mycroft: shutting down the runtime failed (%r)", exc)
        startup, self._startup = getattr(self, "_startup", None), None
        if startup is not None:
            startup.stop()
        self._recorder = None

    @property
    def runtime(self) -> Any:
        """The running background runtime (None before init_process_group)."""
        return self._runtime
