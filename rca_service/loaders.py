"""Span sources for post-mortems: an OTLP JSON file, Jaeger's api_v3, Tempo's HTTP API.

Each returns SpanRecords; the offline analyzer replays them through the same engine
the live service runs.
"""

from __future__ import annotations

import base64
import binascii
import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from mycroft import schema
from mycroft.otlp import OtlpDecodeError, SpanRecord, decode_json, decode_json_lines

from .incidents import rfc3339

_ID_LENGTHS = {"traceId": 32, "spanId": 16, "parentSpanId": 16, "traceID": 32, "spanID": 16}


class LoadError(RuntimeError):
    """A source that cannot be read or does not hold OTLP traces; the message says why."""


def load_otlp_file(path: str | Path) -> list[SpanRecord]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise LoadError(f"cannot read {path}: {exc}") from exc
    try:
        return decode_json_lines(text)
    except OtlpDecodeError as exc:
        raise LoadError(f"{path}: {exc}") from exc


def normalize_otlp_json(node: Any) -> Any:
    """Backends differ: base64 ids (Tempo, grpc-gateway), "batches" / "instrumentationLibrarySpans"."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "batches":
                key = "resourceSpans"
            elif key == "instrumentationLibrarySpans":
                key = "scopeSpans"
            elif key == "instrumentationLibrary":
                key = "scope"
            if key in _ID_LENGTHS and isinstance(value, str):
                out[key.replace("ID", "Id")] = _hex_id(value, _ID_LENGTHS[key])
            else:
                out[key] = normalize_otlp_json(value)
        return out
    if isinstance(node, list):
        return [normalize_otlp_json(item) for item in node]
    return node


def _hex_id(value: str, hex_len: int) -> str:
    if not value:
        return value
    if len(value) == hex_len and all(c in "0123456789abcdefABCDEF" for c in value):
        return value.lower()
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return value
    return raw.hex().rjust(hex_len, "0")


def records_from_document(document: Any) -> list[SpanRecord]:
    """Find every OTLP traces payload inside a backend's response and decode it."""
    payloads: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "resourceSpans" in node or "batches" in node:
                payloads.append(normalize_otlp_json(node))
                return
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(document)
    records: list[SpanRecord] = []
    for payload in payloads:
        try:
            records.extend(decode_json(payload))
        except OtlpDecodeError as exc:
            raise LoadError(str(exc)) from exc
    return records


def _get(url: str, timeout: float, accept: str = "application/json") -> bytes:
    request = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return bytes(response.read())
    except OSError as exc:
        raise LoadError(f"GET {url} failed: {exc}") from exc


def _json_documents(body: bytes) -> list[Any]:
    """One JSON document, or a stream of them (grpc-gateway streams one per line)."""
    text = body.decode("utf-8", "replace").strip()
    if not text:
        return []
    try:
        return [json.loads(text)]
    except ValueError:
        pass
    docs = []
    decoder = json.JSONDecoder()
    i = 0
    while i < len(text):
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            break
        try:
            doc, i = decoder.raw_decode(text, i)
        except ValueError as exc:
            raise LoadError(f"response is not JSON: {exc}") from exc
        docs.append(doc)
    return docs


def load_jaeger(base_url: str, service: str, start: float, end: float, limit: int = 1000,
                timeout: float = 30.0) -> list[SpanRecord]:
    """Jaeger api_v3 FindTraces: GET /api/v3/traces?query.service_name=..."""
    params = {
        "query.service_name": service,
        "query.start_time_min": rfc3339(start),
        "query.start_time_max": rfc3339(end),
        "query.num_traces": str(limit),
    }
    url = f"{base_url.rstrip('/')}/api/v3/traces?{urllib.parse.urlencode(params)}"
    records: list[SpanRecord] = []
    for doc in _json_documents(_get(url, timeout)):
        if isinstance(doc, dict) and "error" in doc and "result" not in doc:
            raise LoadError(f"Jaeger answered an error: {doc['error']}")
        records.extend(records_from_document(doc))
    return records


def load_tempo(base_url: str, job: str, start: float, end: float, limit: int = 1000,
               timeout: float = 30.0) -> list[SpanRecord]:
    """Tempo: TraceQL search for the job's traces, then fetch each trace."""
    base = base_url.rstrip("/")
    query = f'{{ resource.{schema.RES_JOB_ID} = "{job}" }}'
    params = {"q": query, "start": str(int(start)), "end": str(int(end) + 1), "limit": str(limit),
              "spss": "1000"}
    body = _get(f"{base}/api/search?{urllib.parse.urlencode(params)}", timeout)
    try:
        found = json.loads(body)
    except ValueError as exc:
        raise LoadError(f"Tempo search answer is not JSON: {exc}") from exc
    ids = [t.get("traceID") for t in found.get("traces", []) if isinstance(t, dict) and t.get("traceID")]
    records: list[SpanRecord] = []
    for trace_id in ids:
        doc = json.loads(_get(f"{base}/api/traces/{trace_id}", timeout))
        records.extend(records_from_document(doc))
    return records
