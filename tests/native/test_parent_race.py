"""The parent/child race of the plugin's collective slots, forced deterministically.

A flow (ProxyOp) or kernel channel names its collective by the handle NCCL got at the Coll's
start. The plugin checks that the slot is live, then counts the child against it. If the
publisher retires the collective between the check and the count (its last child stopped, the
linger passed) and the slot is reused, the count lands on the new occupant: before the fix a
count on the freed slot was wiped by the new collective's start and the child's stop then
underflowed the new collective's open-child count, so it never retired (in flight until
finalize); a count after the reuse made the new collective adopt another collective's child.

The interleaving cannot be timed from outside, so a test build of the plugin (`make hooks`,
`-DMC_TEST_HOOKS`) calls back into the driver at that point (after the check, before the
count), and the driver runs the script's `hook child_validated ... endhook` block there: the
publisher's retire (`flush`) and, in the second case, the new collective's start. Everything
goes through the exported ABI, the way NCCL calls it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from mycroft.native import BUILD_DIR, LIBRARY_NAME
from mycroft.native import ring as ringmod

from .conftest import DRIVER, make
from .test_edges import _pid_of

# A (seq 1) takes slot 0 of a 4-slot pool; three collectives that stay open fill the others,
# so B (seq 2) can only get A's slot once A is retired (expect_same checks it did).
HEAD = """init 0 4343 0 2 1 race
coll 1 0 1 AllReduce 8 ncclFloat32 1 RING LL
coll 10 0 100 AllReduce 8 ncclFloat32 1 RING LL
coll 11 0 101 AllReduce 8 ncclFloat32 1 RING LL
coll 12 0 102 AllReduce 8 ncclFloat32 1 RING LL
op 2 0 1 0 1 1 8 1
stop 1
"""
B_AND_ITS_FLOW = """coll 4 0 2 AllReduce 8 ncclFloat32 1 RING LL
expect_same 1 4
op 5 0 4 0 1 1 8 1
"""
TAIL = """stop 5
stop 4
sleep 2
stop 3
flush
stop 10
stop 11
stop 12
flush
fin 0
"""

# 1: A's last flow stops and the publisher retires A while flow Z (naming A) is between the
# check and the count; B then reuses the slot.
RETIRED = HEAD + """hook child_validated
stop 2
flush
endhook
op 3 0 1 1 1 1 8 1
expect_hooks 1
""" + B_AND_ITS_FLOW + TAIL

# 2: the same, and B has already taken the slot when Z's count lands.
REUSED = HEAD + """hook child_validated
stop 2
flush
""" + B_AND_ITS_FLOW + """endhook
op 3 0 1 1 1 1 8 1
expect_hooks 1
""" + TAIL

# control: the hook runs but nothing interleaves; Z is A's child as usual.
CONTROL = HEAD + """hook child_validated
endhook
op 3 0 1 1 1 1 8 1
expect_hooks 1
stop 2
stop 3
flush
""" + B_AND_ITS_FLOW + """stop 5
stop 4
flush
fin 0
"""

pytestmark = pytest.mark.slow  # drives the plugin in driver processes

ENV = {"MYCROFT_NATIVE_POOL_COLLS": "4", "MYCROFT_NATIVE_LINGER_MS": "0",
       # the publisher thread stays out of the way: only the script's flushes retire
       "MYCROFT_NATIVE_SNAPSHOT_MS": "3600000", "MYCROFT_NATIVE_TICK_MS": "1000"}


@pytest.fixture(scope="module")
def hooked(built: Path) -> Path:
    make("hooks")
    library = BUILD_DIR / "hooks" / LIBRARY_NAME
    assert library.is_file()
    return library


def _run(script: str, library: Path, ring_dir: Path, tmp: Path, version: str,
         driver: Path = DRIVER) -> list[ringmod.Record]:
    path = tmp / "race.script"
    path.write_text(script)
    result = subprocess.run([str(driver), "replay", str(library), version, str(path)], capture_output=True,
                            text=True, env={**os.environ, **ENV, "MYCROFT_NATIVE_RING_DIR": str(ring_dir)},
                            timeout=60)
    pid = _pid_of(result, ring_dir)
    with ringmod.Ring(ringmod.ring_path(pid, ring_dir), writable=False) as ring:
        return list(ring.records())


def _done(records: list[ringmod.Record]) -> tuple[dict[int, ringmod.Record], dict[int, ringmod.Record]]:
    """Finished collectives by seq, finished flows by channel (Z runs on channel 1, the others on 0)."""
    colls = {r.seq: r for r in records if r.kind == ringmod.REC_COLL_DONE}
    flows = {r.fields["channel"]: r for r in records if r.kind == ringmod.REC_FLOW_DONE and r.fields["channel"] == 1}
    return colls, flows


@pytest.mark.parametrize("version", ["v4", "v6", "v7"])
def test_child_of_a_collective_retired_before_it_was_counted(hooked: Path, ring_dir: Path, tmp_path: Path,
                                                             version: str) -> None:
    colls, flows = _done(_run(RETIRED, hooked, ring_dir, tmp_path, version))
    a, b = colls[1], colls[2]
    assert not a.aborted and a.fields["children"] == 1  # A: its one flow
    # B retires when its own flow stops (before the fix its open count underflowed: B stayed
    # in flight until finalize closed it, aborted)
    assert not b.aborted, "the collective that reused the slot never retired"
    assert b.fields["children"] == 1
    z = flows[1]
    assert z.flags & ringmod.FLAG_ORPHAN and z.seq == ringmod.SEQ_UNKNOWN and z.fields["parent_kind"] == 0


@pytest.mark.parametrize("version", ["v4", "v6", "v7"])
def test_child_of_a_collective_whose_slot_was_reused_before_it_was_counted(hooked: Path, ring_dir: Path,
                                                                           tmp_path: Path, version: str) -> None:
    colls, flows = _done(_run(REUSED, hooked, ring_dir, tmp_path, version))
    b = colls[2]
    # B is not given A's flow: one child (its own), its end is its own flow's stop
    assert not b.aborted and b.fields["children"] == 1, b.fields
    z = flows[1]
    assert z.flags & ringmod.FLAG_ORPHAN and z.seq == ringmod.SEQ_UNKNOWN
    assert b.end_ns < z.end_ns  # Z stopped after B's own flow: B's end is not Z's


def test_control_without_interleaving_the_child_is_counted(hooked: Path, ring_dir: Path, tmp_path: Path) -> None:
    colls, flows = _done(_run(CONTROL, hooked, ring_dir, tmp_path, "v6"))
    assert colls[1].fields["children"] == 2 and not colls[1].aborted  # both of A's flows
    assert flows[1].seq == 1 and not flows[1].flags & ringmod.FLAG_ORPHAN
    assert colls[2].fields["children"] == 1 and not colls[2].aborted


def test_hook_needs_the_test_build(built: Path, ring_dir: Path, tmp_path: Path) -> None:
    """The production library has no hook: a script that arms one fails loudly, never silently passes."""
    path = tmp_path / "race.script"
    path.write_text(RETIRED)
    result = subprocess.run([str(DRIVER), "replay", str(built), "v6", str(path)], capture_output=True, text=True,
                            env={**os.environ, **ENV, "MYCROFT_NATIVE_RING_DIR": str(ring_dir)}, timeout=60)
    assert result.returncode != 0 and "make hooks" in result.stderr
