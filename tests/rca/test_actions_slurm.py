"""drain_node against a real single-node SLURM cluster (tests/slurm_cluster.py) whose node is named
node17, not this host's name:

- a job's rank on the cluster's node goes silent (fed spans), the acting policy drains the node with
  the incident and root cause as its reason and requeues the SLURM job the ranks reported
  (mycroft.slurm.job_id);
- a real sbatch job (srun -n 4 opentelemetry-instrument python srun_ddp.py, a DDP script that sets
  RANK itself) with one rank SIGSTOPped: the node is drained at once, every live rank prints the abort
  line and exits 75 before the job is cancelled (or requeued), and the job's relay files leave /dev/shm.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from mycroft.rca_service.incidents.action_policy import parse_policy
from mycroft.rca_service.service import RcaService, ServiceOptions

from tests.slurm_cluster import SlurmCluster, slurm_node17  # noqa: F401 - the fixture

from .feeds import Feeder
from .helpers import get_json, wait_until

pytestmark = pytest.mark.slow


def test_drain_and_requeue_on_a_real_slurm_cluster(slurm_node17: SlurmCluster, tmp_path: Path,  # noqa: F811
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, node = slurm_node17, slurm_node17.node
    for key, value in cluster.env.items():  # the service's scontrol reaches this cluster
        monkeypatch.setenv(key, value)
    job_id = cluster.run("sbatch", "--parsable", "--requeue", "-n", "1", "-J", "trainer", "-o",
                         str(cluster.root / "trainer-%j.out"), "--wrap",
                         "while true; do sleep 0.5; done").stdout.strip().split(";")[0]
    service = RcaService(ServiceOptions(
        otlp_grpc=None, otlp_http="127.0.0.1:0", http="127.0.0.1:0", db=str(tmp_path / "rca.db"), tick_s=0.05,
        actions=parse_policy(yaml.safe_load("mode: act\nrules: [{kinds: [hang, crash], "
                                            "do: [{drain_node: {requeue: true}}]}]")))).start()
    feeder = None
    try:
        cluster.wait_for(lambda: cluster.job_state(job_id) == "RUNNING", 30, f"job {job_id} running")
        feeder = Feeder("slurm-train", service.receiver.http_port or 0, culprit=3, lost=True,
                        hosts={0: "elsewhere-a", 1: "elsewhere-a", 2: "elsewhere-b", 3: node}, slurm_job=job_id)
        api = f"http://127.0.0.1:{service.api.port}"

        def drained() -> dict[str, object] | None:
            for incident in get_json(f"{api}/api/v1/incidents?job=slurm-train"):
                for action in incident.get("actions", []):
                    if action["action"] == "drain_node" and action["result"] not in ("owed", "running"):
                        return dict(action)
            return None

        assert wait_until(lambda: drained() is not None, 20)
        action = drained()
        assert action is not None and action["result"] == "done" and action["target"] == node, action
        assert f"requeue {job_id}" in str(action["detail"])
        cluster.wait_for(lambda: cluster.node_state() in ("draining", "drained"), 10, "node draining")
        reason = cluster.node_reason()
        assert reason.startswith("mycroft hang: rank 3 process_lost: ") and reason.count(" incident ") == 1, reason
        cluster.wait_for(lambda: cluster.job_state(job_id) == "PENDING", 20, f"job {job_id} requeued")
        assert cluster.job_info(job_id).get("Restarts") == "1"
    finally:
        if feeder is not None:
            feeder.stop()
        service.stop()
        cluster.run("scancel", job_id, check=False)
        cluster.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        time.sleep(0.2)


SCRIPT = """#!/bin/sh
srun -n 4 --overcommit -l {instrument} {python} {job}
echo "srun exited $?"
{after}
"""


def _sigstop_job(cluster: SlurmCluster, tmp_path: Path, kill: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """An sbatch job whose srun step is the DDP script; rank 2 SIGSTOPped after a few steps; the service
    acts (abort_job, drain_node with `kill`). What the job printed, the actions, the job's end."""
    from mycroft.instrumentation.directives import relay_paths

    from tests.instrumentation.test_srun import BIN, JOB, srun_env

    for key, value in cluster.env.items():  # the service's scontrol / scancel reach this cluster
        monkeypatch.setenv(key, value)
    service = RcaService(ServiceOptions(
        otlp_grpc="127.0.0.1:0", otlp_http=None, http="127.0.0.1:0", db=str(tmp_path / "rca.db"), tick_s=0.1,
        actions=parse_policy(yaml.safe_load(f"mode: act\nrules: [{{kinds: [hang, crash], do: "
                                            f"[{{drain_node: {{{kill}: true}}}}, abort_job]}}]")))).start()
    work = tmp_path / "job"
    work.mkdir()
    out = work / "slurm.out"

    class Rca:
        otlp_grpc = f"127.0.0.1:{service.receiver.grpc_port}"

    env = srun_env(cluster, Rca, work, MYCROFT_CONTROL_ENDPOINT=f"http://127.0.0.1:{service.api.port}")
    script = work / "train.sbatch"
    # cancel: the script goes on after its srun step (as scripts with a step after training do), so
    # the job still runs when the cancel comes; requeue: it ends with srun's exit code, and is requeued
    script.write_text(SCRIPT.format(instrument=BIN / "opentelemetry-instrument", python=BIN / "python", job=JOB,
                                    after="sleep 600" if kill == "cancel" else 'exit 75'))
    job_id = ""
    try:
        job_id = cluster.run("sbatch", "--parsable", "--requeue", "-n", "4", "--overcommit", "-J", "ddp",
                             "--open-mode=append", "-o", str(out), str(script), env=env,
                             cwd=work).stdout.strip().split(";")[0]
        pid_file = work / "rank-2.pid"
        cluster.wait_for(lambda: len(list(work.glob("rank-*.pid"))) == 4, 180, "4 ranks past their first step")
        time.sleep(2.0)  # a few steps: the job's usual pace is known
        os.kill(int(pid_file.read_text()), signal.SIGSTOP)
        stopped_at = time.time()
        api = f"http://127.0.0.1:{service.api.port}"

        def acted() -> dict[str, dict[str, Any]] | None:
            """The incident whose drain ran. The frozen rank can also raise a crash incident beside the hang
            (its silence), whose own drain of node17 is then rate limited (limits.per_host): not that one."""
            for incident in get_json(f"{api}/api/v1/incidents"):
                actions = {a["action"]: a for a in incident.get("actions", [])}
                drain = actions.get("drain_node")
                if drain and drain["result"] not in ("owed", "running", "rate_limited") and "abort_job" in actions:
                    return {"incident": incident, **actions}
            return None

        assert wait_until(lambda: acted() is not None, 60), (get_json(f"{api}/api/v1/incidents"), cluster.logs())
        found = acted()
        assert found is not None
        ended = {"CANCELLED", "PENDING"} if kill == "cancel" else {"PENDING"}
        cluster.wait_for(lambda: cluster.job_state(job_id) in ended, 30, f"job {job_id} {kill}")
        cluster.wait_for(lambda: "srun exited" in out.read_text(), 30, "the srun step's end in the job's output")
        incident = found["incident"]
        return {"incident": incident, "abort": found["abort_job"], "drain": found["drain_node"],
                "output": out.read_text(), "job_id": job_id, "state": cluster.job_info(job_id),
                "stopped_at": stopped_at, "reason": cluster.node_reason(), "sinfo_r": cluster.run("sinfo", "-R").stdout,
                "relay": relay_paths(f"slurm-{job_id}.0")}
    finally:
        if job_id:
            cluster.run("scancel", "--signal=KILL", job_id, check=False)
            cluster.run("scancel", job_id, check=False)
        service.stop()
        cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=resume", check=False)


def _tasks(output: str, status: str) -> set[int]:
    """The tasks srun reports with `status` ("srun: error: node17: tasks 0-1,3: Exited with exit code 75")."""
    found: set[int] = set()
    for line in output.splitlines():
        head, sep, tail = line.partition(": " + status)
        if not sep or tail.strip() or "srun: error:" not in head:
            continue
        for part in head.rsplit(" ", 1)[-1].split(","):
            low, _, high = part.partition("-")
            found.update(range(int(low), int(high or low) + 1))
    return found


@pytest.mark.parametrize("kill", ["cancel", "requeue"])
def test_sigstop_drains_then_every_live_rank_exits_75_before_the_job_is_killed(
        slurm_node17: SlurmCluster, tmp_path: Path, kill: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    cluster = slurm_node17
    run = _sigstop_job(cluster, tmp_path, kill, monkeypatch)
    incident, drain, abort, output = run["incident"], run["drain"], run["abort"], run["output"]
    # (the incident, read at the end, also names the ranks that left on the abort as exited: its update)
    assert {"rank": 2, "kind": "process_lost"}.items() <= incident["root_causes"][-1].items() or any(
        c["rank"] == 2 and c["kind"] == "process_lost" for c in incident["root_causes"]), incident
    assert incident["root_cause_hosts"]["2"] == "node17"
    # the drain: at once, on node17, with a reason sinfo -R shows in its first 20 characters
    assert drain["result"] == "done" and drain["target"] == "node17", drain
    assert run["reason"].startswith(f"mycroft {incident['kind']}: rank 2 process_lost")  # maybe " (+1 more)"
    assert run["reason"].endswith(f"; incident {incident['id']}") and run["reason"].count(incident["id"]) == 1
    assert f"mycroft {incident['kind']}: rank 2"[:20] in run["sinfo_r"]
    # the abort ran first; the kill waited for the ranks to leave (not its bound)
    # (published when the drain was done, or already acknowledged by the host's poller: done)
    assert abort["result"] in ("published", "done") and abort["due_at_unix"] <= drain["at_unix"], abort
    assert f"{kill} {run['job_id']}" in drain["detail"] or f"scancel {run['job_id']}" in drain["detail"], drain
    assert "after the abort's ranks left" in drain["detail"], drain["detail"]
    # every live rank printed the line and exited 75 (srun saw their exit codes: they were not killed);
    # the frozen one was killed (by a sibling leaving on the abort)
    for rank in (0, 1, 3):
        assert f"{rank}: mycroft: aborting: rank 2 (process_lost)" in output, output
    assert _tasks(output, "Exited with exit code 75") == {0, 1, 3}, output
    assert _tasks(output, "Killed") == {2}, output
    info = run["state"]
    if kill == "cancel":
        assert info["JobState"] == "CANCELLED", info
    else:
        assert info["JobState"] == "PENDING" and info.get("Restarts") == "1", info  # held by the drained node
    # the job's relay files left /dev/shm with its last rank
    lock, _ = run["relay"]
    left = [p for p in os.listdir(os.path.dirname(lock)) if p.startswith(os.path.basename(lock).split(".")[0])]
    assert not left, left
    print(f"{kill}: drain {drain['detail'][:400]}")
