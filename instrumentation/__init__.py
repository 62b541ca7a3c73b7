"""Python instrumentation of torch.distributed: spans per collective, heartbeats per rank.

Kept import-light: the instrumentor module imports torch only when instrument() runs.
"""

from typing import Any


def start(**kwargs: Any) -> Any:
    """Trace this process from here on: the one line for processes `opentelemetry-instrument` does not
    start (Ray actors, an RL trainer's own process groups, notebooks)::

        import mycroft.instrumentation; mycroft.instrumentation.start()

    Before or after `init_process_group` (groups created earlier are found). Configuration comes from
    the same OTEL_* / MYCROFT_* variables; keyword arguments go to `MycroftInstrumentor.instrument()`
    (tracer_provider=, span_exporter=, config=). Calling it again does nothing. Returns the instrumentor.
    """
    from mycroft.instrumentation.instrumentor import MycroftInstrumentor

    instrumentor = MycroftInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(**kwargs)
    return instrumentor
