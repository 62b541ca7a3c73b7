"""`mycroft rca analyze`: the same engine on spans from a file, Jaeger, Tempo or Flight Recorder dumps."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from mycroft.rca_service import cli
from mycroft.rca_service.flight_recorder import dump_to_records
from mycroft.rca_service.offline import replay

from mycroft import schema
from mycroft.faults.made_up_job import StepJob
from mycroft.otlp import SpanRecord, encode_json

REPO = Path(__file__).resolve().parents[2]
JOBS = Path(__file__).parent / "jobs"


def _hung_records() -> list[SpanRecord]:
    """A job whose rank 2 stops entering collectives: 3 s of heartbeats every 0.5 s."""
    job = StepJob("offline-job", 4, t0=1_700_000_000.0)
    records = job.steps(20)
    start = job.now
    for k in range(1, 7):
        records += job.heartbeats(start + 0.5 * k, not_entered=[2])
    return records


def _analyze(*argv: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["analyze", "--format", "json", *argv])
    return code, json.loads(out.getvalue())


def test_replay_matches_the_live_verdict_and_timing() -> None:
    result = replay(_hung_records())
    [incident] = result.incidents
    assert incident.kind == "hang" and incident.root_causes[0]["rank"] == 2
    # the in-flight age crossed the 1 s floor 1 s after the step started; replay ticks every 0.25 s
    assert 1.0 <= incident.detected_at - (result.start + 2.0) <= 1.5 or incident.detected_at > result.start


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


def _to_base64_ids(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: base64.b64encode(bytes.fromhex(v)).decode() if k in ("traceId", "spanId") else _to_base64_ids(v)
                for k, v in node.items()}
    if isinstance(node, list):
        return [_to_base64_ids(x) for x in node]
    return node


@contextlib.contextmanager
def _fake_backend(routes: dict[str, Any]) -> Iterator[str]:
    """Serves JSON by path prefix; records the queries it got."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            seen.append(self.path)
            for prefix, body in routes.items():
                if self.path.startswith(prefix):
                    data = json.dumps(body(self.path) if callable(body) else body).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        routes["_seen"] = seen


def test_analyze_from_jaeger_api_v3() -> None:
    doc = _to_base64_ids(encode_json(_hung_records()))  # grpc-gateway style ids
    routes: dict[str, Any] = {"/api/v3/traces": {"result": doc}}
    with _fake_backend(routes) as url:
        code, out = _analyze("--jaeger", url, "--service", "offline-job", "--start", "1699999990",
                             "--end", "1700000100")
    assert code == 2 and out["incidents"][0]["root_causes"][0]["rank"] == 2
    assert "query.service_name=offline-job" in routes["_seen"][0]


def test_analyze_from_tempo() -> None:
    records = _hung_records()
    by_trace: dict[str, list[SpanRecord]] = {}
    for r in records:
        by_trace.setdefault(schema.trace_id_hex(r.trace_id), []).append(r)

    def trace(path: str) -> dict[str, Any]:
        doc = encode_json(by_trace[path.rsplit("/", 1)[1]])
        return {"batches": _to_base64_ids(doc)["resourceSpans"]}

    routes: dict[str, Any] = {"/api/search": {"traces": [{"traceID": t} for t in by_trace]},
                              "/api/traces/": trace}
    with _fake_backend(routes) as url:
        code, out = _analyze("--tempo", url, "--job", "offline-job", "--start", "1699999990", "--end", "1700000100")
    assert code == 2 and out["incidents"][0]["root_causes"][0]["rank"] == 2
    assert "mycroft.job.id" in routes["_seen"][0].replace("%2E", ".").replace("%22", '"') or "q=" in routes["_seen"][0]


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
