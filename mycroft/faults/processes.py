"""Starting and stopping the jobs the fault harnesses run: a free port, the launcher's command line,
the environment an instrumented job gets, and killing a launcher with every worker below it.
Shared by inject.py (process faults) and netfault.py (network faults), which import it, not each other."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def job_command(nproc: int, master_port: int, module: str = "mycroft.faults.faultjob") -> list[str]:
    bin_dir = Path(sys.executable).parent
    torchrun = [str(bin_dir / "torchrun"), "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
                "--master-port", str(master_port), "--monitor-interval", "0.1", "-m", module]
    return [str(bin_dir / "opentelemetry-instrument"), *torchrun]


def job_env(rca_grpc: str, job: str, fault: str, rank: int, step: int, steps: int, onset_file: str,
            heartbeat: float, step_s: float) -> dict[str, str]:
    # not MYCROFT_STARTUP_PID: it marks this process's children as its own helpers (no start-up reports);
    # an instrumented harness (a notebook, a test process) launching a job must not pass it on
    env = {key: value for key, value in os.environ.items() if key != "MYCROFT_STARTUP_PID"}
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{rca_grpc}", OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_TRACES_EXPORTER="otlp", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
        OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MYCROFT_JOB_ID=job,
        MYCROFT_HEARTBEAT_INTERVAL=str(heartbeat), MYCROFT_FAULT=fault, MYCROFT_FAULT_RANK=str(rank),
        MYCROFT_FAULT_STEP=str(step), MYCROFT_FAULT_STEPS=str(steps), MYCROFT_FAULT_ONSET_FILE=onset_file,
        MYCROFT_FAULT_STEP_S=str(step_s),
        # the stack of a rank outside communication is the evidence for "not entered": send it early
        MYCROFT_STACK_AFTER=os.environ.get("MYCROFT_STACK_AFTER", "0.3"),
    )
    return env


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun starts each worker in a session of its own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen[Any]) -> None:
    """Kill the launcher and every worker it started (continuing stopped ones first)."""
    victims = [*_descendants(proc.pid), proc.pid]
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
