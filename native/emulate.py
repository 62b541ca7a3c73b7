"""Emulated NCCL: the profiler call sequence of a ring all-reduce, with injectable flow stalls.

No GPU and no NCCL are needed: each emulated rank is one process running the C test
driver (native/test/driver.c), which dlopens the plugin and replays a script of
startEvent / recordEventState / stopEvent calls through the exported ncclProfiler_vN
table, exactly the calls NCCL's proxy thread makes for the NET transport.

Stall model (per channel of a ring): rank r's recv of step s needs rank r-1's send of
step s completed; rank r's send of step s+1 needs its own recv of step s (the ring
forwards what it receives). A fault pins one send flow; the fixpoint of those two
rules gives every other flow's stop point, so knock-on stalls look like NCCL's.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mycroft.native import BUILD_DIR, library_path

DRIVER = BUILD_DIR / "driver"

# recordEventState states (NCCL's numbering)
SEND_GPU_WAIT, SEND_WAIT, RECV_WAIT, RECV_FLUSH_WAIT, RECV_GPU_WAIT = 8, 9, 10, 11, 12
SEND_PEER_WAIT, KERNEL_CH_STOP = 20, 22

FAULT_GPU = "gpu"  # the sender's GPU never produces step k: stuck in SendGPUWait
FAULT_NETWORK = "network"  # step k is posted to the network, never completes: stuck in SendWait
FAULT_PROXY = "proxy"  # the sender's proxy never posts step k (k=0: the flow never starts)
FAULT_KINDS = (FAULT_GPU, FAULT_NETWORK, FAULT_PROXY)


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    rank: int
    channel: int
    step: int


def stop_points(nranks: int, steps: int, fault: Fault | None) -> dict[int, tuple[int, int]]:
    """rank -> (sends completed, recvs completed) on the faulty channel (steps when no fault)."""
    send = [steps] * nranks
    recv = [steps] * nranks
    if fault is None:
        return {r: (steps, steps) for r in range(nranks)}
    changed = True
    while changed:
        changed = False
        for r in range(nranks):
            new_recv = min(recv[r], send[(r - 1) % nranks])
            new_send = min(send[r], new_recv + 1, steps)
            if r == fault.rank:
                new_send = min(new_send, fault.step)
            if (new_send, new_recv) != (send[r], recv[r]):
                send[r], recv[r] = new_send, new_recv
                changed = True
    return {r: (send[r], recv[r]) for r in range(nranks)}


@dataclass(slots=True)
class Script:
    """Builds one emulated rank's driver script; handles are allocated as it goes."""

    lines: list[str] = field(default_factory=list)
    next_handle: int = 1

    def handle(self) -> int:
        self.next_handle += 1
        return self.next_handle - 1

    def add(self, *parts: object) -> None:
        self.lines.append(" ".join(str(p) for p in parts))

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def ring_allreduce(script: Script, ctx: int, rank: int, nranks: int, seq: int, channels: int, steps: int,
                   fault: Fault | None = None, chunk: int = 1 << 17, count: int = 1 << 22) -> None:
    """Append the calls NCCL's profiler sees on `rank` for one ring all-reduce."""
    nxt, prv = (rank + 1) % nranks, (rank - 1) % nranks
    stops = stop_points(nranks, steps, fault)
    coll = script.handle()
    script.add("coll", coll, ctx, seq, "AllReduce", count, "ncclFloat32", channels, "RING", "SIMPLE")
    kch: dict[int, int] = {}
    send_op: dict[int, int] = {}
    recv_op: dict[int, int] = {}
    for ch in range(channels):
        kch[ch] = script.handle()
        script.add("kch", kch[ch], ctx, coll, ch, 1_000_000 * seq + ch)
        send_op[ch] = script.handle()
        script.add("op", send_op[ch], ctx, coll, ch, nxt, steps, chunk, 1)
        recv_op[ch] = script.handle()
        script.add("op", recv_op[ch], ctx, coll, ch, prv, steps, chunk, 0)
    script.add("stop", coll)  # enqueued; completion comes from the proxy side
    limits = {ch: stops[rank] if fault is not None and ch == fault.channel else (steps, steps)
              for ch in range(channels)}
    faulty_here = fault is not None and fault.rank == rank
    for s in range(steps):
        for ch in range(channels):
            send_done, recv_done = limits[ch]
            if s < send_done:
                h = script.handle()
                script.add("step", h, ctx, send_op[ch], s)
                script.add("rec", h, SEND_GPU_WAIT)
                script.add("rec", h, SEND_PEER_WAIT)
                script.add("rec", h, SEND_WAIT, chunk)
                script.add("stop", h)
            elif s == send_done:
                pinned = faulty_here and fault is not None and ch == fault.channel
                if pinned and fault is not None and fault.kind == FAULT_PROXY:
                    pass  # the proxy never posts this step
                else:
                    h = script.handle()
                    script.add("step", h, ctx, send_op[ch], s)
                    script.add("rec", h, SEND_GPU_WAIT)
                    if pinned and fault is not None and fault.kind == FAULT_NETWORK:
                        script.add("rec", h, SEND_PEER_WAIT)
                        script.add("rec", h, SEND_WAIT, chunk)
            if s < recv_done:
                h = script.handle()
                script.add("step", h, ctx, recv_op[ch], s)
                script.add("rec", h, RECV_WAIT)
                script.add("rec", h, RECV_FLUSH_WAIT, chunk)
                script.add("rec", h, RECV_GPU_WAIT)
                script.add("stop", h)
            elif s == recv_done:
                h = script.handle()
                script.add("step", h, ctx, recv_op[ch], s)
                script.add("rec", h, RECV_WAIT)
    for ch in range(channels):
        send_done, recv_done = limits[ch]
        if send_done >= steps:
            script.add("stop", send_op[ch])
        if recv_done >= steps:
            script.add("stop", recv_op[ch])
        if send_done >= steps and recv_done >= steps:
            script.add("rec", kch[ch], KERNEL_CH_STOP, 1_000_000 * seq + ch + 500)
            script.add("stop", kch[ch])


def job_scripts(nranks: int, channels: int, steps: int, fault: Fault | None, comm_hash: int = 0x5EED0001,
                clean_first: bool = True) -> list[str]:
    """One script per rank: (a clean all-reduce, seq 0, then) the possibly faulty one; pause; finalize."""
    out = []
    for rank in range(nranks):
        script = Script()
        script.add("init", 0, f"{comm_hash:x}", rank, nranks, 1, "ring")
        seq = 0
        if clean_first:
            ring_allreduce(script, 0, rank, nranks, seq, channels, steps)
            seq += 1
            script.add("sleep", 40)  # past the linger period: the clean collective is retired
        ring_allreduce(script, 0, rank, nranks, seq, channels, steps, fault)
        script.add("pause")  # flush, print READY, wait: the stall is now visible in the ring
        script.add("fin", 0)  # finalize with the stalled events still open
        out.append(script.text())
    return out


INTRA_GPU = "gpu"  # the stalled rank enqueued the collective, its kernel never starts (GPU busy)
INTRA_HOST = "host"  # the stalled rank never hands the collective to NCCL
INTRA_TRANSPORT = "transport"  # every kernel starts, no channel finishes (NVLink / P2P / SHM stuck)


def intra_node_allreduce(script: Script, ctx: int, rank: int, seq: int, channels: int,
                         stall: str | None = None, stalled_rank: int = -1) -> None:
    """What NCCL's profiler sees for an all-reduce on one node without the network transport:
    the Coll and one KernelCh per channel, no ProxyOp / ProxyStep (nccl#1623, #1765)."""
    if stall == INTRA_HOST and rank == stalled_rank:
        return
    coll = script.handle()
    script.add("coll", coll, ctx, seq, "AllReduce", 1 << 20, "ncclFloat32", channels, "RING", "LL")
    script.add("stop", coll)
    if stall == INTRA_GPU and rank == stalled_rank:
        return
    kchs = []
    for ch in range(channels):
        kchs.append(script.handle())
        script.add("kch", kchs[-1], ctx, coll, ch, 1_000_000 * seq + ch)
    if stall is not None:  # the others wait inside the kernel for the stalled rank (or for the transport)
        return
    for ch, h in enumerate(kchs):
        script.add("rec", h, KERNEL_CH_STOP, 1_000_000 * seq + ch + 700)
        script.add("stop", h)


def intra_node_scripts(nranks: int, channels: int, stall: str | None, stalled_rank: int = -1,
                       comm_hash: int = 0x1A7A0001) -> list[str]:
    """One script per rank: a clean all-reduce (seq 0), then seq 1 with the stall; pause; finalize."""
    out = []
    for rank in range(nranks):
        script = Script()
        script.add("init", 0, f"{comm_hash:x}", rank, nranks, 1, "intra")
        intra_node_allreduce(script, 0, rank, 0, channels)
        script.add("sleep", 40)
        intra_node_allreduce(script, 0, rank, 1, channels, stall, stalled_rank)
        script.add("sleep", 60)  # older than half a snapshot interval: in-flight snapshots include it
        script.add("pause")
        script.add("fin", 0)
        out.append(script.text())
    return out


@dataclass(slots=True)
class RankProcess:
    rank: int
    proc: subprocess.Popen[str]
    ring: Path


def driver_env(ring_dir: str | os.PathLike[str], extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["MYCROFT_NATIVE_RING_DIR"] = str(ring_dir)
    env.update(extra or {})
    return env


def start_rank(script_path: Path, rank: int, ring_dir: str | os.PathLike[str], version: str = "v6",
               driver: Path = DRIVER, library: Path | None = None,
               env: dict[str, str] | None = None) -> RankProcess:
    """Launch one emulated rank and wait until its stall is published (its READY line)."""
    proc = subprocess.Popen(
        [str(driver), "replay", str(library or library_path()), version, str(script_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=driver_env(ring_dir, env),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise RuntimeError(f"emulated rank {rank} failed before its stall: {line!r} {err}")
    return RankProcess(rank, proc, Path(line.split(" ", 1)[1].strip()))


def finish_rank(rank: RankProcess, timeout: float = 20.0) -> str:
    """Let a paused rank finalize and exit; returns its stderr (raises on a non-zero exit)."""
    out, err = rank.proc.communicate("go\n", timeout=timeout)
    if rank.proc.returncode != 0:
        raise RuntimeError(f"emulated rank {rank.rank} exited {rank.proc.returncode}: {out} {err}")
    return err


@contextmanager
def emulated_job(workdir: Path, nranks: int, channels: int, steps: int, fault: Fault | None,
                 version: str = "v6", driver: Path = DRIVER, library: Path | None = None,
                 versions: Sequence[str] | None = None,
                 scripts: Sequence[str] | None = None) -> Iterator[list[RankProcess]]:
    """All ranks of a ring all-reduce job (or of `scripts`), paused at their stall points; finalized on exit."""
    ranks: list[RankProcess] = []
    try:
        for rank, text in enumerate(scripts if scripts is not None else job_scripts(nranks, channels, steps, fault)):
            path = workdir / f"rank{rank}.script"
            path.write_text(text)
            ver = versions[rank % len(versions)] if versions else version
            ranks.append(start_rank(path, rank, workdir, ver, driver, library))
        yield ranks
    finally:
        for r in ranks:
            if r.proc.poll() is None:
                try:
                    finish_rank(r)
                except Exception:
                    r.proc.kill()
                    r.proc.wait()
