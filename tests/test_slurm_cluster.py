"""Against a real single-node SLURM cluster (tests/slurm_cluster.py): what srun gives each
task, and the scheduler actions (rca_service/incidents/scheduler_actions.py) draining the node,
requeueing and cancelling a running batch job, resuming the node."""

from __future__ import annotations

import json
import sys
import uuid

import pytest
from mycroft.rca_service.incidents.scheduler_actions import slurm_cancel, slurm_drain, slurm_requeue, slurm_resume

from tests.slurm_cluster import (
    SlurmCluster,
    pids_with_env,
    slurm_cluster,  # noqa: F401 - the fixture
)

pytestmark = pytest.mark.slow

TASK_VARS = ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODELIST",
             "SLURM_STEP_ID")


def test_srun_runs_two_tasks_with_slurm_env(slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    code = ("import json, os; print(json.dumps({k: v for k, v in os.environ.items()"
            " if k.startswith('SLURM_') or k == 'MYCROFT_TEST_VAR'}))")
    extra = ["--overcommit"] if slurm_cluster.cpus < 2 else []
    out = slurm_cluster.root / "srun-env"
    out.mkdir()
    # one output file per task (%t): the tasks' lines would interleave on srun's own stdout
    result = slurm_cluster.run("srun", "-n", "2", *extra, "-o", str(out / "task-%t.out"),
                               sys.executable, "-c", code, env={"MYCROFT_TEST_VAR": "given"})
    files = sorted(out.glob("task-*.out"))
    assert [f.name for f in files] == ["task-0.out", "task-1.out"], (files, result.stderr)
    tasks = [json.loads(f.read_text()) for f in files]
    for task in tasks:
        missing = [name for name in TASK_VARS if name not in task]
        assert not missing, (missing, task)
        assert task["SLURM_NTASKS"] == "2"
        assert task["SLURM_NODELIST"] == slurm_cluster.node
        assert task["SLURM_STEP_ID"] == "0"
        assert task["MYCROFT_TEST_VAR"] == "given"   # the caller's environment reaches the tasks
    assert {task["SLURM_PROCID"] for task in tasks} == {"0", "1"}
    assert {task["SLURM_LOCALID"] for task in tasks} == {"0", "1"}
    assert len({task["SLURM_JOB_ID"] for task in tasks}) == 1


def test_drain_requeue_cancel_resume(slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    cluster, node = slurm_cluster, slurm_cluster.node
    token = uuid.uuid4().hex
    out = cluster.root / "job-%j.out"
    job_id = cluster.run("sbatch", "--parsable", "--requeue", "-n", "1", "-J", "sleeper", "-o", str(out),
                         "--wrap", "while true; do sleep 0.5; done",
                         env={"MYCROFT_TEST_JOB": token}).stdout.strip().split(";")[0]
    assert job_id.isdigit(), job_id
    try:
        cluster.wait_for(lambda: cluster.job_state(job_id) == "RUNNING", 30, f"job {job_id} running")
        cluster.wait_for(lambda: pids_with_env("MYCROFT_TEST_JOB", token), 10, "the job's processes")

        # drain: the reason goes as one argument, made one line without double quotes
        result = slurm_drain(node, 'mycroft: rank 3 hung\nin "all_reduce"', env=cluster.env)
        assert result.ok, result.detail
        assert "state=drain" in result.detail
        cluster.wait_for(lambda: cluster.node_state() in ("draining", "drained"), 10, "node draining")
        assert cluster.node_state() == "draining"     # the job still runs on it
        assert cluster.node_reason() == "mycroft: rank 3 hung in 'all_reduce'"
        sinfo_r = cluster.run("sinfo", "-R").stdout     # its REASON column shows 20 characters
        assert "mycroft: rank 3 hung" in sinfo_r and node in sinfo_r
        full = cluster.run("sinfo", "-R", "-h", "-o", "%N|%E").stdout.strip()
        assert full == f"{node}|mycroft: rank 3 hung in 'all_reduce'"

        # requeue: back to pending (the drained node keeps it there), its processes killed
        result = slurm_requeue(job_id, env=cluster.env)
        assert result.ok, result.detail
        cluster.wait_for(lambda: cluster.job_state(job_id) == "PENDING", 20, f"job {job_id} pending")
        info = cluster.job_info(job_id)
        assert info.get("Restarts") == "1", info
        cluster.wait_for(lambda: not pids_with_env("MYCROFT_TEST_JOB", token), 15,
                         "the requeued job's processes to end")
        cluster.wait_for(lambda: cluster.node_state() == "drained", 15, "node drained")

        # cancel: it ends
        result = slurm_cancel(job_id, env=cluster.env)
        assert result.ok, result.detail
        cluster.wait_for(lambda: cluster.job_state(job_id) == "CANCELLED", 15, f"job {job_id} cancelled")

        # errors come back as ok=False, not exceptions
        gone = slurm_requeue("999999", env=cluster.env)
        assert not gone.ok and "999999" in gone.detail
        bad = slurm_drain("no-such-node", "x", env=cluster.env)
        assert not bad.ok and "no-such-node" in bad.detail

        # resume: the node takes jobs again
        result = slurm_resume(node, env=cluster.env)
        assert result.ok, result.detail
        cluster.wait_for(lambda: cluster.node_state() == "idle", 15, "node idle")
        assert cluster.node_reason() == ""
        assert cluster.run("srun", "-n", "1", "true").returncode == 0
    finally:
        cluster.run("scancel", job_id, check=False)
        cluster.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
