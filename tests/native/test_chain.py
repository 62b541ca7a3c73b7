"""MYCROFT_NCCL_PROFILER_CHAIN: a second plugin (here a counting one, exporting v6 and v7) gets every
call the emulated NCCL makes, with its own context, handles and parents, while Mycroft records as
before; its failure never disables Mycroft."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from mycroft.instrumentation.native_reader import NativeReader
from mycroft.native import BUILD_DIR

from mycroft import schema

from .conftest import make
from .test_edges import _pid_of, _replay

JOB = "job-chain"
COUNTERS = {"v7": BUILD_DIR / "libchain_counter.so",  # exports v7 and v6
            **{f"v{n}": BUILD_DIR / f"libchain_counter_v{n}.so" for n in (4, 5, 6)}}  # that table alone

# API and group events only the chained plugin keeps, a collective with a kernel channel and a
# phase, a flow with steps, a PXN flow (foreign parent), a CE collective with a CeSync child, and
# a KernelCh / ProxyOp under another rank's context (dropped for both).
SCRIPT = """
init 0 aaaa 0 2 1 chained
event 1 0 0x100 -
event 2 0 0x200 1
stop 2
event 3 0 0x1 -
collx 4 0 0 AllReduce 1024 ncclFloat32 2 RING SIMPLE 5 0 -
kch 5 0 4 0 100
phase 6 0 5 1 100
rec 6 31 150
stop 6
op 7 0 4 0 1 2 4096 1
step 8 0 7 0
rec 8 8
rec 8 20
rec 8 9 4096
stop 8
step 9 0 7 1
rec 9 9 4096
stop 9
stop 7
op 10 0 foreign 0 1 1 4096 1 other
step 14 0 10 0
rec 14 9 4096
stop 14
stop 10
rec 5 22 200
stop 5
stop 4
stop 3
stop 1
p2px 15 0 Send 1 64 ncclInt8 1 9
kch 16 0 15 1 300
rec 16 22 400
stop 16
stop 15
ce 11 0 1 AllGather 64 ncclInt8 UC 0
event 12 0 0x2000 11
stop 12
event 17 0 0x4000 11
stop 17
stop 11
badctx 13
sleep 30
flush
fin 0
"""

TYPE_OF = {"coll": 0x2, "collx": 0x2, "p2p": 0x4, "p2px": 0x4, "op": 0x8, "step": 0x10, "kch": 0x40,
           "phase": 0x8000, "ce": 0x1000}
BITS = {"v4": 0xFF, "v5": 0xFFF, "v6": 0x7FFF, "v7": 0xFFFF}


def expected(script: str, bits: int) -> dict[str, dict[str, int]]:
    """What the chained plugin must receive: every start, stop and record the emulated NCCL made
    for an event type both NCCL's version and the plugin's version know."""
    types: dict[str, int] = {}
    starts: Counter[int] = Counter()
    stops: Counter[int] = Counter()
    records: Counter[int] = Counter()
    for line in script.splitlines():
        tok = line.split()
        if not tok:
            continue
        if tok[0] in TYPE_OF or tok[0] == "event":
            kind = int(tok[3], 0) if tok[0] == "event" else TYPE_OF[tok[0]]
            if kind & bits:
                types[tok[1]] = kind
                starts[kind] += 1
        elif tok[0] == "stop" and tok[1] in types:
            stops[types[tok[1]]] += 1
        elif tok[0] == "rec" and tok[1] in types:
            records[int(tok[2])] += 1
    return {name: {str(k): v for k, v in sorted(c.items())}
            for name, c in (("starts", starts), ("stops", stops), ("records", records))}


@pytest.fixture(scope="module")
def counters(built: Path) -> dict[str, Path]:
    make("chain")
    return COUNTERS


def _run(tmp_path: Path, ring_dir: Path, version: str, chained: Path | str, extra: dict[str, str] | None = None,
         script: str = SCRIPT) -> tuple[dict, list]:
    out = tmp_path / f"counts-{version}-{len(list(tmp_path.glob('counts-*')))}.json"
    env = {"MYCROFT_NCCL_PROFILER_CHAIN": str(chained), "CHAIN_COUNTER_OUT": str(out),
           "MYCROFT_NATIVE_KERNEL_PHASES": "1", **(extra or {})}
    env = {k: v for k, v in env.items() if v}  # an empty value: leave it unset
    pid = _pid_of(_replay(script, tmp_path, version, env=env), ring_dir)
    reader = NativeReader.open_for_pid(pid, JOB, 0, ring_dir=ring_dir)
    assert reader is not None
    spans = reader.drain()
    reader.close()
    counts = json.loads(out.read_text()) if out.exists() and out.read_text() else {}
    out.write_text("")  # taken: the next run writes a new file
    return counts, spans


def _mycroft_view(spans: list) -> Counter[str]:
    return Counter(str(s.attributes[schema.ATTR_SPAN_KIND]) for s in spans)


@pytest.mark.parametrize(("version", "lib", "table"), [
    ("v7", "v7", "v7"), ("v7", "v6", "v6"), ("v6", "v7", "v6"),
    ("v7", "v5", "v5"),  # NCCL 2.31 calling Mycroft, NCCL Inspector of 2.28-2.30 (a v5 plugin) chained
    ("v7", "v4", "v4"), ("v6", "v5", "v5"),
])
def test_chained_plugin_gets_every_call_with_its_own_handles(counters: dict[str, Path], ring_dir: Path,
                                                            tmp_path: Path, version: str, lib: str,
                                                            table: str) -> None:
    counts, spans = _run(tmp_path, ring_dir, version, counters[lib])
    want = expected(SCRIPT, BITS[version] & BITS[table])
    assert {k: counts[k] for k in want} == want
    assert counts["inits"] == counts["finalizes"] == 1
    assert counts[f"calls_{table}"] == sum(want["starts"].values())  # the table Mycroft picked
    assert sum(counts[f"calls_v{n}"] for n in (4, 5, 6, 7)) == counts[f"calls_{table}"]
    # its own context, handles and parents every time; only the PXN flow's parent is foreign
    assert (counts["bad_ctx"], counts["bad_handle"], counts["bad_parent"], counts["pxn_parent"]) == (0, 0, 0, 1)
    alone, alone_spans = _run(tmp_path, ring_dir, version, "")
    assert alone == {}
    assert _mycroft_view(spans) == _mycroft_view(alone_spans)  # chaining changes nothing Mycroft records


def test_chained_plugin_older_than_every_table_leaves_mycroft_alone(counters: dict[str, Path], ring_dir: Path,
                                                                    tmp_path: Path) -> None:
    """NCCL 2.28 calls Mycroft's v5; the counter exports only v6/v7: nothing to chain to."""
    script = SCRIPT.replace("collx 4 0 0 AllReduce 1024 ncclFloat32 2 RING SIMPLE 5 0 -",
                            "coll 4 0 0 AllReduce 1024 ncclFloat32 2 RING SIMPLE")
    counts, spans = _run(tmp_path, ring_dir, "v5", counters["v7"], script=script)
    assert counts["inits"] == 0 and counts.get("starts") == {}
    assert _mycroft_view(spans)[schema.KIND_NATIVE_COLL] == 2


@pytest.mark.parametrize("failure", ["init", "missing"])
def test_a_failing_chained_plugin_never_disables_mycroft(counters: dict[str, Path], ring_dir: Path,
                                                         tmp_path: Path, failure: str) -> None:
    lib = counters["v7"] if failure == "init" else tmp_path / "no-such-plugin.so"
    counts, spans = _run(tmp_path, ring_dir, "v7", lib, {"CHAIN_COUNTER_FAIL_INIT": "1"} if failure == "init" else {})
    if failure == "init":
        assert counts["inits_failed"] == 1 and counts["inits"] == 0 and counts["starts"] == {}
    _, alone_spans = _run(tmp_path, ring_dir, "v7", "")
    assert _mycroft_view(spans) == _mycroft_view(alone_spans)
    assert _mycroft_view(spans)[schema.KIND_NATIVE_FLOW] == 2


def test_kernel_channels_the_chained_plugin_asks_for_are_kept_by_mycroft_too(counters: dict[str, Path],
                                                                             ring_dir: Path, tmp_path: Path) -> None:
    """NCCL Inspector asks for Coll, P2p and KernelCh: on 2.31 NCCL then sends kernel channels
    anyway, so Mycroft keeps them (no extra cost) though its own default mask leaves them off."""
    inspector_like = {"MYCROFT_NATIVE_KERNEL_PHASES": "", "CHAIN_COUNTER_MASK": "0x46"}
    script = SCRIPT.replace("init 0 aaaa 0 2 1 chained\n", "init 0 aaaa 0 2 1 chained\nexpect_mask 0 105e\n")
    counts, spans = _run(tmp_path, ring_dir, "v7", counters["v5"], inspector_like, script=script)
    assert counts["starts"] == {"2": 1, "4": 1, "64": 2}  # what it asked for, through its v5 table
    assert _mycroft_view(spans)[schema.KIND_NATIVE_KERNEL_CHANNEL] == 2
    _, alone = _run(tmp_path, ring_dir, "v7", "", {"MYCROFT_NATIVE_KERNEL_PHASES": ""})
    assert _mycroft_view(alone)[schema.KIND_NATIVE_KERNEL_CHANNEL] == 0


def test_no_free_pair_slot_drops_the_event_for_the_chained_plugin_only(counters: dict[str, Path], ring_dir: Path,
                                                                      tmp_path: Path) -> None:
    """Events only the chained plugin keeps need a pair slot: with 4 (and a long grace), the 5th
    and 6th API events are its loss, counted in the ring header; Mycroft's own events are not."""
    from mycroft.native import ring as ringmod

    script = "init 0 bb 0 2 1 pairs\n" + "".join(f"event {h} 0 0x200 -\nstop {h}\n" for h in range(1, 7)) + \
             "coll 7 0 0 AllReduce 8 ncclFloat32 1 RING LL\nstop 7\nsleep 30\nfin 0\n"
    out = tmp_path / "pairs.json"
    env = {"MYCROFT_NCCL_PROFILER_CHAIN": str(counters["v7"]), "CHAIN_COUNTER_OUT": str(out),
           "MYCROFT_NATIVE_POOL_PAIRS": "4", "MYCROFT_NATIVE_CHAIN_GRACE_MS": "60000"}
    pid = _pid_of(_replay(script, tmp_path, "v7", env=env), ring_dir)
    with ringmod.Ring(ringmod.ring_path(pid, ring_dir), writable=False) as ring:
        assert ring.counters()["chain_dropped"] == 2 and ring.counters()["dropped_events"] == 0
        assert [r.kind for r in ring.records()].count(ringmod.REC_COLL_DONE) == 1
    ringmod.ring_path(pid, ring_dir).unlink()
    assert json.loads(out.read_text())["starts"] == {"2": 1, "512": 4}
