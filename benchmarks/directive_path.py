"""What the abort directive path costs the RCA service: N held long-polls, re-polled every `wait` s.

    .venv/bin/python benchmarks/directive_path.py [--pollers 2048] [--waits 30,10] [--rounds 2]

At 16,384 ranks and 8 ranks per host, one elected rank per host polls: 2,048 long-polls of
`GET /api/v1/directives?job=&after=&wait=`. A real `mycroft rca serve` process (bearer tokens
on, as on a shared network; an acting policy that aborts hung jobs) is started; this process
holds the polls with aiohttp. Measured from the service's /proc CPU counters (user + system):
idle (no polls), then for each `wait` over `rounds` x wait seconds with every poller connected
(re-polls per second = pollers / wait), then the abort itself: a made-up hang of the job is
sent over OTLP, the service decides, publishes one directive and every held poll is answered:
how long from the directive's issue to the last poller, and the CPU of that burst.
Prints one line per figure and a JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

from mycroft.faults.made_up_job import StepJob
from mycroft.otlp import request_from_records

TOKEN = "bench-ingest-token"
READER = "bench-read-token"
JOB = "bench-directives"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """user + system CPU of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def start_service(tmp: Path) -> tuple[subprocess.Popen[str], dict[str, int]]:
    (tmp / "auth.yaml").write_text(f"tokens:\n  - {{token: {TOKEN}, role: ingest}}\n"
                                   f"  - {{token: {READER}, role: read}}\n")
    (tmp / "actions.yaml").write_text("mode: act\nrules: [{kinds: [hang], do: [abort_job]}]\n")
    proc = subprocess.Popen([sys.executable, "-m", "mycroft.cli", "rca", "serve", "--otlp-grpc", "",
                             "--otlp-http", "127.0.0.1:0", "--http", "127.0.0.1:0", "--db", str(tmp / "rca.db"),
                             "--auth-config", str(tmp / "auth.yaml"), "--actions", str(tmp / "actions.yaml")],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def metric(api: str, name: str) -> float:
    request = urllib.request.Request(f"{api}/metrics", headers={"Authorization": f"Bearer {READER}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def post(request: urllib.request.Request) -> None:
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


class Pollers:
    """N hosts' relaying ranks, each holding one long-poll and re-polling when it comes back empty."""

    def __init__(self, api: str, n: int, wait: float) -> None:
        self.api, self.n, self.wait = api, n, wait
        self.polls = 0
        self.errors = 0
        self.received: list[tuple[float, dict[str, Any]]] = []
        self.stop = asyncio.Event()

    async def one(self, session: aiohttp.ClientSession, i: int, ramp_s: float) -> None:
        await asyncio.sleep(random.random() * ramp_s)
        url = f"{self.api}/api/v1/directives"
        params = {"job": JOB, "after": "0", "wait": f"{self.wait:g}", "host": f"node{i:05d}"}
        while not self.stop.is_set():
            try:
                async with session.get(url, params=params, timeout=aiohttp.ClientTimeout(total=self.wait + 30)) as r:
                    self.polls += 1
                    if r.status == 200:
                        self.received.append((time.time(), await r.json()))
                        return
                    await r.read()
                    if r.status != 204:
                        self.errors += 1
                        await asyncio.sleep(1.0)
            except (aiohttp.ClientError, TimeoutError):
                self.errors += 1
                await asyncio.sleep(1.0)


async def measure(api: str, pid: int, pollers: int, waits: list[float], rounds: int, otlp: int) -> dict[str, Any]:
    out: dict[str, Any] = {"pollers": pollers, "cpus": os.cpu_count()}
    loop = asyncio.get_running_loop()
    await asyncio.sleep(2.0)
    c0, t0 = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(10.0)
    idle = (cpu_seconds(pid) - c0) / (time.monotonic() - t0)
    out["idle_cpu_share"] = round(idle, 4)
    rss0 = out["idle_rss_mib"] = round(rss_mib(pid), 1)
    print(f"idle service (no polls): {idle:.2%} of a core")
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        for wait in waits:
            group = Pollers(api, pollers, wait)
            ramp = min(wait, 5.0)
            tasks = [loop.create_task(group.one(session, i, ramp)) for i in range(pollers)]
            await asyncio.sleep(ramp + 2.0)
            held = await loop.run_in_executor(None, metric, api, "mycroft_rca_directive_polls_held")
            polls0, c0, t0 = group.polls, cpu_seconds(pid), time.monotonic()
            await asyncio.sleep(rounds * wait)
            took = time.monotonic() - t0
            cpu = (cpu_seconds(pid) - c0) / took
            rate = (group.polls - polls0) / took
            row = {"wait_s": wait, "held": held, "repolls_per_s": round(rate, 1), "cpu_share": round(cpu, 4),
                   "cpu_share_over_idle": round(cpu - idle, 4),
                   "cpu_us_per_repoll": round((cpu - idle) / rate * 1e6, 1) if rate else None,
                   "errors": group.errors, "rss_mib_over_idle": round(rss_mib(pid) - rss0, 1)}
            out.setdefault("held", []).append(row)
            print(f"wait {wait:g}s: {held:.0f} polls held, {rate:.1f} re-polls/s, service CPU {cpu:.2%} of a core "
                  f"({cpu - idle:+.2%} over idle; {row['cpu_us_per_repoll']} us per re-poll), RSS "
                  f"{row['rss_mib_over_idle']:+.1f} MiB over idle, errors {group.errors}")
            if wait != waits[-1]:
                group.stop.set()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                while await loop.run_in_executor(None, metric, api, "mycroft_rca_directive_polls_held") > 0:
                    await asyncio.sleep(1.0)  # the service notices the closed polls (within 10 s)
                continue
            # the abort: a hang of the job, decided, one directive, every held poll answered
            job = StepJob(JOB, 4, t0=time.time() - 5.0)
            body = request_from_records(job.steps(20) + job.heartbeats(time.time(), not_entered=[2]))
            request = urllib.request.Request(f"http://127.0.0.1:{otlp}/v1/traces", body.SerializeToString(),
                                             {"Content-Type": "application/x-protobuf", **headers})
            c0, sent = cpu_seconds(pid), time.time()
            await loop.run_in_executor(None, post, request)
            deadline = time.monotonic() + 30
            while len(group.received) < pollers and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            burst_cpu = cpu_seconds(pid) - c0
            group.stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if not group.received:
                print("abort: no poller received the directive within 30 s")
                out["abort"] = None
                continue
            issued = float(group.received[0][1]["issued_at_unix"])
            lags = sorted(at - issued for at, _ in group.received)
            abort = {"received": len(group.received), "spans_sent_to_issued_s": round(issued - sent, 3),
                     "fanout_p50_s": round(lags[len(lags) // 2], 4),
                     "fanout_p99_s": round(lags[max(0, int(len(lags) * 0.99) - 1)], 4),
                     "fanout_max_s": round(lags[-1], 4), "burst_cpu_s": round(burst_cpu, 3)}
            out["abort"] = abort
            print(f"abort: hang sent -> directive issued {abort['spans_sent_to_issued_s']}s; {len(lags)} of {pollers} "
                  f"pollers answered, issued -> answered p50 {abort['fanout_p50_s'] * 1000:.0f} ms, "
                  f"p99 {abort['fanout_p99_s'] * 1000:.0f} ms, max {abort['fanout_max_s'] * 1000:.0f} ms; "
                  f"service CPU of the whole step {burst_cpu:.2f}s")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pollers", type=int, default=2048, help="held long-polls (one per host: 16,384 ranks / 8)")
    parser.add_argument("--waits", default="30,10", help="the polls' wait values to measure, seconds (comma list)")
    parser.add_argument("--rounds", type=int, default=2, help="measure over rounds x wait seconds")
    args = parser.parse_args()
    waits = [float(w) for w in args.waits.split(",") if w.strip()]
    with tempfile.TemporaryDirectory(prefix="mycroft-directives-") as tmp:
        proc, ports = start_service(Path(tmp))
        try:
            api = f"http://127.0.0.1:{ports['http']}"
            out = asyncio.run(measure(api, proc.pid, args.pollers, waits, args.rounds, ports["otlp_http"]))
        finally:
            proc.terminate()
            proc.wait(15)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
