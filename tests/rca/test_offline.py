"""`mycroft rca analyze`: the same engine on spans from a file, Jaeger, Tempo or Flight Recorder dumps."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from mycroft.rca_service import cli
from mycroft.rca_service.postmortem.flight_recorder import dump_to_records
from mycroft.rca_service.postmortem.loaders import load_jaeger, load_tempo
from mycroft.rca_service.postmortem.offline import replay

from mycroft import schema
from mycroft.faults.made_up_job import StepJob
from mycroft.otlp import SpanRecord, encode_json

REPO = Path(__file__).resolve().parents[2]
JOBS = Path(__file__).parent / "jobs"


def _hung_job(job_id: str = "offline-job") -> tuple[list[SpanRecord], float]:
    """A job whose rank 2 stops entering collectives: 3 s of heartbeats every 0.5 s.
    Returns the records and when the hang began (the last completed step's end)."""
    job = StepJob(job_id, 4, t0=1_700_000_000.0)
    records = job.steps(20)
    start = job.now
    for k in range(1, 7):
        records += job.heartbeats(start + 0.5 * k, not_entered=[2])
    return records, start


def _hung_records() -> list[SpanRecord]:
    return _hung_job()[0]


def _analyze(*argv: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["analyze", "--format", "json", *argv])
    return code, json.loads(out.getvalue()) if out.getvalue() else {}


def test_replay_matches_the_live_verdict_and_timing() -> None:
    records, hang_start = _hung_job()
    tick = 0.25
    result = replay(records, tick_s=tick)
    [incident] = result.incidents
    assert incident.kind == "hang" and incident.root_causes[0]["rank"] == 2
    # the first heartbeat that shows rank 0's all_reduce in flight for the 1 s floor is sent
    # 1.0 s after the hang began; the live service raises it at its next pass, so the replay
    # (a pass every `tick` of span time) at the first tick at or after that heartbeat
    delay = incident.detected_at - hang_start
    assert 1.0 - 1e-6 <= delay <= 1.0 + tick + 1e-6, delay


def test_analyze_otlp_json_file(tmp_path: Path) -> None:
    path = tmp_path / "spans.json"
    path.write_text(json.dumps(encode_json(_hung_records())))
    code, doc = _analyze("--otlp-json", str(path))
    assert code == 2  # a firing incident
    assert doc["jobs"] == ["offline-job"]
    assert doc["incidents"][0]["root_causes"][0]["rank"] == 2


def test_analyze_rejects_garbage_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{nope")
    assert cli.main(["analyze", "--otlp-json", str(path)]) == 1
    assert "not JSON" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------
# Jaeger and Tempo as their servers answer. Each recorded shape below names the source it was
# read from (github.com/jaegertracing/jaeger at v2.13.0 and v2.20.0; github.com/grafana/tempo
# at main of 2026-08-21, ad33aa8, after v3.0.3). A real aiohttp server on a local port serves
# them; the real CLI (cli.main) and loaders read them over HTTP.
# ----------------------------------------------------------------------------------------
Reply = tuple[int, dict[str, str], bytes]


@dataclass
class Backend:
    url: str
    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)  # (path, query) of every GET


@contextlib.contextmanager
def _backend(answer: Callable[[str, dict[str, str]], Reply]) -> Iterator[Backend]:
    """A real HTTP server (aiohttp, on its own loop and thread) answering every GET with answer(path, query)."""
    loop = asyncio.new_event_loop()
    backend = Backend("")

    async def handle(request: web.Request) -> web.Response:
        query = dict(request.query)
        backend.seen.append((request.path, query))
        status, headers, body = answer(request.path, query)
        return web.Response(status=status, body=body, headers=headers)

    async def start() -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/{tail:.*}", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        backend.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        return runner

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield backend
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


JSON = {"Content-Type": "application/json"}
# Go's http.Error: text/plain, nosniff, the message plus a newline (net/http/server.go)
GO_HTTP_ERROR = {"Content-Type": "text/plain; charset=utf-8", "X-Content-Type-Options": "nosniff"}


def _enums_as_ints(node: Any) -> Any:
    """Jaeger's api_v3 marshals OTLP enums as numbers (snapshots/FindTraces.json: "kind": 2, "code": 2)."""
    names = {"SPAN_KIND_UNSPECIFIED": 0, "SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2, "SPAN_KIND_CLIENT": 3,
             "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5, "STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1,
             "STATUS_CODE_ERROR": 2}
    if isinstance(node, dict):
        return {k: names.get(v, v) if k in ("kind", "code") and isinstance(v, str) else _enums_as_ints(v)
                for k, v in node.items()}
    if isinstance(node, list):
        return [_enums_as_ints(x) for x in node]
    return node


def _to_base64_ids(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: base64.b64encode(bytes.fromhex(v)).decode() if k in ("traceId", "spanId") else _to_base64_ids(v)
                for k, v in node.items()}
    if isinstance(node, list):
        return [_to_base64_ids(x) for x in node]
    return node


def jaeger_find_traces_ok(records: list[SpanRecord]) -> Reply:
    """FindTraces with traces. jaeger v2.20.0 cmd/jaeger/internal/extension/jaegerquery/internal/apiv3/
    http_gateway.go returnTraces -> returnTrace: GRPCGatewayWrapper{Result: TracesData} through
    jsonpb, Content-Type application/json; ids hex, enums numbers (snapshots/FindTraces.json)."""
    return 200, JSON, json.dumps({"result": _enums_as_ints(encode_json(records))}).encode()


# jaeger v2.13.0 cmd/query/app/apiv3/http_gateway.go returnTraces (the same in v2.20.0's
# jaegerquery/internal/apiv3/http_gateway.go): no traces -> http.Error(w, GRPCGatewayError JSON, 404)
JAEGER_NO_TRACES: Reply = (404, GO_HTTP_ERROR, b'{"error":{"httpCode":404,"message":"No traces found"}}\n')
# jaeger v2.20.0 apiv3/http_gateway.go tryHandleError(err, 400) for parseFindTracesQuery's error
# (query_parser.go: "malformed parameter %s: %w" with the time.Parse error)
JAEGER_BAD_PARAM: Reply = (400, GO_HTTP_ERROR, b'{"error":{"httpCode":400,"message":"malformed parameter '
                           b'query.start_time_min: parsing time \\"yesterday\\" as '
                           b'\\"2006-01-02T15:04:05.999999999Z07:00\\": cannot parse \\"yesterday\\" as '
                           b'\\"2006\\""}}\n')
# tryHandleError(err, 500) for a storage failure: the same body shape, httpCode 500
JAEGER_STORAGE_DOWN: Reply = (500, GO_HTTP_ERROR, b'{"error":{"httpCode":500,"message":"failed to search traces: '
                              b'elastic: Error 503 (Service Unavailable)"}}\n')


def _jaeger(reply: Callable[[], Reply]) -> Callable[[str, dict[str, str]], Reply]:
    def answer(path: str, query: dict[str, str]) -> Reply:
        if path != "/api/v3/traces":
            return 404, {"Content-Type": "text/plain; charset=utf-8"}, b"404 page not found\n"  # Go's ServeMux
        return reply()
    return answer


def test_analyze_from_jaeger_api_v3() -> None:
    records = _hung_records()
    with _backend(_jaeger(lambda: jaeger_find_traces_ok(records))) as backend:
        code, out = _analyze("--jaeger", backend.url, "--service", "offline-job", "--start", "1699999990",
                             "--end", "1700000100")
    assert code == 2 and out["incidents"][0]["root_causes"][0]["rank"] == 2
    [(path, query)] = backend.seen
    assert path == "/api/v3/traces"
    # the snake_case names v2.13 reads (v2.14+ keep them as aliases, query_parser.go)
    assert query["query.service_name"] == "offline-job"
    assert query["query.start_time_min"] == "2023-11-14T22:13:10.000Z"
    assert query["query.start_time_max"] == "2023-11-14T22:15:00.000Z"
    assert query["query.num_traces"] == "1000"


def test_jaeger_no_traces_is_no_traces_not_a_load_error(capsys: pytest.CaptureFixture[str]) -> None:
    with _backend(_jaeger(lambda: JAEGER_NO_TRACES)) as backend:
        pulled = load_jaeger(backend.url, "offline-job", 1_699_999_990, 1_700_000_100)
        assert pulled.records == [] and pulled.traces == 0 and not pulled.failed
        code = cli.main(["analyze", "--jaeger", backend.url, "--service", "offline-job", "--lookback", "60"])
    err = capsys.readouterr().err
    assert code == 1
    assert "no traces of that service in the window" in err and "no spans found" in err
    assert "HTTP 404" not in err and "failed" not in err


@pytest.mark.parametrize("reply, says", [
    (JAEGER_BAD_PARAM, 'HTTP 400: malformed parameter query.start_time_min: parsing time "yesterday"'),
    (JAEGER_STORAGE_DOWN, "HTTP 500: failed to search traces: elastic: Error 503 (Service Unavailable)"),
])
def test_jaeger_errors_are_read_from_their_body(reply: Reply, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with _backend(_jaeger(lambda: reply)) as backend:
        code = cli.main(["analyze", "--jaeger", backend.url, "--service", "offline-job", "--lookback", "60"])
    err = capsys.readouterr().err
    assert code == 1 and f"Jaeger answered {says}" in err, err


def test_jaeger_wrong_url_and_bad_json_are_clean_errors(capsys: pytest.CaptureFixture[str]) -> None:
    # a 404 that is not Jaeger's "no traces" (Go's ServeMux: no api_v3 under this base path) stays an error
    with _backend(_jaeger(lambda: JAEGER_NO_TRACES)) as backend:
        code = cli.main(["analyze", "--jaeger", backend.url + "/jaeger", "--service", "offline-job"])
    err = capsys.readouterr().err
    assert code == 1 and "Jaeger answered HTTP 404: 404 page not found" in err, err
    # a 200 that is not JSON (a proxy's login page): said, no traceback
    with _backend(_jaeger(lambda: (200, {"Content-Type": "text/html"}, b"<html>sign in</html>"))) as backend:
        code = cli.main(["analyze", "--jaeger", backend.url, "--service", "offline-job"])
    err = capsys.readouterr().err
    assert code == 1 and "Jaeger's answer is not JSON" in err and "Traceback" not in err, err


def _tempo_trace_id(trace_id: int) -> str:
    """tempo pkg/util/traceid.go TraceIDToHexString: hex with the leading zeros trimmed (search answers)."""
    return schema.trace_id_hex(trace_id).lstrip("0") or "0"


def tempo_search_ok(by_trace: dict[str, list[SpanRecord]], job: str) -> Reply:
    """tempo pkg/traceql/engine.go asTraceSearchMetadata -> tempopb.SearchResponse through jsonpb:
    traceID (trimmed hex), rootServiceName, startTimeUnixNano (a uint64, so a string), durationMs."""
    traces = []
    for trace_id, spans in by_trace.items():
        t0 = min(s.start_ns for s in spans)
        traces.append({"traceID": trace_id, "rootServiceName": job, "rootTraceName": spans[0].name,
                       "startTimeUnixNano": str(t0), "durationMs": (max(s.end_ns for s in spans) - t0) // 1_000_000,
                       "spanSets": [{"spans": [], "matched": len(spans)}]})
    metrics = {"inspectedBytes": "123456", "totalBlocks": 1, "completedJobs": 1, "totalJobs": 1}
    return 200, JSON, json.dumps({"traces": traces, "metrics": metrics}).encode()


def tempo_trace_ok(spans: list[SpanRecord]) -> Reply:
    """tempo modules/frontend/combiner/trace_by_id.go HTTPFinal -> tempopb.MarshalToJSONV1: jsonpb
    (ids base64, enums by name, 64-bit ints as strings) with "resourceSpans" renamed "batches"."""
    doc = _to_base64_ids(encode_json(spans))
    return 200, JSON, json.dumps({"batches": doc["resourceSpans"]}).encode()


# trace_by_id.go: "if all downstream jobs return 404 then it will return 404 with no body"
TEMPO_TRACE_GONE: Reply = (404, {}, b"")
# modules/frontend/search_handlers.go: a request ParseSearchRequest refuses -> httpInvalidRequest(err):
# 400, the error's text as a plain body (pkg/api/http.go "invalid start: ...")
TEMPO_BAD_SEARCH: Reply = (400, {}, b'invalid start: strconv.ParseUint: parsing "-5": invalid syntax')


class Tempo:
    """Tempo's frontend for one recorded job: search, trace by id; `trace_reply` overrides some traces."""

    def __init__(self, records: list[SpanRecord], job: str) -> None:
        self.job = job
        self.by_trace: dict[str, list[SpanRecord]] = {}
        for r in records:
            self.by_trace.setdefault(_tempo_trace_id(r.trace_id), []).append(r)
        self.trace_reply: dict[str, Reply] = {}
        self.search_reply: Reply | None = None

    def __call__(self, path: str, query: dict[str, str]) -> Reply:
        if path == "/api/search":
            return self.search_reply or tempo_search_ok(self.by_trace, self.job)
        if path.startswith("/api/traces/"):
            trace_id = path.rsplit("/", 1)[1]
            # pkg/api/http.go ParseTraceByIDRequest: start/end are unix seconds, end after start
            if "start" in query and "end" in query and int(query["end"]) <= int(query["start"]):
                return 400, {}, b"http parameter start must be before end"
            if trace_id in self.trace_reply:
                return self.trace_reply[trace_id]
            spans = self.by_trace.get(trace_id.lstrip("0") or "0")
            return tempo_trace_ok(spans) if spans else TEMPO_TRACE_GONE
        return 404, {}, b"404 page not found\n"


def test_analyze_from_tempo() -> None:
    records = _hung_records()
    tempo = Tempo(records, "offline-job")
    with _backend(tempo) as backend:
        code, out = _analyze("--tempo", backend.url, "--job", "offline-job", "--start", "1699999990",
                             "--end", "1700000100")
    assert code == 2 and out["incidents"][0]["root_causes"][0]["rank"] == 2
    assert out["spans"] == len(records)
    searches = [q for p, q in backend.seen if p == "/api/search"]
    assert searches == [{"q": '{ resource.mycroft.job.id = "offline-job" }', "start": "1699999990",
                         "end": "1700000101", "limit": "1000", "spss": "1000"}]
    fetched = {p.rsplit("/", 1)[1]: q for p, q in backend.seen if p.startswith("/api/traces/")}
    assert set(fetched) == set(tempo.by_trace)
    for trace_id, query in fetched.items():
        # asked inside the trace's own time range (not every block Tempo holds)
        spans = tempo.by_trace[trace_id]
        assert int(query["start"]) <= min(s.start_ns for s in spans) / 1e9
        assert int(query["end"]) >= max(s.end_ns for s in spans) / 1e9
        assert int(query["end"]) - int(query["start"]) <= 10


def test_tempo_query_escapes_the_job_id() -> None:
    """TraceQL strings are Go string literals (pkg/traceql/lexer.go: strconv.Unquote): a job id with
    quotes, a backslash or braces must arrive as itself, not end the string or the query early."""
    job = 'team "a" \\ run} || { true'
    records, _ = _hung_job(job)
    with _backend(Tempo(records, job)) as backend:
        code, out = _analyze("--tempo", backend.url, "--job", job, "--start", "1699999990", "--end", "1700000100")
    assert code == 2 and out["jobs"] == [job]
    q = next(q["q"] for p, q in backend.seen if p == "/api/search")
    prefix, suffix = "{ resource.mycroft.job.id = ", " }"
    assert q.startswith(prefix) and q.endswith(suffix), q
    literal = q[len(prefix):-len(suffix)]
    assert json.loads(literal) == job  # JSON's escapes are a subset of Go's: Unquote reads the same string
    assert literal.count('"') - literal.count('\\"') == 2  # one string literal, nothing outside it


def test_tempo_missing_and_broken_traces_do_not_abort_the_load(capsys: pytest.CaptureFixture[str]) -> None:
    records = _hung_records()
    tempo = Tempo(records, "offline-job")
    # the step traces: one Tempo no longer has, one it fails on, one whose body is cut short
    steps = [t for t, spans in tempo.by_trace.items() if spans[0].attributes.get(schema.ATTR_SPAN_KIND) ==
             schema.KIND_COLLECTIVE]
    gone, broken, cut = steps[:3]
    tempo.trace_reply[gone] = TEMPO_TRACE_GONE
    tempo.trace_reply[broken] = (500, {}, b"internal error")  # trace_by_id.go internalErrorMsg
    tempo.trace_reply[cut] = (200, JSON, tempo_trace_ok(tempo.by_trace[cut])[2][:100])
    with _backend(tempo) as backend:
        pulled = load_tempo(backend.url, "offline-job", 1_699_999_990, 1_700_000_100)
        assert pulled.traces == len(tempo.by_trace)
        assert pulled.missing == [gone] and set(pulled.failed) == {broken, cut}
        assert "HTTP 500: internal error" in pulled.failed[broken] and "not JSON" in pulled.failed[cut]
        kept = sum(len(s) for t, s in tempo.by_trace.items() if t not in (gone, broken, cut))
        assert len(pulled.records) == kept
        code, out = _analyze("--tempo", backend.url, "--job", "offline-job", "--start", "1699999990",
                             "--end", "1700000100")
    err = capsys.readouterr().err
    assert code == 2 and out["incidents"][0]["root_causes"][0]["rank"] == 2
    assert f"Tempo no longer has 1 of the {len(tempo.by_trace)} traces" in err
    assert f"Tempo could not send 2 of the {len(tempo.by_trace)} traces" in err


def test_tempo_errors_are_clean(capsys: pytest.CaptureFixture[str]) -> None:
    tempo = Tempo(_hung_records(), "offline-job")
    tempo.search_reply = TEMPO_BAD_SEARCH
    with _backend(tempo) as backend:
        code = cli.main(["analyze", "--tempo", backend.url, "--job", "offline-job"])
        assert code == 1
        assert ('Tempo search answered HTTP 400: invalid start: strconv.ParseUint: parsing "-5": invalid syntax'
                in capsys.readouterr().err)
        tempo.search_reply = (200, JSON, b'{"traces": [')
        code = cli.main(["analyze", "--tempo", backend.url, "--job", "offline-job"])
        err = capsys.readouterr().err
        assert code == 1 and "Tempo search answer is not JSON" in err and "Traceback" not in err
        # every trace failing is a load error (nothing to analyse), said with the first reason
        tempo.search_reply = None
        tempo.trace_reply = {t: (503, {}, b"too many requests in flight") for t in tempo.by_trace}
        code = cli.main(["analyze", "--tempo", backend.url, "--job", "offline-job", "--start", "1699999990",
                         "--end", "1700000100"])
        err = capsys.readouterr().err
        assert code == 1 and "Tempo sent none of the" in err and "HTTP 503: too many requests in flight" in err


def test_tempo_no_traces(capsys: pytest.CaptureFixture[str]) -> None:
    tempo = Tempo([], "offline-job")
    with _backend(tempo) as backend:
        code = cli.main(["analyze", "--tempo", backend.url, "--job", "offline-job"])
    assert code == 1 and "no spans found" in capsys.readouterr().err


def _fr_dump(rank: int, completed: int, inflight_op: str | None, t0: int) -> dict[str, Any]:
    entries = [{"collective_seq_id": s, "p2p_seq_id": 0, "is_p2p": False, "pg_id": 0,
                "process_group": ["0", "default_pg"], "profiling_name": "gloo:all_reduce",
                "input_sizes": [[1024]], "input_dtypes": ["Float"], "state": "scheduled",
                "time_created_ns": t0 + s * 10_000_000, "time_discovered_completed_ns": 0}
               for s in range(1, completed + 1)]
    if inflight_op:
        entries.append({**entries[-1], "collective_seq_id": completed + 1, "profiling_name": f"gloo:{inflight_op}",
                        "time_created_ns": t0 + (completed + 1) * 10_000_000})
    issued = completed + (1 if inflight_op else 0)
    return {"version": "2.10", "entries": entries, "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1, 2]"}},
            "pg_status": {"0": {"last_enqueued_collective": str(issued),
                                "last_completed_collective": str(completed)}}}


def test_flight_recorder_dumps_hang_and_mismatch(tmp_path: Path) -> None:
    t0 = 1_700_000_000_000_000_000
    at = t0 + 60 * 10**9
    # rank 1 never issued seq 6 (not entered); 0 and 2 wait in it
    recs = []
    for rank, inflight in ((0, "all_reduce"), (1, None), (2, "all_reduce")):
        recs += dump_to_records(_fr_dump(rank, 5, inflight, t0), rank, "fr", at)
    [incident] = replay(recs).incidents
    assert incident.kind == "hang" and incident.root_causes[0]["rank"] == 1
    # rank 2 issued a broadcast where the others all-reduce
    paths = []
    for rank, op in ((0, "all_reduce"), (1, "all_reduce"), (2, "broadcast")):
        path = tmp_path / f"fr_trace_rank_{rank}.json"
        path.write_text(json.dumps(_fr_dump(rank, 5, op, t0)))
        paths.append(str(path))
    code, out = _analyze("--flight-recorder", *paths, "--at", str(at / 1e9))
    assert code == 2
    assert out["incidents"][0]["kind"] == "mismatch" and out["incidents"][0]["root_causes"][0]["rank"] == 2


@pytest.mark.slow
def test_real_flight_recorder_dumps_of_a_hung_gloo_job(tmp_path: Path) -> None:
    """Rank 1 sleeps before an all_reduce; every rank dumps its Flight Recorder; analyze names rank 1."""
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE="2000", FR_OUT=str(tmp_path), OMP_NUM_THREADS="1")
    bin_dir = Path(sys.executable).parent
    from mycroft.faults.inject import free_port

    proc = subprocess.run([str(bin_dir / "torchrun"), "--nproc-per-node", "3", "--master-port", str(free_port()),
                           str(JOBS / "fr_hang.py")], env=env, capture_output=True, text=True, timeout=120)
    dumps = sorted(str(p) for p in tmp_path.glob("fr_rank_*.json"))
    assert len(dumps) == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    code, out = _analyze("--flight-recorder", *dumps, "--job", "fr-real")
    assert code == 2
    incident = out["incidents"][0]
    assert incident["kind"] == "hang"
    assert incident["root_causes"][0]["rank"] == 1 and incident["root_causes"][0]["kind"] == "not_entered"
    time.sleep(0)
