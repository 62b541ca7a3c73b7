"""The control path found, not configured: where a rank polls for directives when nobody said.

A rank that exports its spans straight to `mycroft rca serve` already knows the service's
address: the OTLP endpoint. The service answers a small question on its OTLP ports, "where is
your control API?" (gRPC: the unary method schema.CONTROL_GRPC_SERVICE / CONTROL_GRPC_METHOD;
HTTP: GET schema.CONTROL_HTTP_PATH), with the port and scheme of its HTTP API; the rank polls
that port on the host it exports to. Behind an
OpenTelemetry Collector nobody answers (UNIMPLEMENTED / 404): the rank says so once, and
MYCROFT_CONTROL_ENDPOINT remains to be set for actions to reach the job (docs/actions.md).

Asked by the host's directive poller thread, never by the training thread (the endpoint may
black-hole); `otlp_target` and `control_url` are pure.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from mycroft.instrumentation.export import otlp_over_http, otlp_protocol, traces_exporter_name

from mycroft import schema

log = logging.getLogger("mycroft.instrumentation")

CONTROL_METHOD = f"/{schema.CONTROL_GRPC_SERVICE}/{schema.CONTROL_GRPC_METHOD}"
ENV_DISCOVERY = "MYCROFT_CONTROL_DISCOVERY"  # "off": never ask the OTLP endpoint
ASK_TIMEOUT_S = 3.0


@dataclass(frozen=True, slots=True)
class OtlpTarget:
    """Where this rank's spans go: protocol ("grpc" | "http"), scheme, host, port."""

    protocol: str
    scheme: str
    host: str
    port: int


def otlp_target(env: Mapping[str, str]) -> OtlpTarget | None:
    """The OTLP endpoint the standard OTEL_* variables name (export.exporter_from_env's choice), or None
    when export is off, discovery is off or the endpoint does not parse (pure)."""
    if env.get(ENV_DISCOVERY, "").strip().lower() in ("0", "off", "false", "no"):
        return None
    name = traces_exporter_name(env)
    if name not in ("otlp", "otlp_proto_grpc", "otlp_proto_http"):
        return None
    http = otlp_over_http(name, otlp_protocol(env))
    endpoint = (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or ("http://localhost:4318" if http else "http://localhost:4317")).strip()
    if "://" not in endpoint:
        endpoint = "http://" + endpoint  # gRPC endpoints are often written host:port
    try:
        parsed = urllib.parse.urlsplit(endpoint)
        port = parsed.port or (443 if parsed.scheme == "https" else 4318 if http else 4317)
    except ValueError:
        return None
    if not parsed.hostname or parsed.scheme not in ("http", "https"):
        return None
    return OtlpTarget("http" if http else "grpc", parsed.scheme, parsed.hostname, port)


def control_url(target: OtlpTarget, answer: bytes) -> str | None:
    """The control API's base URL from the service's answer, on the host the rank exports to (pure)."""
    try:
        doc = json.loads(answer)
        port = int(doc["port"])
        scheme = str(doc.get("scheme") or target.scheme)
    except (ValueError, KeyError, TypeError):
        return None
    if not 0 < port < 65536 or scheme not in ("http", "https"):
        return None
    host = f"[{target.host}]" if ":" in target.host else target.host
    return f"{scheme}://{host}:{port}"


def ask(target: OtlpTarget, token: str = "", timeout_s: float = ASK_TIMEOUT_S) -> str | None:
    """Ask the OTLP endpoint where its control API is; None when it does not say (a collector, an
    older service, nothing listening). Raises nothing."""
    try:
        if target.protocol == "grpc":
            answer = _ask_grpc(target, token, timeout_s)
        else:
            base = f"{target.scheme}://{target.host}:{target.port}"
            request = urllib.request.Request(base + schema.CONTROL_HTTP_PATH)
            if token:
                request.add_header("Authorization", f"Bearer {token}")
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                answer = response.read(4096)
    except Exception as exc:
        log.debug("mycroft: %s:%d did not say where its control API is (%r)", target.host, target.port, exc)
        return None
    return control_url(target, answer) if answer else None


def _ask_grpc(target: OtlpTarget, token: str, timeout_s: float) -> bytes:
    import grpc

    address = f"{target.host}:{target.port}"
    channel = grpc.secure_channel(address, grpc.ssl_channel_credentials()) if target.scheme == "https" \
        else grpc.insecure_channel(address)
    try:
        call = channel.unary_unary(CONTROL_METHOD, request_serializer=None, response_deserializer=None)
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        answer: bytes = call(b"", timeout=timeout_s, metadata=metadata)
        return answer
    finally:
        channel.close()
