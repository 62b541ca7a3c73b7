"""Multi-node torchrun: two real torchrun agents on this machine play two nodes, each instrumented
by `opentelemetry-instrument`, against an in-process RCA service.

A node that never comes leaves the other node's agent waiting in the node rendezvous with no
worker started, so no rank exists: the agent reports (instrumentation/agent.py) and the RCA names
the absent node -- by index under the static rendezvous (`--node-rank`), by host where SLURM lists
the job's hosts, else by count (c10d). A healthy two-node run is one job (agents and ranks under
the job id the agents pass on) with no loud incident, and the workers' training is the same.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from mycroft.faults.inject import free_port, kill_tree, local_rca
from mycroft.faults.scoring import severity
from tests.conftest import BIN, instrumented_env
from tests.rca.helpers import http

pytestmark = pytest.mark.slow

JOB = Path(__file__).parent / "jobs" / "two_node_allreduce.py"


def _agent(rca: Any, backend: str, endpoint: str, job: str | None, *extra: str, env: dict[str, str] | None = None,
           log: Path) -> subprocess.Popen[bytes]:
    """One node: `opentelemetry-instrument torchrun --nnodes 2 --nproc-per-node 2 ...`."""
    given = {"MYCROFT_HEARTBEAT_INTERVAL": "0.5", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{rca.otlp_grpc}",
             **(env or {})}
    if job is not None:
        given["MYCROFT_JOB_ID"] = job
    rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint] if backend == "c10d" else \
        ["--master-addr", endpoint.split(":")[0], "--master-port", endpoint.split(":")[1]]
    command = [str(BIN / "opentelemetry-instrument"), str(BIN / "torchrun"), "--nnodes", "2", "--nproc-per-node", "2",
               *rdzv, *extra, str(JOB)]
    with open(log, "wb") as out:
        return subprocess.Popen(command, env=instrumented_env(None, **given), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _loud(rca: Any, job: str) -> list[dict[str, Any]]:
    return [i for i in rca.incidents(job) if severity(i) != "info"]


def _wait_named(rca: Any, job: str, timeout_s: float) -> dict[str, Any] | None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        for incident in _loud(rca, job):
            causes = incident.get("root_causes") or []
            if causes and causes[0].get("kind") == "node_not_arrived":
                return incident
        time.sleep(0.1)
    return None


@pytest.mark.parametrize("backend", ["c10d", "static"])
def test_a_node_that_never_comes_is_named(tmp_path: Path, backend: str) -> None:
    """Only node 0 starts: its agent waits for node 1 with no rank started; named within seconds
    (static: node 1 by index, and by host from SLURM_JOB_NODELIST)."""
    with local_rca() as rca:
        job = f"nodes-{backend}-{free_port()}"
        extra = ("--rdzv-id", job) if backend == "c10d" else ("--node-rank", "0")
        env = {"SLURM_JOB_NODELIST": "trn[07-08]"} if backend == "static" else None
        started = time.time()
        agent = _agent(rca, backend, f"127.0.0.1:{free_port()}", None if backend == "c10d" else job, *extra, env=env,
                       log=tmp_path / "node0.log")
        try:
            incident = _wait_named(rca, job, 30.0)
            assert incident is not None, ((tmp_path / "node0.log").read_text()[-3000:], rca.incidents(job))
            assert agent.poll() is None  # still waiting: the verdict comes long before torchrun gives up
            took = time.time() - started
            cause = incident["root_causes"][0]
            assert incident["kind"] == "hang" and incident["severity"] == "warning", incident
            assert len(incident["root_causes"]) == 1 and cause["rank"] is None
            if backend == "static":
                assert cause["evidence"]["node"] == 1 and cause["evidence"]["host"] == "trn08", cause
            else:
                assert cause["evidence"]["node"] == -1
            assert "1 of 2 nodes" in cause["evidence"]["text"], cause
            assert took < 25.0, took  # interpreter and torch start-up (~5-10 s here) + 5 s of waiting
            # the jobs API lists the waiting agent (no rank yet)
            status, body = http(f"{rca.api}/api/v1/jobs")
            (listed,) = [j for j in json.loads(body) if j["job"] == job]
            assert status == 200 and listed["ranks_seen"] == 0, listed
            (waiting,) = listed["agents"]
            assert waiting["nodes_min"] == 2 and not waiting["done"] and waiting["waited_s"] >= 5.0, waiting
            assert waiting["node_rank"] == (0 if backend == "static" else None), waiting
        finally:
            kill_tree(agent)


def test_a_healthy_two_node_run_is_one_quiet_job(tmp_path: Path) -> None:
    """Both nodes (the second 1 s late): the agents report while they wait, then the 4 ranks under the
    same job id; the job trains to the same result as uninstrumented, and nothing loud is raised."""
    with local_rca() as rca:
        job = f"nodes-ok-{free_port()}"
        endpoint = f"127.0.0.1:{free_port()}"
        first = _agent(rca, "c10d", endpoint, None, "--rdzv-id", job, log=tmp_path / "node0.log")
        time.sleep(1.0)
        second = _agent(rca, "c10d", endpoint, None, "--rdzv-id", job, log=tmp_path / "node1.log")
        try:
            assert first.wait(timeout=180) == 0 and second.wait(timeout=60) == 0, \
                (tmp_path / "node0.log").read_text()[-3000:]
        finally:
            kill_tree(first)
            kill_tree(second)
        time.sleep(1.5)
        service = rca.service  # type: ignore[attr-defined]
        state = service.engine.jobs.get(job)
        assert state is not None, sorted(service.engine.jobs)
        assert len(state.agents) == 2 and all(a.done for a in state.agents.values()), state.agents
        assert sorted(state.ranks) == [0, 1, 2, 3]
        assert _loud(rca, job) == [], rca.incidents(job)
        outputs = [(tmp_path / f"node{n}.log").read_text() for n in (0, 1)]
        sums = [value for text in outputs for value in re.findall(r"final_sum=(\d+\.\d+)", text)]
        assert sums == ["10.0"] * 4, outputs  # each rank's (two workers share a node's output)
