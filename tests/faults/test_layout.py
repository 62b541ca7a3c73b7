"""The 3D job's layout and pipeline schedule (pure): Megatron's rank order, and a 1F1B
schedule whose blocking send/recv never deadlock unless one side's order is swapped."""

from __future__ import annotations

import pytest

from mycroft.faults.layout import Coord, Layout, one_f_one_b, unfit

Prim = tuple[str, int, str]  # ("send" | "recv", peer stage, "act" | "grad")


def _prims(stage: int, stages: int, micro_batches: int, swap: int | None = None) -> list[Prim]:
    """The stage's blocking p2p calls in order; `swap` flips the order of that exchange."""
    out: list[Prim] = []
    exchange = 0
    for action, _ in one_f_one_b(stage, stages, micro_batches):
        if action == "recv_fwd":
            out.append(("recv", stage - 1, "act"))
        elif action == "send_fwd":
            out.append(("send", stage + 1, "act"))
        elif action == "recv_bwd":
            out.append(("recv", stage + 1, "grad"))
        elif action == "send_bwd":
            out.append(("send", stage - 1, "grad"))
        elif action in ("send_fwd_recv_bwd", "send_bwd_recv_fwd"):
            lower = action == "send_fwd_recv_bwd"
            peer = stage + 1 if lower else stage - 1
            pair: list[Prim] = [("send", peer, "act"), ("recv", peer, "grad")] if lower else \
                [("recv", peer, "act"), ("send", peer, "grad")]
            if swap == exchange:
                pair.reverse()
            exchange += 1
            out += pair
    return out


def _runs_to_completion(queues: list[list[Prim]]) -> bool:
    """Rendezvous semantics (gloo's send waits for the matching recv)."""
    while any(queues):
        for stage, queue in enumerate(queues):
            if not queue:
                continue
            op, peer, what = queue[0]
            other = queues[peer]
            if op == "send" and other and other[0][:2] == ("recv", stage):
                assert other[0][2] == what, "an activation met a gradient"
                queue.pop(0)
                other.pop(0)
                break
        else:
            return False
    return True


def test_megatron_rank_order_tp_fastest() -> None:
    layout = Layout(2, 2, 2)
    assert layout.tp_groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.dp_groups() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.pp_groups() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout.coord(6) == Coord(tp=0, pp=1, dp=1) and layout.rank(Coord(1, 1, 0)) == 5
    assert layout.next_stage(1) == 5 and layout.prev_stage(1) is None
    for shape in ("2x4x1", "1x2x4", "4x1x2", "2x2x1"):
        lay = Layout.parse(shape)
        members = sorted(r for kind in (lay.tp_groups, lay.dp_groups, lay.pp_groups) for g in kind() for r in g)
        assert members == sorted(list(range(lay.world)) * 3)
    with pytest.raises(ValueError):
        Layout.parse("2x2")


@pytest.mark.parametrize("stages,micro_batches", [(2, 3), (4, 4), (3, 5), (2, 1), (4, 2)])
def test_1f1b_blocking_p2p_completes_and_every_micro_batch_goes_both_ways(stages: int, micro_batches: int) -> None:
    schedules = [one_f_one_b(s, stages, micro_batches) for s in range(stages)]
    for schedule in schedules:
        assert sorted(mb for a, mb in schedule if a == "fwd") == list(range(micro_batches))
        assert sorted(mb for a, mb in schedule if a == "bwd") == list(range(micro_batches))
    assert _runs_to_completion([_prims(s, stages, micro_batches) for s in range(stages)])


@pytest.mark.parametrize("stages,micro_batches", [(2, 3), (4, 4)])
def test_swapping_any_exchange_deadlocks(stages: int, micro_batches: int) -> None:
    for stage in range(stages):
        exchanges = sum(a.startswith("send_") and "_recv_" in a for a, _ in one_f_one_b(stage, stages, micro_batches))
        assert exchanges >= 1  # every stage of a pipeline can host the deadlock fault
        for k in range(exchanges):
            queues = [_prims(s, stages, micro_batches, swap=k if s == stage else None) for s in range(stages)]
            assert not _runs_to_completion(queues), (stage, k)


def test_faults_that_need_a_shape() -> None:
    assert unfit("deadlock", Layout(4, 1, 2)) and unfit("deadlock", Layout(2, 2, 2)) is None
    assert unfit("chain", Layout(1, 2, 4)) and unfit("chain", Layout(2, 4, 1)) is None
    assert unfit("mismatch_dtype", Layout(2, 4, 1)) and unfit("mismatch_op", Layout(1, 2, 4)) is None
    assert unfit("block", Layout(1, 1, 1))
