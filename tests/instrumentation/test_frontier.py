"""The Flight Recorder's frontier read as torch writes it: pg_status keyed by this process's own pg ids
(named through the entries), and on gloo counted on torch's counter, which p2p ops move too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mycroft.instrumentation.flight_recorder import FrontierReader
from mycroft.instrumentation.groups import GroupInfo
from mycroft.instrumentation.runtime import (
    BUSY_TICK_S,
    ENTRY_DUMP_GAP_MAX_S,
    ENTRY_DUMP_GAP_S,
    ENTRY_DUMP_SHARE,
    FRONTIER_PERIOD_S,
    HOST_SYNC_OPEN_S,
    IDLE_TICK_S,
    entry_dump_due,
    next_entry_dump,
    runtime_tick_s,
)


def _status(enqueued: int, completed: int) -> dict[str, str]:
    return {"last_enqueued_collective": str(enqueued), "last_started_collective": "-1",
            "last_completed_collective": str(completed)}


class _Dump:
    """A rank that is no member of new_group([0, 1]) (name "1"): its groups "2" and "4" are its pg ids 1, 2."""

    def __init__(self) -> None:
        self.calls: list[tuple[bool, bool]] = []
        self.status = {"0": _status(1, 1), "1": _status(40, 40), "2": _status(120, 119)}
        self.entries = [{"pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": 1},
                        {"pg_id": 1, "process_group": ["2", "TP"], "collective_seq_id": 40},
                        {"pg_id": 2, "process_group": ["4", "DP"], "collective_seq_id": 120}]

    def __call__(self, include_collectives: bool, only_active: bool) -> str:
        self.calls.append((include_collectives, only_active))
        doc: dict[str, Any] = {"pg_status": self.status}
        if include_collectives:
            doc["entries"] = self.entries
        return json.dumps(doc)


def test_pg_ids_are_named_through_the_entries_once() -> None:
    dump = _Dump()
    reader = FrontierReader(dump)
    assert reader.read() == {"0": (1, 1), "2": (40, 40), "4": (120, 119)}  # never "1": (40, 40), "2": (120, ...)
    assert reader.read() == {"0": (1, 1), "2": (40, 40), "4": (120, 119)}
    assert dump.calls == [(False, False), (True, False), (False, False)] and reader.name_reads == 1


def test_a_pg_id_no_entry_names_is_left_out_and_asked_again_later() -> None:
    dump = _Dump()
    dump.status["3"] = _status(5, 5)  # a group whose entries the ring buffer no longer holds
    reader = FrontierReader(dump)
    assert set(reader.read()) == {"0", "2", "4"} and reader.name_reads == 1
    reader.read()
    assert reader.name_reads == 1  # backing off, not a full dump per read
    dump.entries.append({"pg_id": 3, "process_group": ["7", "PP"], "collective_seq_id": 5})
    reader._learn_at.clear()
    assert reader.read()["7"] == (5, 5)


def _gloo() -> GroupInfo:
    return GroupInfo(gid="g", name="0", desc="", ranks=(0, 1), ranks_text="0-1", group_rank=0, backend="gloo",
                     pg=None)


def test_gloo_frontier_leaves_out_the_counter_positions_p2p_ops_took() -> None:
    info = _gloo()
    # torch's counter: all_reduce 1, send 2, all_reduce 3, isend 4 + irecv 5 (one batch), all_reduce 6
    info.note_p2p(1, 2)
    info.note_p2p(3, 5)
    assert info.p2p_counter_delta == 3
    assert info.collective_frontier(6, 3) == (3, 2)
    assert info.collective_frontier(6, 6) == (3, 3)
    assert info.p2p_taken == [] and info.p2p_below == 3
    info.note_p2p(6, 7)  # a later p2p op: positions already folded stay counted
    assert info.collective_frontier(8, 8) == (4, 4)
    assert info.collective_frontier(-1, -1) == (-1, -1)


def test_no_p2p_no_change() -> None:
    info = _gloo()
    assert info.collective_frontier(12, 10) == (12, 10)


def test_a_host_synchronous_op_is_looked_up_once_it_stayed_open_a_device_op_at_once() -> None:
    now = 100.0
    assert entry_dump_due([(True, now)], now, 0.0)  # NCCL: its active entries are few
    assert not entry_dump_due([(False, now - HOST_SYNC_OPEN_S / 2)], now, 0.0)  # a DDP bucket still running
    assert entry_dump_due([(False, now - HOST_SYNC_OPEN_S / 2), (False, now - HOST_SYNC_OPEN_S)], now, 0.0)
    assert not entry_dump_due([(True, now)], now, now + 0.1)  # spaced from the last read
    assert not entry_dump_due([], now, 0.0)


def test_entries_reads_are_spaced_by_what_they_cost_within_bounds() -> None:
    assert next_entry_dump(10.0, 0.001) == 10.0 + ENTRY_DUMP_GAP_S
    assert next_entry_dump(10.0, 0.05) == pytest.approx(10.0 + 0.05 / ENTRY_DUMP_SHARE)  # 2% of the time
    assert next_entry_dump(10.0, 5.0) == 10.0 + ENTRY_DUMP_GAP_MAX_S  # a hang after it is still named


def test_the_runtime_wakes_often_only_while_it_polls_a_completion_and_never_past_a_heartbeat() -> None:
    assert runtime_tick_s(False, 1.0, 1.0) == IDLE_TICK_S  # nothing pending: fewer, fuller drains
    assert runtime_tick_s(True, 1.0, 1.0) == BUSY_TICK_S  # a gloo p2p Work: its span ends when it is seen
    assert BUSY_TICK_S < IDLE_TICK_S <= FRONTIER_PERIOD_S  # an idle tick still reads every frontier in time
    assert runtime_tick_s(False, 1.0, 0.03) == pytest.approx(0.03)  # the heartbeat goes out on time
    assert runtime_tick_s(False, 0.2, 1.0) == pytest.approx(0.05)  # a short interval: 4 ticks per heartbeat
    assert runtime_tick_s(True, 1.0, -0.5) > 0  # a late heartbeat: wake at once, do not spin


_GLOO_DUMPS = r"""
import dataclasses, json, sys, time
import torch, torch.distributed as dist
from mycroft.instrumentation.flight_recorder import parse_active, parse_pg_ids, parse_pg_status, pickled_dump
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=1)
tp = dist.new_group([0], group_desc="TP")
for i in range(30):
    dist.all_reduce(torch.ones(8 + i))
    dist.broadcast(torch.ones(3, dtype=torch.float64), 0, group=tp)
time.sleep(0.3)  # gloo's thread marks the last op completed in its Flight Recorder just after the wait returns
c10d = torch._C._distributed_c10d
out = {}
for name, dump in (("json", c10d._dump_fr_trace_json), ("pickled", pickled_dump(c10d._dump_fr_trace))):
    out[name] = {"status": parse_pg_status(dump(False, False)), "ids": parse_pg_ids(dump(True, False))[0],
                 "unnamed": len(parse_pg_ids(dump(True, False))[1]),
                 "active": [list(map(str, dataclasses.astuple(e))) for e in parse_active(dump(True, True))]}
print(json.dumps(out))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_the_pickled_dump_reads_as_the_json_one_on_real_gloo(tmp_path: Path) -> None:
    """The generic dump is read pickled without stack traces (a fraction of the JSON one's GIL time):
    the same frontier, group names and entries as the JSON dump of the same Flight Recorder."""
    from tests.conftest import free_port

    result = subprocess.run([sys.executable, "-c", _GLOO_DUMPS, str(free_port())], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["pickled"] == out["json"]
    assert out["json"]["ids"] == {"0": "0", "1": "1"} and out["json"]["status"]["1"] == [30, 30]
    assert out["json"]["unnamed"] == 0
    ops = {(e[0], e[2], e[4]) for e in out["json"]["active"]}  # gloo's entries stay "scheduled"
    assert ("0", "all_reduce", "float") in ops and ("1", "broadcast", "double") in ops


_DETAIL_DUMP = r"""
import json, sys, time
import torch, torch.distributed as dist
from mycroft.instrumentation.flight_recorder import UnnamedIds, parse_pg_ids, parse_pg_status, pickled_dump
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=1)
tp = dist.new_group([0], group_desc="TP")
groups = {"0": dist.group.WORLD, "1": tp}
dump = pickled_dump(torch._C._distributed_c10d._dump_fr_trace)
ids = UnnamedIds()
unnamed = set()
for i in range(12):
    for n in (4, 2, 3):  # 3 on the world group per 1 on TP: the helpers' counts (2 per op) equal no counter
        dist.all_reduce(torch.ones(n))
    dist.all_gather_into_tensor(torch.empty(4), torch.ones(4), group=tp)
    time.sleep(0.05)  # gloo's thread marks an op in its Flight Recorder just after the wait returns
    if i == 1:
        named, unnamed = parse_pg_ids(dump(True, False))
    if unnamed:
        status = parse_pg_status(dump(False, False))
        ids.observe({k: v[0] for k, v in status.items() if k in unnamed},
                    {name: g._get_sequence_number_for_group() for name, g in groups.items()})
print(json.dumps({"named": named, "unnamed": sorted(unnamed), "status": parse_pg_status(dump(False, False)),
                  "matched": ids.named()}))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_backends_torch_left_unnamed_are_named_by_their_groups_counters(tmp_path: Path) -> None:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL wraps each gloo backend: the wrapped one records the group's
    collectives without a name, a helper its checks (numbered apart). Their frontiers read beside
    the groups' own counters name each group's backend and leave the helpers out."""
    from tests.conftest import free_port

    env = {**os.environ, "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    result = subprocess.run([sys.executable, "-c", _DETAIL_DUMP, str(free_port())], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["named"] == {} and len(out["unnamed"]) == 4, out  # two groups, each wrapped with a helper
    matched = out["matched"]
    assert sorted(matched.values()) == ["0", "1"], out
    by_group = {name: pg_id for pg_id, name in matched.items()}
    assert out["status"][by_group["0"]] == [36, 36] and out["status"][by_group["1"]] == [12, 12], out
    helpers = set(out["unnamed"]) - set(matched)
    assert sorted(out["status"][h][0] for h in helpers) == [24, 72], out  # the checks, 2 per collective


def test_unnamed_ids_are_named_only_on_unambiguous_evidence() -> None:
    from mycroft.instrumentation.flight_recorder import UnnamedIds

    ids = UnnamedIds()
    for k in range(1, 6):
        # "a" follows group tp; "h" counts 4 per op and equals dp's counter once; equal counters vote for nobody
        ids.observe({"a": k, "h": 4 * k, "z": 7}, {"tp": k, "dp": 2 * k if k != 2 else 8, "pp": 7, "ep": 7})
    assert ids.named() == {"a": "tp"}
    ids.observe({"a": 6}, {"tp": 6})
    ids.observe({"a": 6}, {"tp": 6})  # a value that did not move votes once
    assert ids.votes["a"]["tp"] == 6
    tie = UnnamedIds()
    for k in range(1, 6):  # a helper counting 2 per tp op, in step with dp (2 per tp op): which is dp's?
        tie.observe({"w": 2 * k, "h": 2 * k}, {"dp": 2 * k, "tp": k})
    assert tie.named() == {}
