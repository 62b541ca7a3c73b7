"""NCCL 2.31's profiler v7 through the emulated driver: symmetric-kernel collectives with a user
tag, kernel phases, copy-engine collectives; and the event mask each NCCL version gets."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from mycroft.instrumentation.native_reader import NativeReader
from mycroft.native import ring as ringmod

from mycroft import schema

from .test_edges import _pid_of, _replay

JOB = "job-v7"
COMM = 0x7777

# One rank of a 2-rank communicator on NCCL 2.31: a symmetric all-reduce with a tag, its kernel
# channel with the three phases NCCL fires before the channel's stop, a tagged send (with its
# kernel channel), and a copy-engine all-gather (CeColl: start at launch, stop once enqueued).
V7 = f"""
init 0 {COMM:x} 0 2 1 sym
collx 1 0 0 AllReduce 1024 ncclBfloat16 4 NVLS SIMPLE 0xfeed 1 AllReduce_AGxLL_R
kch 2 0 1 0 1000
phase 3 0 2 0 1000
rec 3 31 1100
stop 3
phase 4 0 2 1 1100
rec 4 31 1900
stop 4
phase 5 0 2 2 1900
rec 5 31 2000
stop 5
rec 2 22 2000
stop 2
stop 1
p2px 6 0 Send 1 64 ncclInt8 1 42
kch 8 0 6 1 3000
rec 8 22 3100
stop 8
stop 6
ce 7 0 3 AllGather 4096 ncclFloat32 MC 0x77
stop 7
sleep 40
flush
fin 0
"""

MASK_V4_V5 = 0x5E  # Coll, P2p, ProxyOp, ProxyStep, KernelCh
MASK_V6 = 0x105E  # + CeColl
MASK_V7 = 0x101E  # no KernelCh on 2.31 unless asked (4.3-13.3 % there, nccl#2355)


def _spans(version: str, tmp_path: Path, ring_dir: Path, env: dict[str, str] | None = None) -> tuple[
        list, list[ringmod.Record]]:
    pid = _pid_of(_replay(V7, tmp_path, version, env=env), ring_dir)
    with ringmod.Ring(ringmod.ring_path(pid, ring_dir), writable=False) as ring:
        records = list(ring.records())
    reader = NativeReader.open_for_pid(pid, JOB, 0, ring_dir=ring_dir)
    assert reader is not None
    spans = reader.drain()
    reader.close()
    return spans, records


def _kind(spans: list, kind: str) -> list:
    return [s for s in spans if s.attributes[schema.ATTR_SPAN_KIND] == kind]


def test_v7_symmetric_collective_tag_variant_and_phases(built: Path, ring_dir: Path, tmp_path: Path) -> None:
    spans, records = _spans("v7", tmp_path, ring_dir, {"MYCROFT_NATIVE_KERNEL_PHASES": "1"})
    kinds = [r.kind for r in records]
    # the facts come in their own record, right before the collective they belong to
    info = [i for i, k in enumerate(kinds) if k == ringmod.REC_COLL_INFO]
    assert [kinds[i + 1] for i in info] == [ringmod.REC_COLL_DONE, ringmod.REC_P2P_DONE, ringmod.REC_COLL_DONE]
    colls = {s.attributes[schema.ATTR_NCCL_FUNC]: s for s in _kind(spans, schema.KIND_NATIVE_COLL)}
    sym = colls["AllReduce"].attributes
    assert sym[schema.ATTR_NCCL_SYMMETRIC] is True and sym[schema.ATTR_NCCL_USER_TAG] == 0xFEED
    assert sym[schema.ATTR_NCCL_KERNEL_VARIANT] == "AllReduce_AGxLL_R" and sym[schema.ATTR_NCCL_ALGO] == "NVLS"
    assert sym[schema.ATTR_STATE] == schema.STATE_COMPLETED and sym[schema.ATTR_SEQ] == 0
    assert colls["Send"].attributes[schema.ATTR_NCCL_USER_TAG] == 42
    assert schema.ATTR_NCCL_SYMMETRIC not in colls["Send"].attributes
    # phases: children of the kernel channel, in order, GPU times as NCCL gave them
    kch = [s for s in _kind(spans, schema.KIND_NATIVE_KERNEL_CHANNEL) if s.trace_id == colls["AllReduce"].trace_id]
    assert len(kch) == 1 and kch[0].parent_span_id == colls["AllReduce"].span_id
    phases = sorted(_kind(spans, schema.KIND_NATIVE_KERNEL_PHASE), key=lambda s: s.start_ns)
    assert [p.attributes[schema.ATTR_NCCL_KERNEL_PHASE] for p in phases] == ["initial_sync", "compute", "final_sync"]
    assert {p.parent_span_id for p in phases} == {kch[0].span_id}
    assert [(p.attributes[schema.ATTR_NCCL_GPU_START_NS], p.attributes[schema.ATTR_NCCL_GPU_STOP_NS])
            for p in phases] == [(1000, 1100), (1100, 1900), (1900, 2000)]
    assert [p.end_ns - p.start_ns for p in phases] == [100, 800, 100]
    assert all(p.name == schema.SPAN_NATIVE_KERNEL_PHASE for p in phases)


def test_copy_engine_collective_is_a_collective_record(built: Path, ring_dir: Path, tmp_path: Path) -> None:
    spans, _ = _spans("v7", tmp_path, ring_dir)
    ce = [s for s in _kind(spans, schema.KIND_NATIVE_COLL) if s.attributes.get(schema.ATTR_NCCL_COPY_ENGINE)]
    assert len(ce) == 1
    a = ce[0].attributes
    assert (a[schema.ATTR_NCCL_FUNC], a[schema.ATTR_NCCL_ALGO], a[schema.ATTR_NCCL_PROTO]) == ("AllGather", "CE", "MC")
    assert a[schema.ATTR_BYTES] == 4096 * 4 and a[schema.ATTR_NCCL_USER_TAG] == 0x77
    assert a[schema.ATTR_STATE] == schema.STATE_COMPLETED
    # NCCL numbers CE collectives by its CE sync count: a trace of their own, no seq attribute
    assert ce[0].trace_id == schema.collective_trace_id(JOB, f"nccl:{COMM:016x}:ce", 3)
    assert schema.ATTR_SEQ not in a


def test_default_v7_mask_leaves_kernel_channels_off(built: Path, ring_dir: Path, tmp_path: Path) -> None:
    spans, _ = _spans("v7", tmp_path, ring_dir)
    assert not _kind(spans, schema.KIND_NATIVE_KERNEL_CHANNEL) and not _kind(spans, schema.KIND_NATIVE_KERNEL_PHASE)
    assert {s.attributes[schema.ATTR_NCCL_FUNC] for s in _kind(spans, schema.KIND_NATIVE_COLL)} == {
        "AllReduce", "Send", "AllGather"}


def test_v6_on_the_same_calls_loses_the_v7_facts(built: Path, ring_dir: Path, tmp_path: Path) -> None:
    """What a v6-only plugin sees: no tag, no symmetric flag, no phases; CE collectives still."""
    spans, records = _spans("v6", tmp_path, ring_dir)
    assert ringmod.REC_COLL_INFO not in {r.kind for r in records}
    colls = _kind(spans, schema.KIND_NATIVE_COLL)
    assert {s.attributes[schema.ATTR_NCCL_FUNC] for s in colls} == {"AllReduce", "Send", "AllGather"}
    for s in colls:
        assert schema.ATTR_NCCL_USER_TAG not in s.attributes and schema.ATTR_NCCL_SYMMETRIC not in s.attributes
    assert len(_kind(spans, schema.KIND_NATIVE_KERNEL_CHANNEL)) == 2
    assert not _kind(spans, schema.KIND_NATIVE_KERNEL_PHASE)


@pytest.mark.parametrize(("version", "env", "mask"), [
    ("v4", {}, MASK_V4_V5), ("v5", {}, MASK_V4_V5), ("v6", {}, MASK_V6), ("v7", {}, MASK_V7),
    ("v7", {"MYCROFT_NATIVE_KERNEL_CH": "1"}, MASK_V7 | 0x40),
    ("v7", {"MYCROFT_NATIVE_KERNEL_PHASES": "1"}, MASK_V7 | 0x40 | 0x8000),
    ("v6", {"MYCROFT_NATIVE_KERNEL_PHASES": "1"}, MASK_V6),  # v6 has no phases to ask for
    ("v4", {"MYCROFT_NATIVE_EVENT_MASK": "0xffff"}, 0xFF),  # an override keeps to the version's bits
])
def test_event_mask_per_version(built: Path, ring_dir: Path, tmp_path: Path, version: str, env: dict[str, str],
                                mask: int) -> None:
    script = f"init 0 1 0 2 1 m\nexpect_mask 0 {mask:x}\nfin 0\n"
    result = _replay(script, tmp_path, version, env={"MYCROFT_NATIVE_RING_DIR": str(ring_dir), **env})
    assert result.returncode == 0, result.stderr


def test_replay_rejects_a_wrong_mask(built: Path, ring_dir: Path, tmp_path: Path) -> None:
    """expect_mask can fail: the mask test above is not vacuous."""
    result = _replay("init 0 1 0 2 1 m\nexpect_mask 0 5e\nfin 0\n", tmp_path, "v7")
    assert result.returncode != 0 and "mask 0x101e" in result.stderr


def test_v7_layout_matches_the_released_header(built: Path, tmp_path: Path) -> None:
    """The sizes NCCL 2.31.2's profiler_v7.h gives (136-byte descriptor, 112 for v6), from C."""
    header = Path(__file__).resolve().parents[2] / "native" / "src" / "nccl_profiler_abi.h"
    src = tmp_path / "sizes.c"
    src.write_text(f'#include <stdio.h>\n#include "{header}"\nint main(void){{printf("%zu %zu %zu %zu\\n", '
                   'sizeof(mcNcclProfilerEventDescr_v6_t), sizeof(mcNcclProfilerEventDescr_v7_t), '
                   'offsetof(mcNcclProfilerEventDescr_v7_t, coll.userTag), '
                   'offsetof(mcNcclProfilerEventDescr_v7_t, ceColl.userTag)); return 0;}\n')
    exe = tmp_path / "sizes"
    subprocess.run(["cc", "-std=c11", str(src), "-o", str(exe)], check=True)
    assert subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split() == [
        "112", "136", str(24 + 104), str(24 + 88)]
