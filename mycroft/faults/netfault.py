"""Network-level faults: each rank in a network namespace of our own, links we can break.

    mycroft inject --fault linkdown --nproc 3      (root; uses `ip` and `tc`)
    mycroft inject --fault throttle --nproc 3

A bridge in the root namespace (10.<a>.<b>.1/24) joins one veth per rank; rank i lives
in namespace `mcf<id>r<i>` with address .10+i and runs its own torchrun (one node per
rank, static rendezvous on rank 0). The RCA service listens on the bridge address, so a
rank's telemetry shares its link with its collective traffic, as on a single-NIC host.

Faults, applied by the harness when the faulty rank reaches the step (it waits for the
harness' acknowledgement, so the onset is exact):
  linkdown  `ip link set <veth of rank r> down`: the rank is cut off. Expected verdict:
            a hang whose root cause is rank r, unreachable (`process_lost`).
  throttle  `tc qdisc ... tbf rate 2mbit` on both ends of rank r's veth: every collective
            through it slows down with normal arrival skew. Expected verdict: a slowdown
            rooted in communication (`communication`; gloo has no per-flow counters that
            would name the link).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .processes import job_env, kill_tree
from .scoring import score

NET_FAULTS = ("linkdown", "throttle")


def available() -> str | None:
    """Why network faults cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs the `{tool}` command"
    return None


def _ip(*args: str, ns: str | None = None) -> None:
    command = ["ip", *args] if ns is None else ["ip", "netns", "exec", ns, "ip", *args]
    subprocess.run(command, check=True, capture_output=True, text=True)


@dataclass
class Topology:
    tag: str
    subnet: str  # "10.a.b"
    nproc: int

    @property
    def bridge(self) -> str:
        return f"mcb{self.tag}"

    @property
    def gateway(self) -> str:
        return f"{self.subnet}.1"

    def ns(self, rank: int) -> str:
        return f"mcf{self.tag}r{rank}"

    def veth(self, rank: int) -> str:
        return f"mcv{self.tag}{rank}"

    def addr(self, rank: int) -> str:
        return f"{self.subnet}.{10 + rank}"


@contextlib.contextmanager
def topology(nproc: int) -> Iterator[Topology]:
    """Bridge + one namespace and veth per rank; everything is removed on exit."""
    tag = uuid.uuid4().hex[:5]
    n = int(tag, 16)
    topo = Topology(tag=tag, subnet=f"10.{100 + n % 100}.{n // 100 % 250}", nproc=nproc)
    try:
        _ip("link", "add", topo.bridge, "type", "bridge")
        _ip("addr", "add", f"{topo.gateway}/24", "dev", topo.bridge)
        _ip("link", "set", topo.bridge, "up")
        for rank in range(nproc):
            ns, veth = topo.ns(rank), topo.veth(rank)
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", topo.bridge)
            _ip("link", "set", veth, "up")
            _ip("addr", "add", f"{topo.addr(rank)}/24", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
        yield topo
    finally:
        for rank in range(nproc):
            subprocess.run(["ip", "netns", "del", topo.ns(rank)], capture_output=True)
            subprocess.run(["ip", "link", "del", topo.veth(rank)], capture_output=True)
        subprocess.run(["ip", "link", "del", topo.bridge], capture_output=True)


def apply(topo: Topology, fault: str, rank: int) -> None:
    veth = topo.veth(rank)
    if fault == "linkdown":
        _ip("link", "set", veth, "down")
    elif fault == "throttle":
        tbf = ["tbf", "rate", "2mbit", "burst", "16kbit", "latency", "2s"]
        subprocess.run(["tc", "qdisc", "add", "dev", veth, "root", *tbf], check=True, capture_output=True)
        subprocess.run(["ip", "netns", "exec", topo.ns(rank), "tc", "qdisc", "add", "dev", "eth0", "root", *tbf],
                       check=True, capture_output=True)
    else:
        raise ValueError(f"unknown network fault {fault!r}")


def launch(topo: Topology, rca_grpc: str, job: str, fault_rank: int, step: int, steps: int, work: str,
           heartbeat: float, step_s: float, log_path: str) -> list[subprocess.Popen[bytes]]:
    """One torchrun per namespace (one node per rank)."""
    bin_dir = Path(sys.executable).parent
    master_port = 29500 + int(topo.tag, 16) % 20000
    procs = []
    for rank in range(topo.nproc):
        env = job_env(rca_grpc, job, "external", fault_rank, step, steps, os.path.join(work, "onset.json"),
                      heartbeat, step_s)
        env.update(GLOO_SOCKET_IFNAME="eth0", MYCROFT_FAULT_ACK_FILE=os.path.join(work, "ack"),
                   MYCROFT_FAULT_NUMEL="8192")
        command = ["ip", "netns", "exec", topo.ns(rank), str(bin_dir / "opentelemetry-instrument"),
                   str(bin_dir / "torchrun"), "--nnodes", str(topo.nproc), "--node-rank", str(rank),
                   "--nproc-per-node", "1", "--master-addr", topo.addr(0), "--master-port", str(master_port),
                   "--monitor-interval", "0.1", "-m", "mycroft.faults.faultjob"]
        with open(f"{log_path}.{rank}", "wb") as log:
            procs.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
    return procs


def run_net(rca: Any, fault: str, nproc: int, rank: int, step: int, heartbeat: float, step_s: float,
            timeout_s: float, log_dir: str | None, result: Any, topo: Topology) -> Any:
    """Like inject.run_one, for a network fault on an existing topology; fills `result`."""
    work = tempfile.mkdtemp(prefix="mycroft-netfault-")
    log_path = os.path.join(log_dir or work, f"{result.job}.log")
    procs = launch(topo, rca.otlp_grpc, result.job, rank, step, step + 100_000, work, heartbeat, step_s,
                   log_path)
    try:
        request = os.path.join(work, "onset.json")
        deadline = time.time() + 180
        while not os.path.exists(request):
            if time.time() > deadline or all(p.poll() is not None for p in procs):
                result.note = f"no onset; see {log_path}.*"
                return result
            time.sleep(0.05)
        apply(topo, fault, rank)
        result.onset = time.time()
        Path(os.path.join(work, "ack")).write_text(json.dumps({"onset": result.onset}))
        deadline = result.onset + timeout_s
        while time.time() < deadline:
            incident, correct, before = score(fault, rank, result.onset, rca.incidents(result.job))
            if incident is not None:
                result.correct, result.false_alarms, result.incident = correct, before, incident
                result.detection_s = incident["detected_at_unix"] - result.onset
                rc_at = incident.get("root_cause_at_unix")
                result.root_cause_s = rc_at - result.onset if rc_at else None
                top = incident["root_causes"][0]
                result.note = f"{incident['kind']}: rank {top['rank']} {top['kind']}"
                return result
            time.sleep(0.1)
        result.note = f"no incident within {timeout_s:g}s of onset; see {log_path}.*"
        return result
    finally:
        for proc in procs:
            kill_tree(proc)
        shutil.rmtree(work, ignore_errors=True)
