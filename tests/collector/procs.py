"""Start / stop the processor's two deployments as real processes, for the end-to-end tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.conftest import BIN, REPO, free_port


def _read_ready(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("event") == "ready":
                return dict(event)
    proc.kill()
    raise AssertionError(f"no ready line (exit {proc.poll()}): {proc.stderr.read() if proc.stderr else ''}")


def stop(proc: subprocess.Popen[str], timeout: float = 15.0) -> tuple[int, dict[str, Any]]:
    """SIGTERM, wait; returns (exit code, the final {"event": "stopped"} document)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    final: dict[str, Any] = {}
    for line in (out or "").splitlines():
        if line.startswith("{") and '"stopped"' in line:
            final = json.loads(line)
    return proc.returncode, final


@contextmanager
def processor_service(*exports: str, args: tuple[str, ...] = ()) -> Iterator[tuple[subprocess.Popen[str], dict]]:
    """`mycroft processor serve` on free ports (port 0) with a metrics endpoint."""
    command = [str(BIN / "mycroft"), "processor", "serve", "--otlp-grpc", "127.0.0.1:0", "--otlp-http",
               "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--log-level", "WARNING", *args]
    for endpoint in exports:
        command += ["--export", endpoint]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO))
    try:
        yield proc, _read_ready(proc, 30)
    finally:
        stop(proc)


@contextmanager
def embedded_collector(*exports: str, args: tuple[str, ...] = (), workdir: str | None = None,
                       engine: str = "rotel") -> Iterator[tuple[subprocess.Popen[str], dict]]:
    """`mycroft collector run --engine ENGINE` on free ports; fails if another engine came up."""
    grpc_port, http_port = free_port(), free_port()
    command = [str(BIN / "mycroft"), "collector", "run", "--engine", engine, "--otlp-grpc", f"127.0.0.1:{grpc_port}",
               "--otlp-http", f"127.0.0.1:{http_port}", *args]
    if workdir:
        command += ["--workdir", workdir]
    for endpoint in exports:
        command += ["--export", endpoint]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                            env=dict(os.environ))
    try:
        ready = _read_ready(proc, 30)
        assert ready["engine"] == engine, (ready, proc.stderr.readline() if proc.stderr else "")
        ready["grpc_port"], ready["http_port"] = grpc_port, http_port
        yield proc, ready
    finally:
        stop(proc)


def rss_kib(pid: int) -> int:
    """Resident memory of a process and all its descendants (rotel is a child of the CLI)."""
    total = 0
    pids = [pid]
    while pids:
        current = pids.pop()
        try:
            with open(f"/proc/{current}/status") as handle:
                for line in handle:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            with open(f"/proc/{current}/task/{current}/children") as handle:
                pids.extend(int(child) for child in handle.read().split())
        except OSError:
            continue
    return total


@contextmanager
def rca_service(workdir: str, forward: str | None = None) -> Iterator[dict[str, Any]]:
    """The real RCA service (`mycroft rca serve`) on free ports; `forward`: its tee of what it received
    (host:port, OTLP gRPC). Yields {"otlp_grpc": endpoint, "api": base URL}."""
    grpc_port, http_port, api_port = free_port(), free_port(), free_port()
    command = [str(BIN / "mycroft"), "rca", "serve", "--otlp-grpc", f"127.0.0.1:{grpc_port}",
               "--otlp-http", f"127.0.0.1:{http_port}", "--http", f"127.0.0.1:{api_port}",
               "--db", os.path.join(workdir, "rca.db")]
    if forward:
        command += ["--forward", forward]
    log = open(os.path.join(workdir, "rca.log"), "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=str(REPO))
    api = f"http://127.0.0.1:{api_port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{api}/healthz", timeout=1).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"RCA service did not start: {Path(log.name).read_text()[-2000:]}") from None
                time.sleep(0.1)
        yield {"otlp_grpc": f"http://127.0.0.1:{grpc_port}", "api": api}
    finally:
        stop(proc)
        log.close()


def api_get(url: str) -> Any:
    return json.loads(urllib.request.urlopen(url, timeout=5).read())
