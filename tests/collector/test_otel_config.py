"""otel-config/: every file parses, every pipeline is wired, every port agrees with the code."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from mycroft.collector_processor import config as defaults
from mycroft.collector_processor.cli import _serve  # noqa: F401  (the command the README documents exists)
from mycroft.collector_processor.collector import EmbeddedCollector

from mycroft import schema
from tests.conftest import REPO

CONFIG = REPO / "otel-config"
OTELCOL_FILES = [*sorted((CONFIG / "otelcol").glob("*.yaml")), CONFIG / "compose" / "otelcol.yaml"]
# component types these configs may use, all in otelcol-contrib
KNOWN_TYPES = {
    "receivers": {"otlp"},
    "processors": {"batch", "memory_limiter", "filter"},
    "exporters": {"otlp", "loadbalancing", "debug"},
}


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1].rstrip("/"))


def _load(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict), path
    return document


def _rca_default_port() -> int:
    from mycroft.rca_service.cli import build_parser

    return _port(build_parser().parse_args(["serve"]).otlp_grpc)


def test_every_yaml_file_parses() -> None:
    files = sorted(CONFIG.rglob("*.yaml"))
    assert len(files) >= 7
    for path in files:
        _load(path)


@pytest.mark.parametrize("path", OTELCOL_FILES, ids=lambda p: str(p.relative_to(CONFIG)))
def test_pipelines_reference_defined_components(path: Path) -> None:
    config = _load(path)
    pipelines = config["service"]["pipelines"]
    assert pipelines
    used: dict[str, set[str]] = {"receivers": set(), "processors": set(), "exporters": set()}
    for name, pipeline in pipelines.items():
        assert name.split("/")[0] == "traces", name
        assert pipeline["receivers"] and pipeline["exporters"], name
        for kind in used:
            for component in pipeline.get(kind, []):
                assert component in (config.get(kind) or {}), f"{path.name}: {name} uses undefined {component}"
                used[kind].add(component)
        # the order the OpenTelemetry docs prescribe: memory_limiter first, batch after it
        processors = pipeline.get("processors", [])
        assert processors[:1] == ["memory_limiter"] and "batch" in processors, name
    for kind, names in used.items():
        defined = set(config.get(kind) or {})
        assert defined == names, f"{path.name}: {kind} defined but unused: {defined - names}"
        for component in defined:
            assert component.split("/")[0] in KNOWN_TYPES[kind], component


def _exporters_by_role(config: dict[str, Any]) -> dict[str, list[str]]:
    """Endpoints of the processor stage, the processed-return receiver and the RCA exporters."""
    roles: dict[str, list[str]] = {"processor": [], "rca": [], "processed": [], "ingest": []}
    for name, exporter in config["exporters"].items():
        if name.endswith("mycroft-processor"):
            roles["processor"].append(exporter["endpoint"])
        elif name.endswith("rca"):
            static = exporter.get("resolver", {}).get("static", {}).get("hostnames")
            roles["rca"] += static or [exporter["endpoint"]]
    for name, receiver in config["receivers"].items():
        grpc_endpoint = receiver["protocols"]["grpc"]["endpoint"]
        roles["processed" if name == "otlp/processed" else "ingest"].append(grpc_endpoint)
    return roles


@pytest.mark.parametrize("path", OTELCOL_FILES, ids=lambda p: str(p.relative_to(CONFIG)))
def test_ports_agree_with_the_code(path: Path) -> None:
    config = _load(path)
    roles = _exporters_by_role(config)
    assert [_port(e) for e in roles["ingest"]] == [_port(defaults.COLLECTOR_OTLP_GRPC)]
    http = config["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    assert _port(http) == _port(defaults.COLLECTOR_OTLP_HTTP)
    if path.name == "agent.yaml":
        # agents only route whole jobs to gateways, on the gateways' ingest port
        hostnames = config["exporters"]["loadbalancing/gateways"]["resolver"]["static"]["hostnames"]
        assert {_port(h) for h in hostnames} == {_port(defaults.COLLECTOR_OTLP_GRPC)}
        # by trace id: every rank's span of a collective reaches the gateway that joins it
        assert config["exporters"]["loadbalancing/gateways"]["routing_key"] == "traceID"
        return
    assert [_port(e) for e in roles["processor"]] == [_port(defaults.PROCESSOR_OTLP_GRPC)]
    assert [_port(e) for e in roles["processed"]] == [defaults.PROCESSED_OTLP_GRPC_PORT]
    assert roles["rca"]
    shared_host = "host.docker.internal" in " ".join(roles["rca"])
    expected_rca = defaults.RCA_SHARED_HOST_OTLP_GRPC_PORT if shared_host else _rca_default_port()
    assert {_port(e) for e in roles["rca"]} == {expected_rca}
    assert _rca_default_port() == defaults.RCA_OTLP_GRPC_PORT
    if path.name == "gateway.yaml":  # a job's heartbeats all reach one RCA instance, from every gateway
        rca = config["exporters"]["loadbalancing/rca"]
        assert rca["routing_key"] == "attributes" and rca["routing_attributes"] == [schema.RES_JOB_ID]
    # the processed spans feed the RCA service, and both trace backends without heartbeats
    pipelines = config["service"]["pipelines"]
    backends, rca_out = pipelines["traces/backends"], pipelines["traces/rca"]
    assert {e.split("/")[1] for e in backends["exporters"]} == {"jaeger", "tempo"}
    assert [e.split("/")[1] for e in rca_out["exporters"]] == ["rca"]
    assert backends["receivers"] == rca_out["receivers"] == ["otlp/processed"]
    assert "filter/no-heartbeats" in backends["processors"] and not any(
        p.startswith("filter") for p in rca_out["processors"])
    drop = config["processors"]["filter/no-heartbeats"]["traces"]["span"]
    assert drop == [f'name == "{schema.SPAN_HEARTBEAT}"']


def _commands(text: str, program: str) -> list[list[str]]:
    lines = (line.strip().lstrip("#").strip().strip("`") for line in re.sub(r"\\\n\s*", " ", text).splitlines())
    words = [shlex.split(line) for line in lines if line.startswith(f"mycroft {program} --")]
    return [w[1:] for w in words]


def _flag(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == flag]


def test_documented_commands_agree_with_the_configs() -> None:
    texts = [(CONFIG / "README.md").read_text(), *(p.read_text() for p in OTELCOL_FILES)]
    serves = [args for text in texts for args in _commands(text, "processor serve")]
    assert len(serves) >= 3
    for args in serves:
        assert args[:2] == ["processor", "serve"]
        assert [_port(x) for x in _flag(args, "--otlp-grpc")] == [_port(defaults.PROCESSOR_OTLP_GRPC)]
        assert [_port(x) for x in _flag(args, "--otlp-http")] == [_port(defaults.PROCESSOR_OTLP_HTTP)]
        assert [_port(x) for x in _flag(args, "--export")] == [defaults.PROCESSED_OTLP_GRPC_PORT]
    rca = [args for text in texts for args in _commands(text, "rca serve")]
    assert rca
    for args in rca:
        assert [_port(x) for x in _flag(args, "--otlp-grpc")] == [defaults.RCA_SHARED_HOST_OTLP_GRPC_PORT]
        assert [_port(x) for x in _flag(args, "--otlp-http")] == [defaults.RCA_SHARED_HOST_OTLP_HTTP_PORT]
    (run,) = [args for text in texts for args in _commands(text, "collector run")]
    assert _flag(run, "--otlp-grpc") == [defaults.COLLECTOR_OTLP_GRPC]
    assert _flag(run, "--otlp-http") == [defaults.COLLECTOR_OTLP_HTTP]
    assert _port(_flag(run, "--export")[0]) == defaults.RCA_SHARED_HOST_OTLP_GRPC_PORT


def _env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))
    return {key: value for key, value in pairs}


def test_rotel_env_is_what_mycroft_collector_run_starts() -> None:
    documented = _env_file(CONFIG / "rotel" / "rotel.env")
    collector = EmbeddedCollector([f"http://127.0.0.1:{defaults.RCA_SHARED_HOST_OTLP_GRPC_PORT}"])
    actual = collector.rotel_env()
    assert set(documented) == set(actual)
    for key, value in documented.items():  # <...> stands for a machine-specific path
        pattern = ".+".join(re.escape(part) for part in re.split(r"<[^>]+>", value))
        assert re.fullmatch(pattern, actual[key]), (key, actual[key])
    assert Path(actual["ROTEL_OTLP_WITH_TRACE_PROCESSOR"]).is_file()


def test_compose_file_wires_the_services() -> None:
    compose = _load(CONFIG / "compose" / "docker-compose.yaml")
    services = compose["services"]
    assert set(services) == {"otelcol", "jaeger", "tempo", "grafana", "prometheus", "alertmanager"}
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            assert (CONFIG / "compose" / source).exists(), source
    published = {int(p.split(":")[0]) for p in services["otelcol"]["ports"]}
    assert published == {_port(defaults.COLLECTOR_OTLP_GRPC), _port(defaults.COLLECTOR_OTLP_HTTP),
                         defaults.PROCESSED_OTLP_GRPC_PORT}
    collector = _load(CONFIG / "compose" / "otelcol.yaml")
    assert collector["exporters"]["otlp/jaeger"]["endpoint"] == "jaeger:4317"
    assert collector["exporters"]["otlp/tempo"]["endpoint"] == "tempo:4317"
    tempo = _load(CONFIG / "compose" / "tempo.yaml")
    assert _port(tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]) == 4317
    datasources = {d["type"]: d["url"] for d in _load(CONFIG / "compose" / "grafana-datasources.yaml")["datasources"]}
    assert datasources == {"tempo": f"http://tempo:{tempo['server']['http_listen_port']}",
                           "jaeger": "http://jaeger:16686", "prometheus": "http://prometheus:9090"}


# the loadbalancing exporter's own rules (opentelemetry-collector-contrib
# exporter/loadbalancingexporter, config.go and README): what otelcol would refuse at start
LB_ROUTING_KEYS_FOR_TRACES = {"traceID", "service", "attributes"}
LB_RESOLVERS = {"static", "dns", "k8s", "aws_cloud_map"}


def test_loadbalancing_exporters_follow_the_exporters_config_rules() -> None:
    """No otelcol binary here: check each loadbalancing exporter against the upstream rules."""
    seen = 0
    for path in OTELCOL_FILES:
        for name, exporter in (_load(path).get("exporters") or {}).items():
            if name.split("/")[0] != "loadbalancing":
                continue
            seen += 1
            where = f"{path.name}: {name}"
            key = exporter.get("routing_key", "traceID")
            assert key in LB_ROUTING_KEYS_FOR_TRACES, where
            attributes = exporter.get("routing_attributes")
            # routing_attributes only has meaning with routing_key attributes, which needs it
            assert (key == "attributes") == bool(attributes), where
            assert set(exporter) <= {"routing_key", "routing_attributes", "protocol", "resolver", "timeout",
                                     "sending_queue", "retry_on_failure"}, where
            resolver = exporter["resolver"]
            assert len(resolver) == 1 and set(resolver) <= LB_RESOLVERS, where
            assert set(exporter["protocol"]) == {"otlp"}, where  # the only protocol it speaks
            # every OTLP exporter option but the endpoint: the resolver says where
            assert "endpoint" not in exporter["protocol"]["otlp"], where
            hostnames = resolver.get("static", {}).get("hostnames", [])
            assert len(hostnames) >= 2 and all(_port(h) > 0 for h in hostnames), where
    assert seen >= 2
