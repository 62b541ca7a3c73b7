"""The offline loaders' pure edges (rca_service/postmortem/loaders.py): what a file, Jaeger or Tempo can hand
back besides a clean OTLP document -- base64 ids, old field names, streams of documents, error
bodies, garbage -- read or refused with a message, never a traceback. The real backends'
round trips are in test_offline.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from mycroft.rca_service.postmortem import loaders
from mycroft.rca_service.postmortem.loaders import (
    Answer,
    LoadError,
    error_text,
    load_otlp_file,
    normalize_otlp_json,
    parse_jaeger_answer,
    parse_tempo_search,
    parse_tempo_trace,
    records_from_document,
)

from mycroft.faults.made_up_job import StepJob
from mycroft.otlp import encode_json


def _document() -> tuple[dict, list]:
    job = StepJob("load", 2)
    records = job.steps(2)
    return encode_json(records), records


def _keys(records: list) -> set[tuple[int, int]]:
    return {(r.trace_id, r.span_id) for r in records}


def test_a_file_that_is_missing_or_not_otlp_is_a_load_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match=r"cannot read .*nowhere\.json"):
        load_otlp_file(tmp_path / "nowhere.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": 5}]}]}]}')
    with pytest.raises(LoadError, match=r"bad\.json"):
        load_otlp_file(bad)
    good = tmp_path / "good.json"
    doc, records = _document()
    good.write_text(json.dumps(doc))
    assert _keys(load_otlp_file(good)) == _keys(records)


def test_base64_ids_and_old_field_names_read_as_otlp() -> None:
    """Tempo and grpc-gateway send ids in base64; old exporters say batches / instrumentationLibrarySpans."""
    doc, records = _document()
    old = json.loads(json.dumps(doc))
    for resource_spans in old["resourceSpans"]:
        resource_spans["instrumentationLibrarySpans"] = resource_spans.pop("scopeSpans")
        for scope in resource_spans["instrumentationLibrarySpans"]:
            scope["instrumentationLibrary"] = scope.pop("scope", {})
            for span in scope["spans"]:
                span["traceID"] = base64.b64encode(bytes.fromhex(span.pop("traceId"))).decode()
                span["spanID"] = base64.b64encode(bytes.fromhex(span.pop("spanId"))).decode()
    old = {"batches": old.pop("resourceSpans")}
    assert _keys(records_from_document({"wrapped": [old]})) == _keys(records)
    # an id that is neither hex of its length nor base64 stays as it is (the decoder then refuses it)
    assert normalize_otlp_json({"spanId": "not base64!"}) == {"spanId": "not base64!"}
    assert normalize_otlp_json({"traceId": ""}) == {"traceId": ""}
    assert normalize_otlp_json({"traceId": "AB" * 16}) == {"traceId": "ab" * 16}


def test_a_broken_payload_inside_a_document_is_a_load_error() -> None:
    with pytest.raises(LoadError):
        records_from_document({"result": {"resourceSpans": [{"scopeSpans": [{"spans": [{"spanId": []}]}]}]}})
    assert records_from_document({"nothing": "here"}) == []


def test_jaeger_streams_documents_and_says_no_traces_found() -> None:
    doc, records = _document()
    stream = (json.dumps({"result": doc}) + "\n" + json.dumps({"result": doc}) + "\n").encode()
    pulled = parse_jaeger_answer(Answer(200, stream, "http://j/api/v3/traces"))
    assert len(pulled.records) == 2 * len(records)
    assert pulled.traces == 2 * len({r.trace_id for r in records})  # counted per document sent
    none = Answer(404, b'{"error": {"httpCode": 404, "message": "No traces found"}}', "u")
    assert parse_jaeger_answer(none).records == [] and parse_jaeger_answer(none).notes
    with pytest.raises(LoadError, match="HTTP 404: nope"):  # a 404 of another server stays an error
        parse_jaeger_answer(Answer(404, b"nope", "u"))
    with pytest.raises(LoadError, match="an error"):  # an error in the stream
        parse_jaeger_answer(Answer(200, b'{"error": {"message": "storage down"}}', "u"))
    with pytest.raises(LoadError, match="not JSON"):
        parse_jaeger_answer(Answer(200, b'{"result": {}} garbage', "u"))
    assert parse_jaeger_answer(Answer(200, b"  ", "u")).records == []


def test_error_bodies_are_one_line() -> None:
    assert error_text(Answer(500, b'{"error": {"httpCode": 500, "message": "boom"}}', "u")) == "HTTP 500: boom"
    assert error_text(Answer(503, b"upstream\n  connect error", "u")) == "HTTP 503: upstream connect error"
    assert error_text(Answer(502, b"", "u")) == "HTTP 502: no body"
    assert error_text(Answer(400, b'{"error": {"code": 3}}', "u")) == 'HTTP 400: {"code": 3}'
    assert len(error_text(Answer(500, b"x" * 1000, "u"))) < 320


def test_tempo_search_answers_good_odd_and_bad() -> None:
    body = {"traces": [
        {"traceID": "ab" * 16, "startTimeUnixNano": str(int(100.5e9)), "durationMs": 1500},
        {"traceID": "cd" * 16},  # no time: the search window
        {"traceID": ""}, "junk", {"traceID": 7},
    ]}
    found = parse_tempo_search(Answer(200, json.dumps(body).encode(), "u"), 90.0, 120.2)
    margin = loaders.TRACE_MARGIN_S
    assert [(t.trace_id, t.start, t.end) for t in found] == [("ab" * 16, 100 - margin, 102 + margin),
                                                            ("cd" * 16, 90, 122)]
    assert parse_tempo_search(Answer(200, b"{}", "u"), 0, 1) == []
    for answer, why in ((Answer(500, b"down", "u"), "HTTP 500: down"), (Answer(200, b"[1]", "u"), "not a JSON object"),
                        (Answer(200, b"<html>", "u"), "not JSON")):
        with pytest.raises(LoadError, match=why):
            parse_tempo_search(answer, 0, 1)


def test_tempo_trace_by_id_gone_broken_or_read() -> None:
    doc, records = _document()
    assert parse_tempo_trace(Answer(404, b"", "u")) is None
    assert _keys(parse_tempo_trace(Answer(200, json.dumps({"batches": doc["resourceSpans"]}).encode(), "u"))
                 or []) == _keys(records)
    with pytest.raises(LoadError, match="HTTP 500"):
        parse_tempo_trace(Answer(500, b"compactor", "u"))
    with pytest.raises(LoadError, match="not JSON"):
        parse_tempo_trace(Answer(200, b"{", "u"))


def test_a_backend_that_is_not_there_is_a_load_error() -> None:
    from tests.conftest import free_port

    port = free_port()  # nothing listens
    with pytest.raises(LoadError, match="failed"):
        loaders.load_jaeger(f"http://127.0.0.1:{port}", "svc", 0.0, 1.0, timeout=5.0)
