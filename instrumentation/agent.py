"""A multi-node launch waiting for a node: reported by the launcher's agent, before any rank exists.

`opentelemetry-instrument torchrun --nnodes N ...` instruments torchrun's own process, the elastic
agent of its node, as well as the workers it starts. With more than one node the agent first
meets the other nodes' agents (the node rendezvous: c10d, static, etcd), and only then assigns
ranks and starts its workers. A node that never comes (not scheduled, its agent stuck or not
started) leaves every other node's agent waiting there -- 15 minutes by default -- with no worker,
no rank and so no heartbeat: the RCA would know no job at all.

So while `SimpleElasticAgent._rendezvous` runs, a thread of the agent sends agent spans
(schema.KIND_AGENT) every heartbeat interval: the rendezvous backend, the nodes it waits for
(--nnodes MIN[:MAX]), the nodes in the round so far and their hosts (c10d: read from the
handler's last synced state; static: this node's rank), and the job's hosts where the launcher
tells them (SLURM_STEP_NODELIST / SLURM_JOB_NODELIST). A last one (ATTR_HB_FINAL) says the
rendezvous completed: the workers report from then on, under the same job id (the agent passes
it to them in MYCROFT_JOB_ID). A single-node launch has no node rendezvous to wait in: nothing is reported.

Everything read from torch's handler is private API: read guarded, a fact it cannot read is
reported unknown, and an error never reaches the launcher.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mycroft.instrumentation.config import ENV_JOB_ID
from mycroft.instrumentation.startup import endpoint_job_id, host_attributes, named_resource
from mycroft.instrumentation.thread_names import name_this_thread
from opentelemetry.sdk.resources import Resource

from mycroft import schema
from mycroft.otlp import AttrValue, SpanRecord

log = logging.getLogger("mycroft.instrumentation")

LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")  # the latter: deprecated, runs the former


def is_launcher_agent(argv: Sequence[str]) -> bool:
    """Whether this process is torchrun's agent (pure), from sys.orig_argv: `[python,] torchrun ...` or
    `python -m torch.distributed.run ...` (or the deprecated `torch.distributed.launch`; sys.argv[0] is only
    "-m" while the interpreter starts)."""
    if not argv:
        return False
    if any(os.path.basename(arg) == "torchrun" for arg in argv[:2]):  # the script, or python running it
        return True
    return any(a == "-m" and b in LAUNCHER_MODULES for a, b in itertools.pairwise(argv))


_RANGE = re.compile(r"^(\d+)-(\d+)$")


def expand_hostlist(text: str, limit: int = 4096) -> list[str]:
    """SLURM's compressed host list, expanded (pure): "gpu[01-03,07],login2" -> gpu01 gpu02 gpu03 gpu07
    login2. Zero padding follows the range's first number; text it cannot read gives []."""
    hosts: list[str] = []
    depth, start = 0, 0
    parts: list[str] = []
    for i, ch in enumerate(text):  # split on the commas outside brackets
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    for part in (p.strip() for p in parts):
        if not part:
            continue
        match = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\]([^\[\]]*)", part)
        if match is None:
            if "[" in part or "]" in part:
                return []
            hosts.append(part)
            continue
        prefix, body, suffix = match.groups()
        for item in body.split(","):
            numbers = _RANGE.match(item.strip())
            if numbers is None:
                if not item.strip().isdigit():
                    return []
                hosts.append(f"{prefix}{item.strip()}{suffix}")
                continue
            low, high = numbers.groups()
            if int(high) < int(low) or int(high) - int(low) > limit:
                return []
            hosts.extend(f"{prefix}{n:0{len(low)}d}{suffix}" for n in range(int(low), int(high) + 1))
        if len(hosts) > limit:
            return []
    return hosts


def agent_job_id(env: Mapping[str, str], run_id: str, endpoint: str) -> str:
    """The job id of a multi-node launch, the same on every node's agent (pure): MYCROFT_JOB_ID, else
    the rendezvous id unless torchrun's default "none", else the rendezvous endpoint hashed (every
    node is given the same one)."""
    if env.get(ENV_JOB_ID):
        return env[ENV_JOB_ID]
    if run_id and run_id != "none":
        return run_id
    return endpoint_job_id(endpoint)


@dataclass(slots=True)
class RendezvousView:
    """What the agent can tell of its node rendezvous right now."""

    backend: str = ""
    nodes_min: int = 0
    nodes_max: int = 0
    node_rank: int = -1  # this node's index, where the backend fixes it before the round (static)
    joined: int = -1  # nodes in the round so far; -1: not readable
    joined_hosts: list[str] = field(default_factory=list)
    run_id: str = ""


def read_rendezvous(handler: Any) -> RendezvousView:
    """The handler's facts, each read guarded (torch's private state; the main thread changes it)."""
    view = RendezvousView()
    with contextlib.suppress(Exception):
        view.backend = str(handler.get_backend())
    with contextlib.suppress(Exception):  # c10d / etcd-v2: DynamicRendezvousHandler
        settings = handler.settings
        view.nodes_min, view.nodes_max, view.run_id = int(settings.min_nodes), int(settings.max_nodes), \
            str(settings.run_id)
    if not view.nodes_min:
        with contextlib.suppress(Exception):  # static: StaticTCPRendezvous
            view.nodes_min = view.nodes_max = int(handler.world_size)
            view.node_rank = int(handler.rank)
            view.run_id = str(handler.run_id)
    with contextlib.suppress(Exception):
        state = handler._state_holder.state
        participants = list(dict(state.participants))  # a copy first: the main thread replaces it on sync
        view.joined = len(participants)
        view.joined_hosts = sorted({str(node.addr) for node in participants})
    return view


class AgentReporter:
    """Agent spans while one node rendezvous runs (started by the wrapped `_rendezvous`)."""

    def __init__(self, handler: Any, interval_s: float, shipper: Any) -> None:
        self.handler = handler
        self.interval_s = interval_s
        self.shipper = shipper
        self.since_ns = time.time_ns()
        self.counter = 0
        self._last_ns = self.since_ns
        self._rng = random.Random()
        self._stop = threading.Event()
        # the step's nodes where srun started torchrun on each (the allocation's may be more)
        nodelist = next((os.environ[k] for k in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                         if os.environ.get(k)), "")
        self.expected_hosts = expand_hostlist(nodelist)[:1024]
        self._thread = threading.Thread(target=self._run, name="mycroft-agent", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        name_this_thread("mycroft-agent")
        while True:
            with contextlib.suppress(Exception):
                self._send(time.time_ns(), final=False)
            if self._stop.wait(self.interval_s):
                return

    def finish(self) -> None:
        """The rendezvous returned (completed or gave up): one last span, then quiet. Not flushed here:
        the launcher goes on at once (its process lives while its workers run; the shipper sends it)."""
        self._stop.set()
        self._thread.join(timeout=1.0)
        with contextlib.suppress(Exception):
            self._send(time.time_ns(), final=True)

    def _send(self, now: int, final: bool) -> None:
        view = read_rendezvous(self.handler)
        in_phase_s = max(0, now - self.since_ns) / 1e9
        attributes: dict[str, AttrValue] = {
            schema.ATTR_SPAN_KIND: schema.KIND_AGENT,
            schema.ATTR_HB_COUNTER: self.counter + 1,
            schema.ATTR_HB_INTERVAL_S: self.interval_s,
            schema.ATTR_HB_PHASE: schema.PHASE_NODE_RENDEZVOUS,
            schema.ATTR_HB_PHASE_S: round(in_phase_s, 3),
            schema.ATTR_AGENT_RDZV_BACKEND: view.backend,
            schema.ATTR_AGENT_NODES_MIN: view.nodes_min,
            schema.ATTR_AGENT_NODES_MAX: view.nodes_max,
            schema.ATTR_AGENT_NODES_JOINED: view.joined,
            schema.ATTR_AGENT_JOINED_HOSTS: view.joined_hosts[:1024],
        }
        if self.expected_hosts:
            attributes[schema.ATTR_AGENT_EXPECTED_HOSTS] = self.expected_hosts
        if final:
            attributes[schema.ATTR_HB_FINAL] = True
        self.counter += 1
        span = SpanRecord(trace_id=self._rng.getrandbits(128) or 1, span_id=self._rng.getrandbits(64) or 1,
                          name=schema.SPAN_AGENT, start_ns=self._last_ns, end_ns=now, attributes=attributes)
        self._last_ns = now
        self.shipper.submit([span], urgent=True)


def agent_resource(base: Resource | None, job_id: str, nproc: int, node_rank: int, slurm_job_id: str) -> Resource:
    attributes: dict[str, AttrValue] = {
        schema.RES_JOB_ID: job_id,
        **host_attributes(os.environ),
        schema.RES_PROCESS_PID: os.getpid(),
        schema.RES_SCHEMA_VERSION: schema.SCHEMA_VERSION,
        schema.RES_LAUNCHER: "torchrun",
    }
    if nproc > 0:
        attributes[schema.RES_LOCAL_WORLD_SIZE] = nproc
    if node_rank >= 0:
        attributes[schema.RES_NODE_RANK] = node_rank
    if slurm_job_id:
        attributes[schema.RES_SLURM_JOB_ID] = slurm_job_id
    return named_resource(base, attributes, job_id)


def _nproc(worker_group: Any) -> int:
    try:
        return int(worker_group.spec.local_world_size)
    except Exception:
        return 0


def wrap_rendezvous(original: Callable[..., Any], config: Any, base_resource: Resource | None, exporter: Any,
                    deliver: Any) -> Callable[..., Any]:
    """SimpleElasticAgent._rendezvous, reported while it waits for the other nodes (multi-node only)."""
    shippers: list[Any] = []  # one per agent process, made at its first multi-node rendezvous

    def _rendezvous(agent: Any, worker_group: Any) -> Any:
        reporter = None
        try:
            handler = worker_group.spec.rdzv_handler
            view = read_rendezvous(handler)
            if max(view.nodes_min, view.nodes_max) > 1:
                endpoint = f"{view.backend}:{endpoint_from_argv(getattr(sys, 'orig_argv', sys.argv))}"
                job_id = agent_job_id(os.environ, view.run_id, endpoint)
                os.environ.setdefault(ENV_JOB_ID, job_id)  # the workers inherit it: one job, agents and ranks
                if not shippers:
                    from mycroft.instrumentation.export import Shipper, exporter_from_env

                    resource = agent_resource(base_resource, job_id, _nproc(worker_group), view.node_rank,
                                              os.environ.get("SLURM_JOB_ID", ""))
                    sink = exporter if exporter is not None or deliver is not None else exporter_from_env()
                    shippers.append(Shipper(sink, resource, config.queue_size, config.export_batch,
                                            config.export_delay_s, deliver=deliver))
                reporter = AgentReporter(handler, config.heartbeat_interval_s, shippers[0])
        except Exception as exc:  # never into the launcher
            log.info("mycroft: no node rendezvous reports (%r)", exc)
        try:
            return original(agent, worker_group)
        finally:
            if reporter is not None:
                reporter.finish()

    return _rendezvous


def endpoint_from_argv(argv: Sequence[str]) -> str:
    """The rendezvous endpoint torchrun was given, as every node's command line says it (pure):
    --rdzv-endpoint, else --master-addr:--master-port (torchrun's defaults 127.0.0.1:29500); the first
    given wins (torchrun's options come before the training script's)."""
    given: dict[str, str] = {}
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        name = name.replace("_", "-")
        if name in ("--rdzv-endpoint", "--master-addr", "--master-port"):
            if not eq:
                value = argv[i + 1] if i + 1 < len(argv) else ""
            given.setdefault(name, value)
    if given.get("--rdzv-endpoint"):
        return given["--rdzv-endpoint"]
    return f"{given.get('--master-addr', '127.0.0.1')}:{given.get('--master-port', '29500')}"


def install(patcher: Any, config: Any, base_resource: Resource | None, exporter: Any, deliver: Any) -> bool:
    """Wrap the elastic agent's rendezvous when this process is torchrun's agent; whether it did."""
    if not is_launcher_agent(getattr(sys, "orig_argv", sys.argv)):
        return False
    try:
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    except Exception as exc:
        log.info("mycroft: torch's elastic agent unavailable (%r)", exc)
        return False
    patcher.replace(SimpleElasticAgent, "_rendezvous",
                    lambda original: wrap_rendezvous(original, config, base_resource, exporter, deliver))
    return True
