"""drain_node against a real single-node SLURM cluster (tests/slurm_cluster.py): a job's rank on
the cluster's node goes silent, the acting policy drains the node with the incident and root
cause as its reason and requeues the SLURM job the ranks reported (mycroft.slurm.job_id)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from mycroft.rca_service.incidents.action_policy import parse_policy
from mycroft.rca_service.service import RcaService, ServiceOptions

from tests.slurm_cluster import SlurmCluster, slurm_cluster  # noqa: F401 - the fixture

from .feeds import Feeder
from .helpers import get_json, wait_until

pytestmark = pytest.mark.slow


def test_drain_and_requeue_on_a_real_slurm_cluster(slurm_cluster: SlurmCluster, tmp_path: Path,  # noqa: F811
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, node = slurm_cluster, slurm_cluster.node
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
        assert reason.startswith("mycroft: ") and "rank 3 (process_lost)" in reason, reason
        cluster.wait_for(lambda: cluster.job_state(job_id) == "PENDING", 20, f"job {job_id} requeued")
        assert cluster.job_info(job_id).get("Restarts") == "1"
    finally:
        if feeder is not None:
            feeder.stop()
        service.stop()
        cluster.run("scancel", job_id, check=False)
        cluster.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        time.sleep(0.2)
