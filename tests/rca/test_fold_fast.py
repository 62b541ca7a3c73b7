"""The compiled heartbeat fold (rca_service/ingest/_fold_fast.c) against its definition, the Python fold.

Where the compiled fold takes a heartbeat it must leave exactly the state the Python fold
leaves; where it does not, it must change nothing (the Python fold then does it all). Both
are fed the same records: the simulator's wire bytes through the real decoder (every fault
kind, op spans interleaved), and those heartbeats mutated at random (types, missing keys,
late counters, final beats, p2p ops, digests, flows, bounds).
"""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
from mycroft.rca_service.config import AnalysisConfig
from mycroft.rca_service.ingest import state

from mycroft import schema
from mycroft.faults.bigjob import BigJob, Layout
from mycroft.faults.simfaults import FAULTS, plan
from mycroft.otlp import DecodeCache, SpanRecord, decode_protobuf


class Counting:
    """state._fold_fast, counting what it took."""

    def __init__(self) -> None:
        self.taken = self.declined = self.runs = 0

    def fold(self, *args: Any) -> int:
        assert state._fold_fast is self
        folded = int(REAL.fold(*args))
        if folded:
            self.taken += 1
        else:
            self.declined += 1
        return folded

    def fold_run(self, *args: Any) -> tuple[int, Any]:
        python_fold = args[7]

        def declined(*fold_args: Any) -> None:  # counted in `folded`, but the Python fold's
            self.declined += 1
            self.taken -= 1
            python_fold(*fold_args)

        folded, left = REAL.fold_run(*args[:7], declined, *args[8:])
        self.taken += folded
        self.runs += 1
        return folded, left


REAL = state._fold_fast


def _fold_both(compiled: dict[str, state.JobState], python: dict[str, state.JobState], records: list[SpanRecord],
               at: float, cfg: AnalysisConfig, counting: Counting, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setattr(state, "_fold_fast", counting)
        state.apply_records(compiled, records, at, cfg)
    with monkeypatch.context() as m:
        m.setattr(state, "_fold_fast", None)
        state.apply_records(python, records, at, cfg)
    assert compiled == python


def test_the_compiled_fold_is_built() -> None:
    """The set-up builds it (pip install -e .): the suite must exercise it, not its absence."""
    assert REAL is not None


@pytest.mark.parametrize("fault", ["none", *FAULTS])
def test_the_simulators_heartbeats_fold_alike(fault: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tp, pp = (1, 4) if fault in ("deadlock", "mismatch") else (8, 1)
    world = 64
    p = plan(fault, world, tp, seed=7, pp=pp)
    job = BigJob("j", Layout(world, tp=tp, pp=pp), ops_per_s=10, fault=p, fault_at=1005.5 if fault != "none" else 0.0)
    cfg, cache = AnalysisConfig(), DecodeCache()
    compiled: dict[str, state.JobState] = {}
    python: dict[str, state.JobState] = {}
    counting = Counting()
    ranks = list(range(world))
    for k in range(12):
        now = 1000.0 + k
        job.tick(now)
        beats = decode_protobuf(job.heartbeat_bytes(ranks, now), cache)
        _fold_both(compiled, python, beats, now + 0.01, cfg, counting, monkeypatch)
        payload, _ = job.op_span_bytes(ranks, now, keep=0.3)
        if payload:
            _fold_both(compiled, python, decode_protobuf(payload, cache), now + 0.02, cfg, counting, monkeypatch)
    assert compiled["j"].heartbeats > 0
    # every heartbeat after a rank's first (its table's first sight) is the compiled fold's
    assert counting.taken > 0 and counting.taken >= 0.85 * (counting.taken + counting.declined), \
        (counting.taken, counting.declined)
    assert counting.runs > 0


def _mutate(rng: random.Random, a: dict[str, Any]) -> dict[str, Any]:
    """A copy of heartbeat attributes with one to three random changes (its group table's
    objects kept, so that the compiled fold's table test passes and its other checks are tried)."""
    out = dict(a)
    keys = [k for k in out if k.startswith("mycroft.hb.")]
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(keys)
        choice = rng.randrange(14)
        value = out.get(key)
        if choice == 0:
            out.pop(key, None)
        elif choice == 1:
            out[key] = str(value)
        elif choice == 2 and isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = float(value) if isinstance(value, int) else int(value)
        elif choice == 3 and isinstance(value, list):
            out[key] = tuple(value)
        elif choice == 4 and isinstance(value, list) and value:
            out[key] = [str(v) for v in value]
        elif choice == 5:
            out[schema.ATTR_HB_FINAL] = rng.choice([True, False, 1, "yes"])
            if rng.random() < 0.5:
                out[schema.ATTR_HB_EXIT_REASON] = "SIGTERM"
        elif choice == 6:
            out[schema.ATTR_HB_COUNTER] = max(-1, int(out.get(schema.ATTR_HB_COUNTER, 0)) - rng.randint(1, 3))
        elif choice == 7:
            out[schema.ATTR_HB_STACK] = "frame\n" * rng.randint(0, 40)
            # the other threads' stacks beside it: folded (and cut) alike, a non-str the Python fold's
            out[schema.ATTR_HB_THREAD_STACKS] = rng.choice(["--- thread loader\nq.py:3 in get\n" * rng.randint(0, 300),
                                                            "", 7])
        elif choice == 8:  # a p2p op in flight (send or recv), maybe one already completed
            gid = out[schema.ATTR_HB_GROUP_IDS][0] if out.get(schema.ATTR_HB_GROUP_IDS) else "g"
            out[schema.ATTR_HB_INFLIGHT_GROUP_IDS] = [gid, gid]
            out[schema.ATTR_HB_INFLIGHT_SEQS] = [rng.randint(0, 5), rng.randint(0, 5)]
            out[schema.ATTR_HB_INFLIGHT_OPS] = [rng.choice([schema.OP_SEND, "recv"]), "all_reduce"]
            out[schema.ATTR_HB_INFLIGHT_PEERS] = [rng.randint(0, 63), -1]
            out[schema.ATTR_HB_INFLIGHT_AGES_S] = [rng.random()]  # shorter than the others: defaults
            out[schema.ATTR_HB_INFLIGHT_BYTES] = [4, 8]
            out[schema.ATTR_HB_INFLIGHT_DTYPES] = ["float32"]
        elif choice == 9:
            gids = out.get(schema.ATTR_HB_GROUP_IDS) or ["g"]
            out[schema.ATTR_HB_DIGEST_GROUP_IDS] = [gids[0]]
            out[schema.ATTR_HB_DIGEST_BLOCKS] = [rng.randint(0, 3)]
            out[schema.ATTR_HB_DIGEST_VALUES] = [rng.randint(0, 1 << 31)]
        elif choice == 10:
            out[schema.ATTR_HB_FLOW_SEQS] = [rng.randint(0, 9)] if rng.random() < 0.7 else (1, 2)
            out[schema.ATTR_HB_FLOW_PEERS] = [rng.randint(0, 63)]
        elif choice == 11:
            out[schema.ATTR_HB_GROUP_ISSUED] = [rng.choice([2 ** 70, -5, 0, 3])] * 3
        elif choice == 12:
            out[schema.ATTR_HB_INTERVAL_S] = rng.choice([0.0, 2.0, float("inf"), 1])
        elif choice == 13:
            out[schema.ATTR_HB_STEP] = rng.choice([3, "4", 2.5, True])
    return out


@pytest.mark.parametrize("seed", range(6))
def test_mutated_heartbeats_fold_alike(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    world = 32
    p = plan(rng.choice(["none", "block", "deadlock", "nic_down", "straggler"]), world, 4, seed=seed)
    job = BigJob("j", Layout(world, tp=4), ops_per_s=10, fault=p, fault_at=1004.5)
    cfg = AnalysisConfig(max_stack_chars=rng.choice([0, 7, 4000]), max_seqs_per_group=rng.choice([3, 256]))
    cache = DecodeCache()
    compiled: dict[str, state.JobState] = {}
    python: dict[str, state.JobState] = {}
    counting = Counting()
    ranks = list(range(world))
    for k in range(10):
        now = 1000.0 + k
        job.tick(now)
        beats = decode_protobuf(job.heartbeat_bytes(ranks, now), cache)
        mutated = [copy.copy(r) for r in beats]
        for record in mutated:
            if rng.random() < 0.4:
                record.attributes = _mutate(rng, record.attributes)
            if rng.random() < 0.1:  # its clock stepped back: no work sample older than the last
                record.end_ns -= rng.choice([0, 2_000_000_000])
        mutated += [copy.copy(r) for r in rng.sample(mutated, 3)]  # delivered twice
        at = now + rng.choice([0.01, -0.5, 0.0])  # some arrive "before" the last one
        _fold_both(compiled, python, mutated, at, cfg, counting, monkeypatch)
        payload, _ = job.op_span_bytes(ranks, now, keep=0.5)
        if payload:
            _fold_both(compiled, python, decode_protobuf(payload, cache), now + 0.02, cfg, counting, monkeypatch)
    assert counting.taken > 0 and counting.declined > 0  # both paths were tried
