"""The control path found, not configured: a rank asks its OTLP endpoint where the control API is."""

from __future__ import annotations

import json

import pytest
from mycroft.instrumentation.control_discovery import OtlpTarget, ask, control_url, otlp_target
from mycroft.instrumentation.directives import control_from_env

from mycroft.otlp_server import OtlpReceiver


@pytest.mark.parametrize(("env", "target"), [
    ({}, OtlpTarget("grpc", "http", "localhost", 4317)),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "rca-host:4317"}, OtlpTarget("grpc", "http", "rca-host", 4317)),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":
      "https://rca.example:4318/v1/traces"}, OtlpTarget("http", "https", "rca.example", 4318)),
    ({"OTEL_TRACES_EXPORTER": "otlp_proto_http"}, OtlpTarget("http", "http", "localhost", 4318)),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1]:7000"}, OtlpTarget("grpc", "http", "::1", 7000)),
    ({"OTEL_TRACES_EXPORTER": "none"}, None),
    ({"OTEL_TRACES_EXPORTER": "console"}, None),
    ({"MYCROFT_CONTROL_DISCOVERY": "off"}, None),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://x:1"}, None),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:99999"}, None),
])
def test_the_otlp_target_is_the_exporters(env: dict[str, str], target: OtlpTarget | None) -> None:
    assert otlp_target(env) == target


def test_a_configured_endpoint_wins_and_discovery_is_the_fallback() -> None:
    configured = control_from_env({"MYCROFT_CONTROL_ENDPOINT": "http://rca:8080/", "OTEL_EXPORTER_OTLP_ENDPOINT":
                                   "http://rca:4317"})
    assert configured is not None and (configured.endpoint, configured.discover) == ("http://rca:8080", None)
    found = control_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://rca:4317",
                              "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20tok"})
    assert found is not None and found.endpoint == "" and found.token == "tok"
    assert found.discover == OtlpTarget("grpc", "http", "rca", 4317)
    assert control_from_env({"OTEL_TRACES_EXPORTER": "none"}) is None


@pytest.mark.parametrize(("answer", "url"), [
    (b'{"port": 8080, "scheme": "http"}', "http://rca:8080"),
    (b'{"port": 8443, "scheme": "https"}', "https://rca:8443"),
    (b'{"port": 8080}', "http://rca:8080"),
    (b'{"port": 0}', None), (b'{"port": "x"}', None), (b'{"scheme": "http"}', None),
    (b'{"port": 1, "scheme": "file"}', None), (b"not json", None), (b"[]", None),
])
def test_the_answer_is_read_strictly(answer: bytes, url: str | None) -> None:
    assert control_url(OtlpTarget("grpc", "http", "rca", 4317), answer) == url


def _where() -> bytes:
    return json.dumps({"port": 18080, "scheme": "http"}).encode()


def test_a_service_says_where_on_both_otlp_ports_and_a_collector_says_nothing() -> None:
    """Real OTLP receivers (gRPC and HTTP), as `mycroft rca serve` runs them: one with a control API answers
    on both ports, on the host the rank reached; one without (a collector, an older service) does not."""
    service = OtlpReceiver(lambda records: None, "127.0.0.1:0", "127.0.0.1:0", control=_where).start()
    collector = OtlpReceiver(lambda records: None, "127.0.0.1:0", "127.0.0.1:0").start()
    try:
        assert ask(OtlpTarget("grpc", "http", "127.0.0.1", service.grpc_port or 0)) == "http://127.0.0.1:18080"
        assert ask(OtlpTarget("http", "http", "127.0.0.1", service.http_port or 0)) == "http://127.0.0.1:18080"
        assert ask(OtlpTarget("grpc", "http", "127.0.0.1", collector.grpc_port or 0), timeout_s=2) is None
        assert ask(OtlpTarget("http", "http", "127.0.0.1", collector.http_port or 0), timeout_s=2) is None
    finally:
        service.stop(0)
        collector.stop(0)
