"""Signature digests: what each rank puts in its heartbeats, and what the RCA concludes from them."""

from __future__ import annotations

from mycroft.instrumentation.digest import SignatureDigests
from mycroft.rca_service.analysis.triggers import find_digest_mismatches
from mycroft.rca_service.ingest.state import GroupState, JobState

from mycroft import schema

B = schema.DIGEST_BLOCK


def _digests(ops: list[tuple[int, str, int, str]]) -> SignatureDigests:
    d = SignatureDigests()
    for seq, op, nbytes, dtype in ops:
        d.add("g", seq, op, nbytes, dtype)
    return d


def _block(dtype_at: dict[int, str] | None = None) -> list[tuple[int, str, int, str]]:
    return [(seq, "all_reduce", 4096, (dtype_at or {}).get(seq, "float32")) for seq in range(1, B + 1)]


def test_a_block_closes_when_all_its_ops_completed_in_any_order_and_is_sent_a_few_times() -> None:
    ops = _block()
    d = _digests(ops[:-1])
    assert d.heartbeat_attributes() == {}  # one op short: nothing to say yet
    d.add("g", B, "all_reduce", 4096, "float32")
    shuffled = _digests(list(reversed(ops)))
    first = d.heartbeat_attributes()
    assert first[schema.ATTR_HB_DIGEST_BLOCKS] == [0] and first[schema.ATTR_HB_DIGEST_GROUP_IDS] == ["g"]
    assert first == shuffled.heartbeat_attributes()  # completion order does not matter
    repeats = [first] + [d.heartbeat_attributes() for _ in range(schema.DIGEST_REPEATS)]
    assert sum(1 for r in repeats if r) == schema.DIGEST_REPEATS  # then it is dropped
    other = _digests(_block({5: "int32"})).heartbeat_attributes()
    assert other[schema.ATTR_HB_DIGEST_VALUES] != first[schema.ATTR_HB_DIGEST_VALUES]


def test_uneven_sizes_of_ops_that_allow_them_do_not_differ() -> None:
    a = _digests([(s, "all_to_all", 100 * s, "float32") for s in range(1, B + 1)]).heartbeat_attributes()
    b = _digests([(s, "all_to_all", 7 * s, "float32") for s in range(1, B + 1)]).heartbeat_attributes()
    assert a == b


def _job(values: dict[int, int], members: tuple[int, ...]) -> JobState:
    job = JobState("j")
    job.groups["g"] = GroupState("g", ranks=members, digests={0: values})
    return job


def test_the_minority_of_the_members_that_reported_diverged_and_no_majority_says_nothing() -> None:
    found = find_digest_mismatches(_job({0: 7, 1: 7, 2: 9, 3: 7}, (0, 1, 2, 3)))
    assert [(m.seq, sorted(m.minority), m.basis) for m in found] == [(1, [2], "digest")]
    assert find_digest_mismatches(_job({0: 7, 1: 9}, (0, 1))) == []  # two members: who diverged?
    assert find_digest_mismatches(_job({0: 7, 1: 9, 2: 7, 3: 9}, (0, 1, 2, 3))) == []  # a tie so far
    assert find_digest_mismatches(_job({0: 7, 1: 7, 2: 7}, (0, 1, 2, 3))) == []
