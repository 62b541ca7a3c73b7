"""NCCL-side hazards the plugin must survive, each replayed through the emulated driver:
a full pool (#1544), another rank's context (#1586), ProxyStep starts and stops that do not
match (#1658), a KernelCh stop that came before its start (PR #2221), no room in /dev/shm
(PR #2326)."""

from __future__ import annotations

import json
from pathlib import Path

from mycroft.instrumentation.native_reader import NativeReader
from mycroft.native import BUILD_DIR
from mycroft.native import ring as ringmod

from mycroft import schema

from .conftest import make
from .test_edges import _pid_of, _replay

JOB = "job-hazards"

# #1544: NCCL starts no children under a NULL parent. With room for 4 collectives, the 5th and 6th
# get the overflow handle instead: their flows still come, as orphans, with their counters.
POOL_FULL = "init 0 1544 0 2 1 full\n" + "".join(
    f"coll {c} 0 {c} AllReduce 8 ncclFloat32 1 RING LL\nexpect_handle {c}\n"
    f"op {10 + c} 0 {c} 0 1 1 8 1\nexpect_handle {10 + c}\nstep {20 + c} 0 {10 + c} 0\n"
    f"rec {20 + c} 8\nrec {20 + c} 9 8\nstop {20 + c}\nstop {10 + c}\nstop {c}\n" for c in range(1, 7)
) + "sleep 30\nflush\nfin 0\n"

# #1586: with PXN NCCL can hand the proxy-side callbacks another rank's context (an address from
# another process): a KernelCh and a ProxyOp under one are dropped, counted, never dereferenced.
# Under PXN the task handle a KernelCh names as its parent can be another process's too (an
# unmapped address here): never read, the channel is an orphan.
FOREIGN_CTX = "init 0 1586 0 2 1 ctx\nbadctx 1\nexpect_null 1\ncoll 2 0 0 AllReduce 8 ncclFloat32 1 RING LL\n" \
              "kch 3 0 foreign 0 77\nrec 3 22 78\nstop 3\nstop 2\nsleep 30\nfin 0\n"

# #1658: a step stopped twice, a step started again before its stop, a stop for a step never
# started (NULL handle), a step never stopped; the flow's counters stay consistent.
STEPS_MISMATCH = """
init 0 1658 0 2 1 steps
coll 1 0 0 AllReduce 8 ncclFloat32 1 RING LL
op 2 0 1 0 1 4 8 1
step 3 0 2 0
rec 3 8
rec 3 9 8
stop 3
stop 3
step 4 0 2 1
rec 4 8
step 5 0 2 1
rec 5 9 8
stop 5
stop 99
step 6 0 2 2
rec 6 8
stop 2
stop 1
sleep 30
flush
fin 0
"""

# PR #2221: the stop of collective 0's kernel channel was processed before its start, so the
# channel that starts never stops; collective 1's channel on the same channel id does.
KCH_STOP_FIRST = """
init 0 2221 0 2 1 kch
coll 1 0 0 AllReduce 8 ncclFloat32 1 RING LL
stop 100
kch 2 0 1 0 1000
stop 1
coll 3 0 1 AllReduce 8 ncclFloat32 1 RING LL
kch 4 0 3 0 2000
rec 4 22 2100
stop 4
stop 3
sleep 40
flush
sleep 20
flush
fin 0
"""


def _drain(pid: int, ring_dir: Path) -> tuple[list, dict[str, int]]:
    path = ringmod.find_ring(pid, ring_dir)
    with ringmod.Ring(path, writable=False) as ring:
        counters = ring.counters()
    reader = NativeReader.open_for_pid(pid, JOB, 0, ring_dir=ring_dir)
    assert reader is not None
    spans = reader.drain()
    reader.close()
    return spans, counters


def _kind(spans: list, kind: str) -> list:
    return [s for s in spans if s.attributes[schema.ATTR_SPAN_KIND] == kind]


def test_full_coll_pool_still_lets_nccl_start_the_children(built: Path, ring_dir: Path, tmp_path: Path) -> None:
    pid = _pid_of(_replay(POOL_FULL, tmp_path, "v6", env={"MYCROFT_NATIVE_POOL_COLLS": "4"}), ring_dir)
    spans, counters = _drain(pid, ring_dir)
    assert counters["dropped_events"] == 2
    assert len(_kind(spans, schema.KIND_NATIVE_COLL)) == 4
    flows = _kind(spans, schema.KIND_NATIVE_FLOW)
    assert len(flows) == 6
    orphans = [f for f in flows if f.parent_span_id == 0]
    assert len(orphans) == 2 and all(schema.ATTR_SEQ not in f.attributes for f in orphans)
    assert all(f.attributes[schema.ATTR_FLOW_TRANSMITTED] == 1 and f.attributes[schema.ATTR_FLOW_DONE] == 1
               for f in flows)


def test_another_ranks_context_is_never_dereferenced(built: Path, ring_dir: Path, tmp_path: Path) -> None:
    pid = _pid_of(_replay(FOREIGN_CTX, tmp_path, "v6"), ring_dir)
    spans, counters = _drain(pid, ring_dir)
    assert counters["foreign_events"] == 2 and counters["dropped_events"] == 0
    assert [s.attributes[schema.ATTR_SEQ] for s in _kind(spans, schema.KIND_NATIVE_COLL)] == [0]
    (kch,) = _kind(spans, schema.KIND_NATIVE_KERNEL_CHANNEL)
    assert kch.parent_span_id == 0 and schema.ATTR_SEQ not in kch.attributes  # the foreign parent: an orphan


def test_mismatched_proxy_step_starts_and_stops(built: Path, ring_dir: Path, tmp_path: Path) -> None:
    pid = _pid_of(_replay(STEPS_MISMATCH, tmp_path, "v6"), ring_dir)
    spans, _ = _drain(pid, ring_dir)
    (flow,) = _kind(spans, schema.KIND_NATIVE_FLOW)
    a = flow.attributes
    posted, ready, sent, done = (a[schema.ATTR_FLOW_POSTED], a[schema.ATTR_FLOW_GPU_READY],
                                 a[schema.ATTR_FLOW_TRANSMITTED], a[schema.ATTR_FLOW_DONE])
    assert (posted, sent, done) == (4, 2, 2)  # step 1 started twice counts twice as posted, once done
    assert done <= sent <= ready <= posted
    assert a[schema.ATTR_STATE] == schema.STATE_COMPLETED
    (coll,) = _kind(spans, schema.KIND_NATIVE_COLL)
    assert coll.attributes[schema.ATTR_STATE] == schema.STATE_COMPLETED


def test_kernel_channel_stop_before_start_is_retired_stale(built: Path, ring_dir: Path, tmp_path: Path) -> None:
    pid = _pid_of(_replay(KCH_STOP_FIRST, tmp_path, "v6"), ring_dir)
    spans, _ = _drain(pid, ring_dir)
    kchs = {s.attributes[schema.ATTR_NCCL_GPU_START_NS]: s for s in _kind(spans, schema.KIND_NATIVE_KERNEL_CHANNEL)}
    stale, fine = kchs[1000], kchs[2000]
    assert stale.attributes[schema.ATTR_NCCL_STALE] is True and stale.status_code == 2
    assert schema.ATTR_NCCL_STALE not in fine.attributes
    # both collectives complete: the lost stop does not hold collective 0 open until finalize
    colls = {s.attributes[schema.ATTR_SEQ]: s for s in _kind(spans, schema.KIND_NATIVE_COLL)}
    assert {seq: s.attributes[schema.ATTR_STATE] for seq, s in colls.items()} == {
        0: schema.STATE_COMPLETED, 1: schema.STATE_COMPLETED}


def test_without_the_stale_rule_the_lost_stop_would_read_as_a_hang(built: Path, ring_dir: Path,
                                                                    tmp_path: Path) -> None:
    """Control: with no later channel finishing on it, the open channel stays in flight."""
    script = KCH_STOP_FIRST.replace("kch 4 0 3 0 2000", "kch 4 0 3 1 2000")  # another channel id
    pid = _pid_of(_replay(script, tmp_path, "v6"), ring_dir)
    spans, _ = _drain(pid, ring_dir)
    colls = {s.attributes[schema.ATTR_SEQ]: s for s in _kind(spans, schema.KIND_NATIVE_COLL)}
    assert colls[0].attributes[schema.ATTR_STATE] == schema.STATE_IN_FLIGHT  # closed by finalize


def test_ring_dir_unusable_falls_back_then_to_memory(built: Path, ring_dir: Path, tmp_path: Path,
                                                     monkeypatch) -> None:
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    monkeypatch.setenv("MYCROFT_NATIVE_RING_FALLBACK_DIR", str(fallback))
    script = "init 0 2326 0 2 1 shm\ncoll 1 0 0 AllReduce 8 ncclFloat32 1 RING LL\nstop 1\nsleep 30\nfin 0\n"
    missing = str(tmp_path / "no" / "shm")
    result = _replay(script, tmp_path, "v7", env={"MYCROFT_NATIVE_RING_DIR": missing})
    assert result.returncode == 0, result.stderr
    path = Path(result.stdout.split("DONE ", 1)[1].strip())
    assert path.parent == fallback
    pid = int(path.name.rsplit("-", 1)[1])
    reader = NativeReader.open_for_pid(pid, JOB, 0, ring_dir=missing)  # finds it in the fallback dir
    assert reader is not None and len(_kind(reader.drain(), schema.KIND_NATIVE_COLL)) == 1
    reader.close()
    # neither directory usable: records stay in memory, the plugin (and a chained one) keep running
    make("chain")
    counts = tmp_path / "counts.json"
    result = _replay(script, tmp_path, "v7", env={
        "MYCROFT_NATIVE_RING_DIR": missing, "MYCROFT_NATIVE_RING_FALLBACK_DIR": missing,
        "MYCROFT_NCCL_PROFILER_CHAIN": str(BUILD_DIR / "libchain_counter.so"), "CHAIN_COUNTER_OUT": str(counts)})
    assert result.returncode == 0 and result.stdout.strip() == "DONE", result.stdout + result.stderr
    assert json.loads(counts.read_text())["starts"] == {"2": 1}
