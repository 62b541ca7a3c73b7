"""The Flight Recorder's frontier read as torch writes it: pg_status keyed by this process's own pg ids
(named through the entries), and on gloo counted on torch's counter, which p2p ops move too."""

from __future__ import annotations

import json
from typing import Any

from mycroft.instrumentation.flight_recorder import FrontierReader
from mycroft.instrumentation.groups import GroupInfo


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
