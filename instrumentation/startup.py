"""Start-up: a rank reports from process start, before init_process_group, with its phase.

A job can hang before its first collective: one rank stuck importing or loading data before
`init_process_group`, the others waiting in rendezvous until the store times out (30 min by
default). Nothing is traced then, so without this the RCA knows no job at all. The launcher's
environment tells who a process is before torch.distributed does:

- torchrun / `python -m torch.distributed.run`: RANK, WORLD_SIZE, LOCAL_RANK (+ GROUP_RANK,
  LOCAL_WORLD_SIZE); job id TORCHELASTIC_RUN_ID when set (`--rdzv-id`, `--standalone`), else the
  rendezvous endpoint MASTER_ADDR:MASTER_PORT (hashed), the same on every node;
- `srun` / `sbatch` without torchrun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (+ SLURM_NODEID, the
  step's tasks on this node); job id SLURM_JOB_ID.SLURM_STEP_ID -- also when the script sets RANK /
  WORLD_SIZE / LOCAL_RANK from them itself (as srun users do), before or after this module loads;
- `mp.spawn` with env://: RANK / WORLD_SIZE when the parent sets them (else reporting starts at init).

MYCROFT_JOB_ID overrides the job id everywhere. The host a rank reports (`host.name`, and every place
the RCA names a host: incidents, /api/v1/hosts, the suspect list, drain and cordon targets) is
`host_identity`: SLURM's node name (SLURMD_NODENAME), else the Kubernetes node name (K8S_NODE_NAME,
set from the downward API), else the OS host name, which is kept in `mycroft.host.os_name`.

From these, `StartupReporter` sends heartbeats
with `mycroft.hb.phase` = importing, then rendezvous while init_process_group runs (and the
main thread's stack once the phase lasts), until the runtime takes over at init (phase
training, same heartbeat counter).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mycroft.instrumentation.thread_names import name_this_thread
from opentelemetry.sdk.resources import Resource

from mycroft import schema
from mycroft.otlp import AttrValue

log = logging.getLogger("mycroft.instrumentation")


@dataclass(frozen=True, slots=True)
class LaunchFacts:
    """Who this process is, as its launcher's environment says (before torch.distributed exists)."""

    rank: int
    world_size: int
    local_rank: int
    node_rank: int  # the node's index among the job's nodes (-1: unknown)
    local_world_size: int  # ranks per node (0: unknown)
    job_id: str
    launcher: str  # "torchrun" | "slurm" | "env"
    slurm_job_id: str = ""
    slurm_step_id: str = ""


ENV_KUBE_NODE_NAME = "K8S_NODE_NAME"  # the pod's node, from the downward API (docs/actions.md)


def host_identity(env: Mapping[str, str], os_host: str | None = None) -> str:
    """The name this rank's host goes by wherever a host is named (pure but for the OS host name):
    SLURM's node name (SLURMD_NODENAME: what scontrol drains and `srun --exclude` takes, which need
    not be the OS host name), else the Kubernetes node name (K8S_NODE_NAME, from the downward API:
    what a cordon patches; in a pod the host name is the pod's), else the OS host name."""
    for name in ("SLURMD_NODENAME", ENV_KUBE_NODE_NAME):
        value = env.get(name, "").strip()
        if value:
            return value[:255]
    return os_host if os_host is not None else socket.gethostname()


def host_attributes(env: Mapping[str, str]) -> dict[str, AttrValue]:
    """host.name (the host identity), the OS host name beside it, and the Kubernetes node where known."""
    os_host = socket.gethostname()
    attributes: dict[str, AttrValue] = {schema.RES_HOST_NAME: host_identity(env, os_host),
                                        schema.RES_OS_HOST_NAME: os_host}
    kube = env.get(ENV_KUBE_NODE_NAME, "").strip()
    if kube:
        attributes[schema.RES_KUBE_NODE_NAME] = kube[:255]
    return attributes


def _under_slurm(env: Mapping[str, str]) -> bool:
    """A SLURM task (srun, or sbatch's batch step) not started by torchrun."""
    return "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "TORCHELASTIC_RUN_ID" not in env


def slurm_tasks_on_node(env: Mapping[str, str]) -> int:
    """How many tasks of this step run on this node (pure; 0: unknown): SLURM_STEP_TASKS_PER_NODE
    (else SLURM_TASKS_PER_NODE), "4" or "2(x3),1" by node, at this task's SLURM_NODEID."""
    node = _int(env, "SLURM_NODEID", 0)
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        text = env.get(name, "").strip()
        if not text:
            continue
        counts: list[int] = []
        for item in text.split(","):
            count, _, times = item.strip().partition("(x")
            try:
                counts.extend([int(count)] * (int(times.rstrip(")")) if times else 1))
            except ValueError:
                return 0
            if len(counts) > node:
                return counts[node]
        return 0
    nodes = max(1, _int(env, "SLURM_NNODES", 1))
    world = _int(env, "SLURM_NTASKS", 0)
    return world // nodes if world > 0 and world % nodes == 0 else 0


def _int(env: Mapping[str, str], name: str, default: int = -1) -> int:
    try:
        return int(env.get(name, ""))
    except ValueError:
        return default


def launch_job_id(env: Mapping[str, str]) -> str | None:
    """The job id every rank of a launch agrees on without talking to the others (pure).

    MYCROFT_JOB_ID; else torchelastic's run id (unless its default "none"); else SLURM's job
    and step; else the rendezvous endpoint (hashed), which every node of one launch shares.
    """
    if env.get("MYCROFT_JOB_ID"):
        return env["MYCROFT_JOB_ID"]
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return run_id
    if env.get("SLURM_JOB_ID") and _under_slurm(env):  # whoever set RANK: every task of the step agrees
        step = env.get("SLURM_STEP_ID", "")
        return f"slurm-{env['SLURM_JOB_ID']}" + (f".{step}" if step else "")
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return endpoint_job_id(f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}")
    return None


def endpoint_job_id(endpoint: str) -> str:
    """A job id from the rendezvous endpoint every node of one launch is given (pure)."""
    return "job-" + hashlib.blake2b(endpoint.encode(), digest_size=8).hexdigest()


def launch_facts(env: Mapping[str, str]) -> LaunchFacts | None:
    """The launcher's facts, or None when it tells no rank and world size (pure).

    Under srun without torchrun the facts are SLURM's whether or not the script copied them into
    RANK / WORLD_SIZE / LOCAL_RANK (read at start-up, before it does, and again at the abort, after):
    a script's own RANK that is not its SLURM_PROCID (mp.spawn inside a task) is its own ranks'."""
    slurm_job = env.get("SLURM_JOB_ID", "")
    slurm = _under_slurm(env)
    if "RANK" in env and "WORLD_SIZE" in env and not (
            slurm and env["RANK"] == env["SLURM_PROCID"] and env["WORLD_SIZE"] == env["SLURM_NTASKS"]):
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local = _int(env, "LOCAL_RANK", rank)
        node, per_node = _int(env, "GROUP_RANK"), _int(env, "LOCAL_WORLD_SIZE", 0)
        launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "env"
    elif slurm:
        rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
        local, node = _int(env, "SLURM_LOCALID", 0), _int(env, "SLURM_NODEID")
        per_node = slurm_tasks_on_node(env)
        launcher = "slurm"
    else:
        return None
    job = launch_job_id(env)
    if job is None or rank < 0 or world <= 0 or rank >= world:
        return None
    step = env.get("SLURM_STEP_ID", "") if slurm_job else ""
    return LaunchFacts(rank, world, max(local, 0), node, per_node, job, launcher, slurm_job, step)


def init_environment(env: Mapping[str, str], init_kwargs: Mapping[str, Any]) -> dict[str, str]:
    """The launcher's environment completed by init_process_group's own arguments (pure): a process
    started without RANK / WORLD_SIZE (mp.spawn passing rank=, a tcp:// init_method) says who it is
    only there."""
    merged = dict(env)
    for key, name in (("rank", "RANK"), ("world_size", "WORLD_SIZE")):
        value = init_kwargs.get(key)
        if isinstance(value, int) and value >= 0 and name not in merged:
            merged[name] = str(value)
    method = init_kwargs.get("init_method")
    if isinstance(method, str) and method.startswith("tcp://") and "MASTER_ADDR" not in merged:
        host, _, port = method[len("tcp://"):].split("?", 1)[0].rpartition(":")
        if host and port.isdigit():
            merged["MASTER_ADDR"], merged["MASTER_PORT"] = host.strip("[]"), port
    return merged


def launch_resource(facts: LaunchFacts) -> dict[str, AttrValue]:
    """The resource attributes a rank has before init (the runtime's adds the run id)."""
    attributes: dict[str, AttrValue] = {
        schema.RES_JOB_ID: facts.job_id,
        schema.RES_RANK: facts.rank,
        schema.RES_WORLD_SIZE: facts.world_size,
        schema.RES_LOCAL_RANK: facts.local_rank,
        **host_attributes(os.environ),
        schema.RES_PROCESS_PID: os.getpid(),
        schema.RES_SCHEMA_VERSION: schema.SCHEMA_VERSION,
        schema.RES_LAUNCHER: facts.launcher,
    }
    if facts.node_rank >= 0:
        attributes[schema.RES_NODE_RANK] = facts.node_rank
    if facts.local_world_size > 0:
        attributes[schema.RES_LOCAL_WORLD_SIZE] = facts.local_world_size
    if facts.slurm_job_id:
        attributes[schema.RES_SLURM_JOB_ID] = facts.slurm_job_id
    if facts.slurm_step_id:
        attributes[schema.RES_SLURM_STEP_ID] = facts.slurm_step_id
    return attributes


def named_resource(base: Resource | None, attributes: dict[str, AttrValue], job_id: str) -> Resource:
    """The detected resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) merged with ours; a job
    nobody named is named by its id."""
    detected = base if base is not None else Resource.create({})
    service = str(detected.attributes.get(schema.RES_SERVICE_NAME, ""))
    if not service or service.startswith("unknown_service"):
        attributes = {**attributes, schema.RES_SERVICE_NAME: job_id}
    return detected.merge(Resource(attributes))


class StartupReporter:
    """Heartbeats of a rank before init_process_group: phase, and the stack once it lasts."""

    def __init__(self, facts: LaunchFacts, config: Any, base_resource: Resource | None = None,
                 exporter: Any = None, deliver: Any = None) -> None:
        from mycroft.instrumentation.export import Shipper, exporter_from_env

        self.facts = facts
        self.interval_s = config.heartbeat_interval_s
        self.stack_after_s = config.stack_after_s
        self.stack_depth = config.stack_depth
        self.phase = schema.PHASE_IMPORTING
        self.phase_since_ns = time.time_ns()
        self.counter = 0
        self._last_ns = time.time_ns()
        self._rng = random.Random()
        self._stop = threading.Event()
        resource = named_resource(base_resource, launch_resource(facts), facts.job_id)
        if exporter is None and deliver is None:
            exporter = exporter_from_env()
        # one Shipper for the process's life: the runtime takes it over (one exporter, one "export failed")
        self.shipper = Shipper(exporter, resource, config.queue_size, config.export_batch, config.export_delay_s,
                               deliver=deliver)
        self._thread = threading.Thread(target=self._run, name="mycroft-startup", daemon=True)
        self._thread.start()

    def enter(self, phase: str) -> None:
        """The main thread moved on (init_process_group called): report it at once."""
        self.phase, self.phase_since_ns = phase, time.time_ns()
        self._send(time.time_ns())

    def _run(self) -> None:
        name_this_thread("mycroft-startup")
        self._send(time.time_ns())  # the first heartbeat at once: a rank that never arrives is known
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(Exception):
                self._send(time.time_ns())

    def _send(self, now: int) -> None:
        from mycroft.instrumentation.spans import heartbeat_attributes, heartbeat_span
        from mycroft.instrumentation.stacks import main_thread_stack

        in_phase_s = max(0, now - self.phase_since_ns) / 1e9
        attributes = heartbeat_attributes((), (), now, in_phase_s)  # the contract's arrays, empty: no group yet
        attributes[schema.ATTR_HB_PHASE] = self.phase
        attributes[schema.ATTR_HB_PHASE_S] = round(in_phase_s, 3)
        if now - self.phase_since_ns >= self.stack_after_s * 1e9:
            stack = main_thread_stack(self.stack_depth)
            if stack:
                attributes[schema.ATTR_HB_STACK] = stack
        self.counter += 1
        span = heartbeat_span(self.facts.rank, self.counter, self.interval_s, self._last_ns, now, attributes,
                              self._rng)
        self._last_ns = now
        self.shipper.submit([span], urgent=True)

    def hand_over(self) -> tuple[int, Any]:
        """Stop reporting (the runtime does from now on): the heartbeat counter to continue from, and the
        Shipper to go on with."""
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=1.0)
        return self.counter, self.shipper

    def stop(self) -> None:
        """No runtime follows (uninstrument before init): flush and close."""
        self.hand_over()
        with contextlib.suppress(Exception):
            self.shipper.flush(1.0)
            self.shipper.shutdown(0.5)
