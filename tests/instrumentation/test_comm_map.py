"""Communicator -> group mapping from shape and call-window evidence (pure)."""

from __future__ import annotations

from mycroft.instrumentation.comm_map import CommInfo, GroupShape, NativeColl, PyOp, match_comms

from mycroft import schema

WORLD = GroupShape("w", "0", "default_pg", (0, 1, 2, 3), 1)
DUP = GroupShape("d", "1", "dup", (0, 1, 2, 3), 1)  # same members, same shape: only timing tells them apart
PAIR = GroupShape("p", "2", "tp", (0, 1), 1)


def _ops(gid: str, first_seq: int, starts: list[int], op: str = schema.OP_ALL_REDUCE) -> list[PyOp]:
    return [PyOp(gid, first_seq + i, op, t, t + 50_000) for i, t in enumerate(starts)]


def test_two_groups_of_one_shape_are_told_apart_by_when_their_calls_ran() -> None:
    a, b = 0xA, 0xB
    comms = [CommInfo(a, "", 4, 1), CommInfo(b, "", 4, 1), CommInfo(0xC, "", 2, 1)]
    # world ops at 1, 3, 5 ms; dup ops at 2, 4 ms; NCCL starts each collective inside its call
    ops = _ops("w", 1, [1_000_000, 3_000_000, 5_000_000]) + _ops("d", 1, [2_000_000, 4_000_000])
    ops += _ops("p", 7, [6_000_000, 7_000_000])
    colls = [NativeColl(a, n, "AllReduce", t + 10_000) for n, t in enumerate([1_000_000, 3_000_000, 5_000_000])]
    colls += [NativeColl(b, n, "AllReduce", t + 10_000) for n, t in enumerate([2_000_000, 4_000_000])]
    colls += [NativeColl(0xC, n, "AllReduce", t + 10_000) for n, t in enumerate([6_000_000, 7_000_000])]
    out = match_comms(comms, colls, [WORLD, DUP, PAIR], ops, slack_ns=200_000)
    assert out[a].gid == "w" and out[a].seq_offset == 1 and out[a].ranks == WORLD.ranks
    assert out[b].gid == "d" and out[b].seq_offset == 1
    assert out[0xC].gid == "p" and out[0xC].seq_offset == 7  # the pair's torch seq ran ahead of NCCL's


def test_no_evidence_or_a_tie_maps_nothing() -> None:
    comm = CommInfo(0xA, "", 4, 1)
    assert match_comms([comm], [], [WORLD, DUP], []) == {}
    # both groups issued at the same instants: a tie, unresolved without a name hint
    ops = _ops("w", 1, [1_000_000, 3_000_000]) + _ops("d", 1, [1_000_000, 3_000_000])
    colls = [NativeColl(0xA, n, "AllReduce", t + 10_000) for n, t in enumerate([1_000_000, 3_000_000])]
    assert match_comms([comm], colls, [WORLD, DUP], ops) == {}
    # ... which the communicator's name breaks when torch put the group's name there
    named = CommInfo(0xA, "pg 1 dup", 4, 1)
    assert match_comms([named], colls, [WORLD, DUP], ops)[0xA].gid == "d"


def test_a_different_op_or_shape_is_no_evidence() -> None:
    comm = CommInfo(0xA, "", 4, 1)
    ops = _ops("w", 1, [1_000_000, 3_000_000], op=schema.OP_ALL_GATHER)
    colls = [NativeColl(0xA, n, "AllReduce", t + 10_000) for n, t in enumerate([1_000_000, 3_000_000])]
    assert match_comms([comm], colls, [WORLD], ops) == {}
    # barrier is an all-reduce to NCCL
    ops = _ops("w", 1, [1_000_000, 3_000_000], op=schema.OP_BARRIER)
    assert match_comms([comm], colls, [WORLD], ops)[0xA].gid == "w"
    # a rank that is not the communicator's rank in the group is not a candidate
    assert match_comms([CommInfo(0xA, "", 4, 2)], colls, [WORLD], ops) == {}
