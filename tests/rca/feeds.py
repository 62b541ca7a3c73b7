"""A made-up job that hangs and keeps saying so over OTLP/HTTP, its ranks on chosen hosts: what the
action and fleet-memory tests feed a service (in process or a real `mycroft rca serve`)."""

from __future__ import annotations

import threading
import time

from mycroft import schema
from mycroft.faults.made_up_job import StepJob
from mycroft.otlp import SpanRecord, request_from_records

from .helpers import http


def _hosted(records: list[SpanRecord], hosts: dict[int, str], slurm_job: str = "", run: str = "",
            kube: bool = False) -> list[SpanRecord]:
    """The made-up job's ranks on these hosts (and in this SLURM job, this run; in pods on Kubernetes
    nodes named k8s-<host>)."""
    for record in records:
        rank = int(record.resource[schema.RES_RANK])  # type: ignore[arg-type]
        record.resource[schema.RES_HOST_NAME] = hosts.get(rank, "node-other")
        if kube:
            record.resource[schema.RES_KUBE_NODE_NAME] = f"k8s-{record.resource[schema.RES_HOST_NAME]}"
        if slurm_job:
            record.resource[schema.RES_SLURM_JOB_ID] = slurm_job
        if run:
            record.resource[schema.RES_RUN_ID] = run
    return records


class Feeder:
    """A job that hangs on rank `culprit` (not entered, or silent: lost) and keeps reporting so, to
    whatever OTLP/HTTP port `port` says (a restarted service has a new one)."""

    def __init__(self, name: str, port: int, culprit: int = 2, lost: bool = False,
                 hosts: dict[int, str] | None = None, slurm_job: str = "", run: str = "", token: str = "",
                 kube: bool = False) -> None:
        self.port = port
        self.job = StepJob(name, 4, t0=time.time() - 5.0)
        self.culprit, self.lost = culprit, lost
        self.hosts = hosts or {r: f"node{r}" for r in range(4)}
        self.slurm_job, self.run, self.kube = slurm_job, run, kube
        self.headers = {"Content-Type": "application/x-protobuf", **({"Authorization": f"Bearer {token}"}
                                                                     if token else {})}
        self._stop = threading.Event()
        self._post(self.job.steps(20) + self.job.heartbeats(time.time(), not_entered=range(4), stack=""))
        self.onset = time.time()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _post(self, records: list[SpanRecord]) -> None:
        hosted = _hosted(records, self.hosts, self.slurm_job, self.run, self.kube)
        body = request_from_records(hosted).SerializeToString()
        try:
            http(f"http://127.0.0.1:{self.port}/v1/traces", body, self.headers)
        except OSError:
            pass  # the service is down (being restarted): the next beat goes to the new one

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            now = time.time()
            waiting = {r: now - self.onset for r in range(4) if r != self.culprit}
            if self.lost:
                self._post(self.job.heartbeats(now, blocked=waiting, silent=[self.culprit]))
            else:
                self._post(self.job.heartbeats(now, blocked=waiting, not_entered=[self.culprit]))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
