"""Seeded random probing of the services' network edges, as an attacker and a buggy client would.

    .venv/bin/python benchmarks/edge_fuzz.py [--http 1500] [--grpc 750] [--seed 10]

Starts `mycroft rca serve` and `mycroft processor serve` as real processes, sends each
`--http` OTLP/HTTP cases (valid, mutated protobuf and JSON, gzip, bad Content-Length,
short bodies, other content types, deep JSON, wrong paths and methods, huge declared
sizes, garbage request lines) and `--grpc` gRPC cases (valid and mutated), then the
targeted probes of issue 10 (gzip bomb, rank-range bombs, 1,000 idle connections), and
prints the status counts, RSS and thread counts. Exits non-zero if a service died or
answered outside the documented set. tests/test_otlp_fuzz.py runs the same generators
briefly in CI.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import grpc

from mycroft import schema
from mycroft.otlp import SpanRecord, encode_json, request_from_records

# what an OTLP/HTTP receiver may answer (429: back-pressure; 503: over the connection cap)
RCA_HTTP_CODES = {200, 400, 403, 404, 405, 408, 413, 415, 429, 503}
TRACE_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def seed_records(job: str = "fuzz", world: int = 4) -> list[SpanRecord]:
    """A heartbeat and a collective span per rank: the shapes the services parse deepest."""
    group = schema.encode_ranks(range(world))
    gid = schema.group_id("0", range(world))
    out = []
    for rank in range(world):
        resource = {schema.RES_JOB_ID: job, schema.RES_RANK: rank, schema.RES_WORLD_SIZE: world,
                    schema.RES_PROCESS_PID: 100 + rank, schema.RES_RUN_ID: "fuzzrun.0"}
        out.append(SpanRecord(trace_id=rank + 1, span_id=rank + 1, name=schema.SPAN_HEARTBEAT, start_ns=1, end_ns=2,
                              attributes={schema.ATTR_SPAN_KIND: schema.KIND_HEARTBEAT, schema.ATTR_HB_COUNTER: 1,
                                          schema.ATTR_HB_GROUP_IDS: [gid], schema.ATTR_HB_GROUP_RANKS: [group],
                                          schema.ATTR_HB_GROUP_ISSUED: [3], schema.ATTR_HB_GROUP_COMPLETED: [2],
                                          schema.ATTR_HB_INFLIGHT_GROUP_IDS: [gid], schema.ATTR_HB_INFLIGHT_SEQS: [3],
                                          schema.ATTR_HB_INFLIGHT_PEERS: [-1]},
                              resource=resource))
        trace = schema.collective_trace_id(job, gid, 2)
        out.append(SpanRecord(trace_id=trace, span_id=schema.rank_span_id(trace, rank), name="all_reduce",
                              start_ns=10, end_ns=20,
                              attributes={schema.ATTR_SPAN_KIND: schema.KIND_COLLECTIVE, schema.ATTR_GROUP_ID: gid,
                                          schema.ATTR_GROUP_RANKS: group, schema.ATTR_SEQ: 2,
                                          schema.ATTR_OP: "all_reduce", schema.ATTR_BYTES: 4096},
                              resource=resource))
    return out


def mutate(data: bytes, rng: random.Random) -> bytes:
    """Flip, insert, delete, duplicate or truncate a few bytes."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        if not buf:
            buf += bytes([rng.randrange(256)])
        op = rng.randrange(5)
        i = rng.randrange(len(buf))
        if op == 0:
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 2:
            del buf[i:i + rng.randint(1, 8)]
        elif op == 3:
            j = rng.randrange(len(buf))
            buf[i:i] = buf[j:j + rng.randint(1, 32)]
        else:
            del buf[i:]
    return bytes(buf)


def _raw(port: int, data: bytes, timeout: float = 20.0) -> int | None:  # > the 15 s body timeout
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    out = b""
    try:
        sock.sendall(data)
        while b"\r\n" not in out:
            chunk = sock.recv(4096)
            if not chunk:
                break
            out += chunk
    except OSError:
        pass
    finally:
        sock.close()
    if out.startswith(b"HTTP/"):
        return int(out.split(b" ", 2)[1])
    return None


def _post(body: bytes, content_type: str = "application/x-protobuf", extra: str = "", path: str = "/v1/traces",
          length: str | None = None, method: str = "POST") -> bytes:
    size = str(len(body)) if length is None else length
    return (f"{method} {path} HTTP/1.1\r\nHost: fuzz\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {size}\r\n{extra}\r\n").encode() + body


def http_case(rng: random.Random, valid: bytes, valid_json: bytes) -> bytes:
    kind = rng.randrange(14)
    if kind == 0:
        return _post(valid)
    if kind in (1, 2, 3):
        return _post(mutate(valid, rng))
    if kind == 4:
        return _post(valid_json, "application/json")
    if kind in (5, 6):
        return _post(mutate(valid_json, rng), "application/json")
    if kind == 7:
        packed = gzip.compress(valid if rng.random() < 0.5 else mutate(valid, rng))
        if rng.random() < 0.3:
            packed = mutate(packed, rng)
        return _post(packed, extra="Content-Encoding: gzip\r\n")
    if kind == 8:
        return _post(valid, rng.choice(["text/plain", "", "application/xml", "multipart/form-data", "x" * 300]))
    if kind == 9:
        return _post(b"abc", length=rng.choice(["abc", "-5", "1e3", " ", "99999999999999999999", "0x10"]))
    if kind == 10:
        depth = rng.choice([100, 5000, 200_000])
        return _post(b"[" * depth + b"]" * depth, "application/json")
    if kind == 11:
        return _post(valid, path=rng.choice(["/", "/v1/metrics", "/v1/traces/../x", "/%00", "/" + "a" * 5000]),
                     method=rng.choice(["POST", "GET", "PUT", "DELETE"]))
    if kind == 12:
        return _post(b"abc", length=str(rng.choice([10**12, 2**63, 64 << 20])))
    if rng.random() < 0.05:  # a body that never arrives: costs the body timeout, so rare
        return _post(b"abc", length="1048576")
    return rng.choice([b"\x16\x03\x01\x02\x00garbage", b"GET\r\n\r\n", b"POST /v1/traces HTTP/9.9\r\n\r\n",
                       b"POST /v1/traces HTTP/1.1\r\n" + b"X: " + b"y" * 20000 + b"\r\n\r\n",
                       bytes(rng.randrange(256) for _ in range(rng.randint(1, 200))) + b"\r\n\r\n"])


def fuzz_http(port: int, n: int, rng: random.Random) -> list[int | None]:
    valid = request_from_records(seed_records()).SerializeToString()
    valid_json = json.dumps(encode_json(seed_records())).encode()
    return [_raw(port, http_case(rng, valid, valid_json)) for _ in range(n)]


def fuzz_grpc(port: int, n: int, rng: random.Random) -> list[str]:
    valid = request_from_records(seed_records()).SerializeToString()
    codes = []
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        export = channel.unary_unary(TRACE_EXPORT, request_serializer=None, response_deserializer=None)
        for _ in range(n):
            roll = rng.random()
            payload = valid if roll < 0.2 else mutate(valid, rng) if roll < 0.9 else \
                bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))
            try:
                export(payload, timeout=10)
                codes.append("OK")
            except grpc.RpcError as exc:
                codes.append(exc.code().name)
    return codes


# ------------------------------------------------------------------------------------
# the long run against real service processes
# ------------------------------------------------------------------------------------
def _proc_status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def _start(cmd: list[str]) -> tuple[subprocess.Popen[str], dict[str, int]]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("{"):
            return proc, json.loads(line)
    raise RuntimeError(f"{cmd[:4]} did not start")


def _idle_probe(port: int, pid: int, n: int = 1000) -> dict[str, float]:
    before = _proc_status(pid, "Threads")
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    time.sleep(1.0)
    during = _proc_status(pid, "Threads")
    started = time.monotonic()
    open_socks = list(socks)
    while open_socks and time.monotonic() - started < 30:
        still = []
        for sock in open_socks:
            sock.setblocking(False)
            try:
                if sock.recv(1):
                    still.append(sock)
            except BlockingIOError:
                still.append(sock)
            except OSError:
                pass
        open_socks = still
        time.sleep(0.5)
    for sock in socks:
        sock.close()
    closed_after = round(time.monotonic() - started + 1.0, 1)
    return {"threads_before": before, "threads_with_idle": during, "closed_after_s": closed_after,
            "left_open": len(open_socks)}


def _bombs(http_port: int, pid: int) -> dict[str, float]:
    time.sleep(0.5)
    base = _proc_status(pid, "VmRSS") / 1024
    bomb = gzip.compress(b"\0" * (512 << 20), 9)
    code = _raw(http_port, _post(bomb, extra="Content-Encoding: gzip\r\n"), timeout=60)
    time.sleep(0.5)
    after_gzip = _proc_status(pid, "VmRSS") / 1024
    records = seed_records("bombed")
    for record in records:
        key = schema.ATTR_HB_GROUP_RANKS if record.kind == schema.KIND_HEARTBEAT else schema.ATTR_GROUP_RANKS
        record.attributes[key] = ["0-999999999"] if record.kind == schema.KIND_HEARTBEAT else "0-4999999"
    ranks_code = _raw(http_port, _post(request_from_records(records).SerializeToString()))
    time.sleep(0.5)
    after_ranks = _proc_status(pid, "VmRSS") / 1024
    return {"gzip_bomb_bytes": len(bomb), "gzip_bomb_status": code or 0, "rss_base_mb": round(base),
            "rss_after_gzip_mb": round(after_gzip), "rank_bomb_status": ranks_code or 0,
            "rss_after_rank_bomb_mb": round(after_ranks)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--http", type=int, default=1500)
    parser.add_argument("--grpc", type=int, default=750)
    parser.add_argument("--seed", type=int, default=10)
    args = parser.parse_args()
    exe = [sys.executable, "-m", "mycroft.cli"]
    tmp = Path(tempfile.mkdtemp(prefix="mycroft-fuzz-"))
    rca, rca_ports = _start([*exe, "rca", "serve", "--otlp-grpc", "127.0.0.1:0", "--otlp-http", "127.0.0.1:0",
                             "--http", "127.0.0.1:0", "--db", str(tmp / "rca.db")])
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))  # the processor's export target: nothing answers, exports are dropped and counted
    proc, proc_ports = _start([*exe, "processor", "serve", "--otlp-grpc", "127.0.0.1:0", "--otlp-http",
                               "127.0.0.1:0", "--export", f"127.0.0.1:{sink.getsockname()[1]}"])
    failed = False
    report: dict[str, object] = {}
    try:
        for name, service, ports in (("rca", rca, rca_ports), ("processor", proc, proc_ports)):
            rng = random.Random(args.seed)
            started = time.monotonic()
            http_codes = Counter(fuzz_http(ports["otlp_http"], args.http, rng))
            grpc_codes = Counter(fuzz_grpc(ports["otlp_grpc"], args.grpc, rng))
            seconds = time.monotonic() - started
            alive = service.poll() is None
            outside = {c: n for c, n in http_codes.items() if c not in RCA_HTTP_CODES}
            bad_grpc = {c: n for c, n in grpc_codes.items() if c not in ("OK", "INVALID_ARGUMENT")}
            failed |= not alive or bool(outside) or bool(bad_grpc)
            report[name] = {"http": dict(sorted(http_codes.items(), key=str)), "grpc": dict(grpc_codes),
                            "seconds": round(seconds, 1), "alive": alive, "outside_documented": outside or None,
                            "grpc_unexpected": bad_grpc or None,
                            "idle_connections": _idle_probe(ports["otlp_http"], service.pid),
                            "bombs": _bombs(ports["otlp_http"], service.pid)}
            failed |= service.poll() is not None
        print(json.dumps(report, indent=2, default=str))
    finally:
        for service in (rca, proc):
            started = time.monotonic()
            service.terminate()
            service.wait(timeout=30)
            print(f"{service.args[3]}: SIGTERM -> exit {service.returncode} in {time.monotonic() - started:.2f} s")
        sink.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
