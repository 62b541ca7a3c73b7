"""mycroft.collector_processor: the collector stage between the ranks and the backends.

Joins each collective's rank spans into one summary span, condenses native step detail
into per-flow summaries (raw detail kept only for anomalous collectives), passes
heartbeats through at once; inside rotel (`mycroft collector run`) or as a standalone
OTLP service (`mycroft processor serve`). See docs/collector.md.
"""
