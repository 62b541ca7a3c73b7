"""What NCCL can throw at the plugin besides the happy path, and `mycroft native dump`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mycroft.instrumentation.native_reader import NativeReader
from mycroft.native import ring as ringmod
from mycroft.native.cli import main as native_main
from mycroft.native.emulate import DRIVER

from mycroft import schema

JOB = "job-edges"

# Two communicators in one process, a PXN proxy op, an orphan, p2p, NULL handles handed
# back, a kernel channel; then comm B is finalized with events open.
EDGES = """
init 0 aaaa 0 2 1 commA
init 1 bbbb 1 4 1 commB
coll 1 0 0 AllReduce 1024 ncclFloat32 2 RING LL
coll 2 1 0 AllGather 1024 ncclBfloat16 1 RING LL128
op 3 0 foreign 0 1 2 4096 1 other
step 4 0 3 0
rec 4 8
rec 4 9 4096
stop 4
stop 3
op 5 1 - 0 2 1 4096 0
p2p 6 1 Send 3 100 ncclInt8 1
op 7 1 6 0 3 1 100 1
step 8 1 7 0
rec 8 8
rec 8 20
rec 8 9 100
stop 8
stop 7
stop 6
p2p 9 1 Send 3 100 ncclInt8 1
stop 9
p2p 11 1 Recv 3 100 ncclInt8 1
stop 11
rec 100 8
stop 100
step 101 0 100 0
expect_null 101
rec 101 9 10
stop 101
kch 10 0 1 0 12345
rec 10 22 23456
stop 10
stop 1
stop 2
sleep 40
flush
fin 1
fin 0
"""


def _replay(script: str, tmp: Path, version: str = "v6", env: dict[str, str] | None = None,
            driver: Path = DRIVER, library: Path | None = None) -> subprocess.CompletedProcess[str]:
    path = tmp / "edges.script"
    path.write_text(script)
    from mycroft.native import library_path

    return subprocess.run([str(driver), "replay", str(library or library_path()), version, str(path)],
                          capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=60)


def _pid_of(result: subprocess.CompletedProcess[str], ring_dir: Path) -> int:
    assert result.returncode == 0, result.stderr
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("DONE "))
    path = Path(line.split(" ", 1)[1])
    assert path.parent == ring_dir
    return int(path.name[len(ringmod.FILE_PREFIX):])


def test_edge_cases_through_every_version(built: Path, ring_dir: Path, tmp_path: Path) -> None:
    for version in ("v4", "v5", "v6"):
        pid = _pid_of(_replay(EDGES, tmp_path, version), ring_dir)
        reader = NativeReader.open_for_pid(pid, JOB, 1, ring_dir=ring_dir)
        assert reader is not None
        spans = reader.drain()
        by_kind: dict[str, list] = {}
        for s in spans:
            by_kind.setdefault(s.attributes[schema.ATTR_SPAN_KIND], []).append(s)
        colls = {s.attributes[schema.ATTR_NCCL_FUNC]: s for s in by_kind[schema.KIND_NATIVE_COLL]}
        # several communicators: each collective in its own communicator's trace
        assert colls["AllReduce"].trace_id == schema.collective_trace_id(JOB, f"nccl:{0xaaaa:016x}", 0)
        assert colls["AllGather"].trace_id == schema.collective_trace_id(JOB, f"nccl:{0xbbbb:016x}", 0)
        assert colls["AllGather"].attributes[schema.ATTR_BYTES] == 2048
        assert colls["AllReduce"].attributes[schema.ATTR_STATE] == schema.STATE_COMPLETED
        # p2p: per-peer, per-direction sequence; the flow joins its p2p span
        sends = sorted((s for s in by_kind[schema.KIND_NATIVE_COLL] if s.attributes[schema.ATTR_NCCL_FUNC] == "Send"),
                       key=lambda s: s.attributes[schema.ATTR_SEQ])
        assert [s.attributes[schema.ATTR_SEQ] for s in sends] == [0, 1]
        assert sends[0].trace_id == schema.p2p_trace_id(JOB, f"nccl:{0xbbbb:016x}", 1, 3, 0)
        recv = colls["Recv"]
        assert recv.trace_id == schema.p2p_trace_id(JOB, f"nccl:{0xbbbb:016x}", 3, 1, 0)
        flows = by_kind[schema.KIND_NATIVE_FLOW]
        p2p_flow = [f for f in flows if f.trace_id == sends[0].trace_id]
        assert len(p2p_flow) == 1 and p2p_flow[0].parent_span_id == sends[0].span_id
        assert p2p_flow[0].attributes[schema.ATTR_FLOW_TRANSMITTED] == 1
        # PXN: the foreign parentObj was never dereferenced; the flow stands alone
        pxn = [f for f in flows if f.attributes[schema.ATTR_NCCL_PXN]]
        assert len(pxn) == 1 and pxn[0].parent_span_id == 0 and schema.ATTR_SEQ not in pxn[0].attributes
        assert pxn[0].attributes[schema.ATTR_NCCL_PID] == pid + 100000
        assert pxn[0].attributes[schema.ATTR_FLOW_DONE] == 1
        # orphan (NULL parent), finalized while open
        orphan = [f for f in flows if not f.attributes[schema.ATTR_NCCL_PXN] and f.parent_span_id == 0]
        assert len(orphan) == 1 and orphan[0].attributes[schema.ATTR_STATE] == schema.STATE_IN_FLIGHT
        kch = by_kind[schema.KIND_NATIVE_KERNEL_CHANNEL]
        assert len(kch) == 1 and kch[0].parent_span_id == colls["AllReduce"].span_id
        assert kch[0].attributes[schema.ATTR_NCCL_GPU_STOP_NS] == 23456
        assert reader.dropped() == 0
        reader.close()
        assert not ringmod.ring_path(pid, ring_dir).exists()


def test_full_pools_return_null_handles_and_count_them(built: Path, ring_dir: Path, tmp_path: Path) -> None:
    lines = ["init 0 cccc 0 2 1 tiny", "coll 1 0 0 AllReduce 8 ncclFloat32 1 RING LL"]
    lines += [f"op {10 + i} 0 1 0 1 1 8 1" for i in range(8)]
    lines += [f"expect_handle {10 + i}" for i in range(4)] + [f"expect_null {10 + i}" for i in range(4, 8)]
    lines += [f"step {20 + i} 0 {10 + i} 0\nrec {20 + i} 9 8\nstop {20 + i}\nstop {10 + i}" for i in range(8)]
    lines += ["stop 1", "sleep 30", "fin 0"]
    result = _replay("\n".join(lines) + "\n", tmp_path, env={"MYCROFT_NATIVE_POOL_FLOWS": "4"})
    pid = _pid_of(result, ring_dir)
    with ringmod.Ring(ringmod.ring_path(pid, ring_dir)) as ring:
        assert ring.counters()["dropped_events"] == 4
        kinds = [r.kind for r in ring.consume()]
        assert kinds.count(ringmod.REC_FLOW_DONE) == 4 and kinds.count(ringmod.REC_COLL_DONE) == 1


def test_full_ring_drops_and_counts_never_blocks(built: Path, ring_dir: Path, tmp_path: Path) -> None:
    lines = ["init 0 dddd 0 2 1 small"]
    for i in range(200):
        lines += [f"coll {i + 1} 0 {i} AllReduce 8 ncclFloat32 1 RING LL", f"stop {i + 1}"]
    lines += ["sleep 30", "flush", "fin 0"]
    pid = _pid_of(_replay("\n".join(lines) + "\n", tmp_path, env={"MYCROFT_NATIVE_RING_RECORDS": "64"}), ring_dir)
    with ringmod.Ring(ringmod.ring_path(pid, ring_dir)) as ring:
        counters = ring.counters()
        assert counters["total_records"] == 64 and counters["dropped_records"] == 200 + 2 - 64
        assert len(ring.consume()) == 64


def test_dump_prints_a_crashed_process_ring_as_json_lines(built: Path, ring_dir: Path, tmp_path: Path,
                                                          capsys) -> None:
    script = EDGES.replace("fin 1\nfin 0\n", "op 50 0 1 1 1 4 4096 1\nstep 51 0 50 0\nrec 51 8\ncrash\n")
    result = _replay(script, tmp_path)
    assert result.returncode == 0
    pid = int(next(ring_dir.glob("mycroft-nccl-*")).name.rsplit("-", 1)[1])
    assert native_main(["dump", str(pid), "--ring-dir", str(ring_dir), "--header"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["kind"] == "header" and lines[0]["alive"] is False and lines[0]["finalized"] == 0
    records = lines[1:]
    for rec in records:
        assert {"kind", "comm", "seq", "channel", "peer"} <= set(rec)
    # the flow left open by the crash is in the last snapshot, with its counters
    open_flows = [r for r in records if r["kind"] == "flow" and r["channel"] == 1]
    assert open_flows and open_flows[-1] | {"posted": 1, "gpu_ready": 0, "transmitted": 0, "done": 0} == open_flows[-1]
    assert {"comm", "coll_done", "flow_done", "p2p_done", "kernel_channel"} <= {r["kind"] for r in records}
    # a live reader can still drain it afterwards; dump did not consume anything
    reader = NativeReader.open_for_pid(pid, JOB, 0, ring_dir=ring_dir)
    assert reader is not None and reader.drain()
    hb = reader.heartbeat_attributes()
    # the crash left two flows open: the orphan (nothing recorded yet) and the one in SendGPUWait
    assert sorted(hb[schema.ATTR_HB_FLOW_PROXY_STATES]) == ["", "SendGPUWait"]
    reader.close()
    assert native_main(["dump", str(pid), "--ring-dir", str(ring_dir)]) == 1  # drained ring of a dead pid: gone


def test_cli_path_and_dispatcher(built: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "mycroft.cli", "native", "path"], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert Path(out).is_absolute() and Path(out) == built and Path(out).is_file()


def test_cli_clean_removes_only_dead_processes_rings(ring_dir: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    monkeypatch.setenv("MYCROFT_NATIVE_RING_FALLBACK_DIR", str(fallback))
    (ring_dir / f"mycroft-nccl-{os.getpid()}").write_bytes(b"x")
    (ring_dir / "mycroft-nccl-999999999").write_bytes(b"x")
    (fallback / "mycroft-nccl-999999998").write_bytes(b"x")  # a ring that went to the fallback dir
    assert native_main(["clean", "--ring-dir", str(ring_dir)]) == 0
    assert [p.name for p in ring_dir.iterdir()] == [f"mycroft-nccl-{os.getpid()}"]
    assert list(fallback.iterdir()) == [] and "removed 2 ring(s)" in capsys.readouterr().out
