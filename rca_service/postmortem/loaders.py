"""Span sources for post-mortems: an OTLP JSON file, Jaeger's api_v3, Tempo's HTTP API.

Each returns SpanRecords; the offline analyzer replays them through the same engine
the live service runs. The two backends are read as their servers answer (Jaeger
v2.13-v2.20 cmd/.../apiv3/http_gateway.go, Tempo 2026-08 pkg/api/http.go and
modules/frontend/combiner/trace_by_id.go; tests/rca/test_offline.py replays those shapes):
Jaeger's "nothing in that window" is a 404, its errors a JSON `{"error": {...}}` body, and
Tempo's trace by id is asked inside a time range so it reads only the blocks of that range.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import math
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from mycroft import schema
from mycroft.otlp import OtlpDecodeError, SpanRecord, decode_json, decode_json_lines

from ..incidents.tracker import rfc3339

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


def _json_documents(body: bytes, what: str = "response") -> list[Any]:
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
            raise LoadError(f"{what} is not JSON: {exc}") from exc
        docs.append(doc)
    return docs


#: concurrent trace-by-id requests to Tempo (one search answer can name --limit traces)
TEMPO_FETCHES = 8
#: seconds added on each side of a trace's own time range when Tempo is asked for it by id
TRACE_MARGIN_S = 2


@dataclass(slots=True)
class Pulled:
    """What a backend gave: the spans, and what it could not give (said, not raised)."""

    records: list[SpanRecord] = field(default_factory=list)
    traces: int = 0  # traces the backend named (Tempo's search) or sent (Jaeger)
    missing: list[str] = field(default_factory=list)  # trace ids it answered 404 for
    failed: dict[str, str] = field(default_factory=dict)  # trace id -> why it could not be read
    notes: list[str] = field(default_factory=list)  # what the operator should know (limit reached, ...)


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes
    url: str


async def _fetch(session: aiohttp.ClientSession, url: str) -> Answer:
    try:
        async with session.get(url, headers={"Accept": "application/json"}) as response:
            return Answer(response.status, await response.read(), url)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise LoadError(f"GET {url} failed: {exc or type(exc).__name__}") from exc


def _run(main: Callable[[aiohttp.ClientSession], Any], timeout: float) -> Any:
    async def go() -> Any:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            return await main(session)

    return asyncio.run(go())


def error_text(answer: Answer) -> str:
    """A non-2xx answer in one line: Jaeger's `{"error": {"httpCode", "message"}}` body read,
    anything else (Tempo answers plain text) shortened."""
    try:
        doc = json.loads(answer.body)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        message = doc["error"].get("message") or json.dumps(doc["error"])
        return f"HTTP {answer.status}: {message}"
    text = " ".join(answer.body.decode("utf-8", "replace").split())
    return f"HTTP {answer.status}: {text[:300] or 'no body'}"


def _is_jaeger_none_found(answer: Answer) -> bool:
    """Jaeger answers a query that matched nothing with 404 and a gateway error body
    (returnTraces: `{"error":{"httpCode":404,"message":"No traces found"}}`); a 404 without
    that body is another server (a wrong URL, a proxy) and stays an error."""
    try:
        doc = json.loads(answer.body)
    except ValueError:
        return False
    return (answer.status == 404 and isinstance(doc, dict) and isinstance(doc.get("error"), dict)
            and doc["error"].get("httpCode", 404) == 404)


def jaeger_find_url(base_url: str, service: str, start: float, end: float, limit: int) -> str:
    """api_v3 FindTraces. The snake_case names are what v2.13 reads; v2.14+ read them as
    deprecated aliases of the camelCase ones (query_parser.go), so one URL serves both."""
    params = {
        "query.service_name": service,
        "query.start_time_min": rfc3339(start),
        "query.start_time_max": rfc3339(end),
        "query.num_traces": str(limit),
    }
    return f"{base_url.rstrip('/')}/api/v3/traces?{urllib.parse.urlencode(params)}"


def parse_jaeger_answer(answer: Answer) -> Pulled:
    """One FindTraces answer -> spans; "no traces found" is an empty result, not an error."""
    if _is_jaeger_none_found(answer):
        return Pulled(notes=["Jaeger has no traces of that service in the window"])
    if not 200 <= answer.status < 300:
        raise LoadError(f"Jaeger answered {error_text(answer)} (GET {answer.url})")
    pulled = Pulled()
    for doc in _json_documents(answer.body, "Jaeger's answer"):
        if isinstance(doc, dict) and "error" in doc and "result" not in doc:  # a streamed error
            raise LoadError(f"Jaeger answered an error: {doc['error']}")
        found = records_from_document(doc)
        pulled.records.extend(found)
        pulled.traces += len({r.trace_id for r in found})
    return pulled


def load_jaeger(base_url: str, service: str, start: float, end: float, limit: int = 1000,
                timeout: float = 30.0) -> Pulled:
    """Jaeger api_v3 FindTraces: GET /api/v3/traces?query.service_name=..."""
    url = jaeger_find_url(base_url, service, start, end, limit)
    pulled = parse_jaeger_answer(_run(lambda session: _fetch(session, url), timeout))
    if pulled.traces >= limit:
        pulled.notes.append(f"Jaeger sent {pulled.traces} traces, the --limit: older ones may be missing")
    return pulled


def traceql_job(job: str) -> str:
    """The TraceQL selecting one job's spans, its id a TraceQL string literal (Tempo's lexer
    reads strings with Go's strconv.Unquote: JSON's escapes are a subset it accepts)."""
    return f"{{ resource.{schema.RES_JOB_ID} = {json.dumps(job, ensure_ascii=False)} }}"


def tempo_search_url(base_url: str, job: str, start: float, end: float, limit: int) -> str:
    params = {"q": traceql_job(job), "start": str(int(start)), "end": str(math.ceil(end) + 1),
              "limit": str(limit), "spss": "1000"}
    return f"{base_url.rstrip('/')}/api/search?{urllib.parse.urlencode(params)}"


@dataclass(frozen=True, slots=True)
class FoundTrace:
    trace_id: str
    start: int  # unix seconds: the range Tempo is asked for it in
    end: int


def parse_tempo_search(answer: Answer, start: float, end: float) -> list[FoundTrace]:
    """Tempo's SearchResponse (`{"traces": [{"traceID", "startTimeUnixNano", "durationMs"}]}`)
    -> the traces and each one's time range (the search window where it says none)."""
    if not 200 <= answer.status < 300:
        raise LoadError(f"Tempo search answered {error_text(answer)} (GET {answer.url})")
    try:
        found = json.loads(answer.body)
    except ValueError as exc:
        raise LoadError(f"Tempo search answer is not JSON: {exc}") from exc
    if not isinstance(found, dict):
        raise LoadError("Tempo search answer is not a JSON object")
    traces: list[FoundTrace] = []
    for t in found.get("traces") or []:
        if not isinstance(t, dict) or not isinstance(t.get("traceID"), str) or not t["traceID"]:
            continue
        lo, hi = int(start), math.ceil(end) + 1
        try:
            t0 = int(t["startTimeUnixNano"]) / 1e9
            t1 = t0 + float(t.get("durationMs") or 0) / 1e3
            lo, hi = int(t0) - TRACE_MARGIN_S, math.ceil(t1) + TRACE_MARGIN_S
        except (KeyError, TypeError, ValueError):
            pass
        traces.append(FoundTrace(t["traceID"], lo, hi))
    return traces


def tempo_trace_url(base_url: str, trace: FoundTrace) -> str:
    """Trace by id inside its time range: without start/end Tempo searches every block."""
    query = urllib.parse.urlencode({"start": str(trace.start), "end": str(trace.end)})
    return f"{base_url.rstrip('/')}/api/traces/{urllib.parse.quote(trace.trace_id, safe='')}?{query}"


def parse_tempo_trace(answer: Answer) -> list[SpanRecord] | None:
    """One trace-by-id answer: its spans, None when Tempo no longer has it (404, no body)."""
    if answer.status == 404:
        return None
    if not 200 <= answer.status < 300:
        raise LoadError(error_text(answer))
    try:
        doc = json.loads(answer.body)
    except ValueError as exc:
        raise LoadError(f"not JSON: {exc}") from exc
    return records_from_document(doc)


def load_tempo(base_url: str, job: str, start: float, end: float, limit: int = 1000,
               timeout: float = 30.0) -> Pulled:
    """Tempo: TraceQL search for the job's traces, then each trace by id (TEMPO_FETCHES at once).
    A trace Tempo no longer has, or cannot send, is counted and the others are read."""

    async def main(session: aiohttp.ClientSession) -> Pulled:
        search = await _fetch(session, tempo_search_url(base_url, job, start, end, limit))
        traces = parse_tempo_search(search, start, end)
        pulled = Pulled(traces=len(traces))
        if len(traces) >= limit:
            pulled.notes.append(f"Tempo named {len(traces)} traces, the --limit: others may be missing")
        gate = asyncio.Semaphore(TEMPO_FETCHES)

        async def one(trace: FoundTrace) -> None:
            async with gate:
                try:
                    records = parse_tempo_trace(await _fetch(session, tempo_trace_url(base_url, trace)))
                except LoadError as exc:
                    pulled.failed[trace.trace_id] = str(exc)
                    return
            if records is None:
                pulled.missing.append(trace.trace_id)
            else:
                pulled.records.extend(records)

        await asyncio.gather(*(one(t) for t in traces))
        if traces and len(pulled.failed) == len(traces):
            first = next(iter(pulled.failed.values()))
            raise LoadError(f"Tempo sent none of the {len(traces)} traces it found: {first}")
        return pulled

    result: Pulled = _run(main, timeout)
    return result
