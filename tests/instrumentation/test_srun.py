"""srun as users run it, under a real single-node SLURM whose node is named node17 (not this host's
name): `srun -n 4 opentelemetry-instrument python srun_ddp.py`, a gloo DDP job that sets RANK /
WORLD_SIZE / LOCAL_RANK from SLURM's variables itself.

- a rank blocked in user code at a random step: the first loud incident names it, on host node17
  (the SLURM node name, not gethostname()), its OS host name beside it; the suspect line the hosts
  API gives is one `srun --exclude` accepts;
- a rank blocked in its data loading (a known pause) on a loaded node: the ranks still computing DDP's
  backward toward the all-reduce are late, not causes: no incident names them.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from mycroft.rca_service.incidents.action_policy import parse_policy

from mycroft import schema
from mycroft.faults.inject import local_rca
from mycroft.faults.scoring import diagnose, severity
from tests.slurm_cluster import SlurmCluster, slurm_node17  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

JOB = Path(__file__).parent / "jobs" / "srun_ddp.py"
BIN = Path(sys.executable).parent
ROOT = Path(__file__).parents[2]
NPROC = 4


def srun_env(cluster: SlurmCluster, rca: Any, work: Path, **extra: str) -> dict[str, str]:
    """The environment of `srun ... opentelemetry-instrument python srun_ddp.py` against `rca`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MYCROFT_JOB_ID")}
    env.update(cluster.env)
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{rca.otlp_grpc}", OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
               OTEL_TRACES_EXPORTER="otlp", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MYCROFT_HEARTBEAT_INTERVAL="0.5",
               MYCROFT_STACK_AFTER="0.3", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               SRUN_ONSET_FILE=str(work / "onset.json"), SRUN_PID_DIR=str(work),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def srun_command(*options: str) -> list[str]:
    # --overcommit: 4 tasks on the test machine's 2 CPUs; -l: each line says its task
    return ["srun", "-n", str(NPROC), "--overcommit", "-l", *options,
            str(BIN / "opentelemetry-instrument"), str(BIN / "python"), str(JOB)]


def wait_onset(work: Path, proc: subprocess.Popen[str], timeout_s: float = 180.0) -> float:
    onset = work / "onset.json"
    deadline = time.time() + timeout_s
    while not onset.exists():
        assert proc.poll() is None, f"srun ended rc={proc.returncode}: {_output(proc)}"
        assert time.time() < deadline, "no onset"
        time.sleep(0.1)
    return float(json.loads(onset.read_text())["onset"])


def _output(proc: subprocess.Popen[str]) -> str:
    try:
        out, _ = proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        return "(running)"
    return out[-3000:]


@pytest.fixture
def work() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mycroft-srun-"))
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


def _stop(cluster: SlurmCluster, proc: subprocess.Popen[str]) -> None:
    """Tasks are slurmstepd's children: end the job step, then srun."""
    jobs = cluster.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
    if jobs:
        cluster.run("scancel", "--signal=KILL", *jobs, check=False)
        cluster.run("scancel", *jobs, check=False)
    proc.kill()
    proc.communicate(timeout=30)


def test_srun_ddp_blocked_rank_named_by_its_slurm_node_and_excluded(slurm_node17: SlurmCluster,  # noqa: F811
                                                                    work: Path) -> None:
    cluster = slurm_node17
    assert cluster.node == "node17" != socket.gethostname()
    step = random.Random().randint(3, 12)
    block_rank = 2
    # one incident makes a suspect here, so the suspect line can be checked on this one job
    policy = parse_policy(yaml.safe_load("mode: observe\nsuspects: {min_incidents: 1, window_s: 3600}"))
    with local_rca(actions=policy) as rca:
        env = srun_env(cluster, rca, work, SRUN_BLOCK_RANK=str(block_rank), SRUN_BLOCK_STEP=str(step))
        proc = subprocess.Popen(srun_command(), env=env, cwd=cluster.root, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            onset = wait_onset(work, proc)
            deadline = time.time() + 30
            found = diagnose("block", block_rank, onset, rca.incidents(None))
            while not found.correct and time.time() < deadline:
                time.sleep(0.2)
                found = diagnose("block", block_rank, onset, rca.incidents(None))
            assert found.correct, (step, _brief(rca.incidents(None), onset))
            incident = found.incident
            latency = incident["detected_at_unix"] - onset
            assert incident["job"].startswith("slurm-") and incident["root_causes"][0]["kind"] == "not_entered"
            # the host identity is SLURM's node name, everywhere a host is named
            assert incident["root_cause_hosts"] == {str(block_rank): "node17"}, incident
            assert incident["root_causes"][0]["evidence"]["host"] == "node17"
            with rca.service._lock:
                job = rca.service.engine.jobs[incident["job"]]
                resource = job.ranks[block_rank].resource
            assert resource[schema.RES_HOST_NAME] == "node17"
            assert resource[schema.RES_OS_HOST_NAME] == socket.gethostname()
            assert resource[schema.RES_SLURM_STEP_ID] == "0" and resource[schema.RES_LAUNCHER] == "slurm"
            rca.service.note_hosts()
            hosts = _get(f"{rca.api}/api/v1/hosts")
            assert [h["host"] for h in hosts] == ["node17"], hosts
            line = _get_text(f"{rca.api}/api/v1/hosts/suspect?format=slurm").strip()
            assert line == "node17"
        finally:
            _stop(cluster, proc)
    # the suspect line is what srun --exclude takes: SLURM refuses a name it does not know (vm)
    refused = cluster.run("srun", "-n", "1", f"--exclude={socket.gethostname()}", "true", check=False, timeout=30)
    assert refused.returncode != 0 and "Invalid node name" in refused.stderr, refused.stderr
    excluded = cluster.run("srun", "-n", "1", "--immediate=5", f"--exclude={line}", "true", check=False, timeout=30)
    assert "Invalid node name" not in excluded.stderr and excluded.returncode != 0, excluded.stderr
    print(f"block at step {step}: named in {latency:.2f}s; srun --exclude={line}: {excluded.stderr.strip()}")


def test_srun_ddp_data_loading_block_names_no_computing_rank(slurm_node17: SlurmCluster,  # noqa: F811
                                                             work: Path) -> None:
    """The issue's run: rank 2 blocked in its data loading (a known pause) on a node loaded by other work;
    the other ranks, slowed, are still computing DDP's backward when rank 0 already waits in the
    all-reduce. None of them is a root cause; rank 2 is, as a pause (info)."""
    cluster = slurm_node17
    step = random.Random().randint(3, 12)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]  # load ~5 on 2 cores
    try:
        with local_rca() as rca:
            env = srun_env(cluster, rca, work, SRUN_BLOCK_RANK="2", SRUN_BLOCK_STEP=str(step), SRUN_BLOCK_IN="data",
                           SRUN_COMPUTE="1024", SRUN_BATCH="256")
            proc = subprocess.Popen(srun_command(), env=env, cwd=cluster.root, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
            try:
                onset = wait_onset(work, proc)
                time.sleep(8.0)  # past the 1 s threshold, the 2 s page floor and a few heartbeats
                after = [i for i in rca.incidents(None) if i["detected_at_unix"] >= onset]
            finally:
                _stop(cluster, proc)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    print(f"block at step {step}:", _brief(after, onset))
    named = {(c.get("rank"), i["severity"]) for i in after for c in i["root_causes"]}
    assert any(rank == 2 for rank, _ in named), after
    wrong = [i for i in after if any(c.get("rank") != 2 for c in i["root_causes"])]
    assert not wrong, [(i["severity"], i["summary"]) for i in wrong]
    assert all(severity(i) == "info" for i in after), [(i["severity"], i["summary"]) for i in after]


def _brief(incidents: list[dict[str, Any]], onset: float) -> list[tuple[Any, ...]]:
    return [(round(i["detected_at_unix"] - onset, 2), i["kind"], i["severity"], i["status"], i["summary"])
            for i in incidents]


def _get(url: str) -> Any:
    return json.loads(_get_text(url))


def _get_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())
