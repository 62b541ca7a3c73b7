"""Every launcher, zero-code where the launcher allows it: a rank blocks, the RCA names it.

torchrun's module form, torch.multiprocessing.spawn with env://, the one-line in-code start (no
opentelemetry-instrument: Ray actors, RL trainers), real Ray actors (a local Ray instance; with the
in-code start, and with only the driver under opentelemetry-instrument), and srun under a real
single-node SLURM without torchrun (the job id comes from SLURM_JOB_ID).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from mycroft.faults.inject import free_port, kill_tree, local_rca
from mycroft.faults.scoring import diagnose
from tests.slurm_cluster import slurm_cluster  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

JOB = Path(__file__).parent / "jobs" / "launch_job.py"
BIN = Path(sys.executable).parent
NPROC = 4
BLOCK_RANK = 2


def _env(rca: Any, onset: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for key in [k for k in env if k.startswith("SLURM_") or k in ("RANK", "WORLD_SIZE", "MYCROFT_JOB_ID")]:
        del env[key]
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{rca.otlp_grpc}", OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
               OTEL_TRACES_EXPORTER="otlp", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MYCROFT_HEARTBEAT_INTERVAL="0.5",
               MYCROFT_STACK_AFTER="0.3", LAUNCH_BLOCK_RANK=str(BLOCK_RANK), LAUNCH_BLOCK_STEP="8",
               LAUNCH_STEPS="100000", LAUNCH_ONSET_FILE=onset, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).parents[2]), env.get("PYTHONPATH")])))
    env.update(extra)
    return env


def _named(rca: Any, command: list[str], env: dict[str, str], onset: str, timeout_s: float = 150) -> dict[str, Any]:
    """Run the job until the RCA names a rank (or time runs out); the first non-info incident after the onset."""
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as proc:
        try:
            deadline = time.time() + timeout_s
            while not os.path.exists(onset) and time.time() < deadline and proc.poll() is None:
                time.sleep(0.1)
            assert os.path.exists(onset), (proc.poll(), proc.stdout.read() if proc.poll() is not None else "")
            at = json.loads(Path(onset).read_text())["onset"]
            while time.time() < deadline:
                found = diagnose("block", BLOCK_RANK, at, rca.service.store.list_incidents(100, None))
                if found.correct:
                    return {"incident": found.incident, "latency_s": found.incident["detected_at_unix"] - at}
                time.sleep(0.2)
            raise AssertionError(f"not named: {rca.service.store.list_incidents(100, None)}")
        finally:
            kill_tree(proc)


@pytest.mark.parametrize("launcher", ["torch.distributed.run", "mp.spawn", "in-code"])
def test_a_blocked_rank_is_named_whatever_launched_the_job(launcher: str) -> None:
    onset = os.path.join(tempfile.mkdtemp(prefix="mycroft-launch-"), "onset.json")
    with local_rca() as rca:
        env = _env(rca, onset)
        python = str(BIN / "python")
        instrument = [str(BIN / "opentelemetry-instrument")]
        if launcher == "torch.distributed.run":
            command = [*instrument, python, "-m", "torch.distributed.run", "--nproc-per-node", str(NPROC),
                       "--master-port", env["MASTER_PORT"], str(JOB)]
        elif launcher == "mp.spawn":
            command = [*instrument, python, str(JOB), "--spawn", str(NPROC)]
        else:
            command = [python, str(JOB), "--spawn", str(NPROC), "--in-code"]
        found = _named(rca, command, env, onset)
    assert found["incident"]["root_causes"][0]["kind"] == "not_entered"


@pytest.mark.requires("ray")
@pytest.mark.parametrize("start", ["in-code", "driver-instrumented"])
def test_a_blocked_rank_among_ray_actors_is_named(start: str) -> None:
    """Each actor joins the gloo group itself, in a process Ray's raylet started."""
    ray_dir = tempfile.mkdtemp(prefix="mycroft-ray-")
    onset = os.path.join(ray_dir, "onset.json")
    try:
        with local_rca() as rca:
            # a later step than the other launchers: Ray's actor processes join seconds apart, and
            # their first steps wait on the last one (a real wait the RCA reports, before the fault)
            env = _env(rca, onset, LAUNCH_RAY_DIR=ray_dir, RAY_USAGE_STATS_ENABLED="0", LAUNCH_BLOCK_STEP="40")
            command = [str(BIN / "python"), str(JOB), "--ray", str(NPROC)]
            if start == "in-code":
                command.append("--in-code")
            else:
                command.insert(0, str(BIN / "opentelemetry-instrument"))
            found = _named(rca, command, env, onset)
        assert found["incident"]["root_causes"][0]["kind"] == "not_entered"
    finally:  # Ray's own daemons (gcs, raylet, workers) left their session; they name its directory
        subprocess.run(["pkill", "-9", "-f", ray_dir], check=False)
        shutil.rmtree(ray_dir, ignore_errors=True)


def test_srun_without_torchrun_under_real_slurm(slurm_cluster: Any) -> None:  # noqa: F811
    onset = os.path.join(tempfile.mkdtemp(prefix="mycroft-srun-"), "onset.json")
    with local_rca() as rca:
        env = {**_env(rca, onset), **{k: v for k, v in slurm_cluster.env.items() if k.startswith("SLURM_CONF")
                                      or k.startswith("MYCROFT_SLURM")}}
        # --overcommit: 4 tasks on the test node's 2 CPUs
        command = ["srun", "-n", str(NPROC), "--overcommit", "--kill-on-bad-exit=1",
                   str(BIN / "opentelemetry-instrument"), str(BIN / "python"), str(JOB)]
        found = _named(rca, command, env, onset)
        incident = found["incident"]
    assert incident["job"].startswith("slurm-"), incident["job"]
    hosts = incident.get("root_cause_hosts") or {}
    assert hosts.get(str(BLOCK_RANK)) == slurm_cluster.node, incident
