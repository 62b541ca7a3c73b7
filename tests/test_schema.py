"""The span contract module: deterministic ids, compact rank lists, and its documentation."""

from __future__ import annotations

import hashlib
import random
import re
from pathlib import Path

import pytest

from mycroft import schema

DOC = Path(__file__).resolve().parent.parent / "docs" / "schema.md"


@pytest.mark.parametrize("ranks", [[], [3], [0, 1], list(range(8)), list(range(0, 16, 2)), [0, 1, 5, 9, 10, 11, 40],
                                   list(range(16384)), [7, 3, 3, 1]])
def test_rank_lists_round_trip(ranks: list[int]) -> None:
    text = schema.encode_ranks(ranks)
    assert schema.decode_ranks(text) == sorted(set(ranks))


def test_rank_lists_are_compact_and_readable() -> None:
    assert schema.encode_ranks(range(16384)) == "0-16383"
    assert schema.encode_ranks(range(0, 16, 2)) == "0-14/2"
    assert schema.encode_ranks([3, 5, 9, 10, 11]) == "3,5,9-11"


def test_random_rank_lists_round_trip() -> None:
    rng = random.Random(7)
    for _ in range(300):
        ranks = rng.sample(range(200), rng.randint(0, 60))
        assert schema.decode_ranks(schema.encode_ranks(ranks)) == sorted(ranks)


@pytest.mark.parametrize("bad", ["a", "1-", "3-9/0", "1,,2"])
def test_malformed_rank_lists_raise(bad: str) -> None:
    with pytest.raises(ValueError):
        schema.decode_ranks(bad)


def test_ids_are_deterministic_and_distinct() -> None:
    gid = schema.group_id("0", [0, 1, 2, 3])
    assert gid == schema.group_id("0", [3, 2, 1, 0])
    assert gid != schema.group_id("1", [0, 1, 2, 3])
    trace = schema.collective_trace_id("job", gid, 7)
    assert trace == schema.collective_trace_id("job", gid, 7)
    assert len({schema.collective_trace_id("job", gid, seq) for seq in range(1000)}) == 1000
    assert trace != schema.collective_trace_id("other-job", gid, 7)
    assert schema.p2p_trace_id("job", gid, 0, 1, 1) != schema.p2p_trace_id("job", gid, 1, 0, 1)
    assert 0 < trace < 2**128
    assert 0 < schema.rank_span_id(trace, 3) < 2**64
    assert schema.rank_span_id(trace, 3) != schema.rank_span_id(trace, 4)
    for trace_id, rank, salt in ((trace, 3, ""), (1, 0, "fr"), (2**128 - 1, 16383, "ünï"), (5, -1, "x\x1fy")):
        whole = hashlib.blake2b("\x1f".join(map(str, ("span", trace_id, rank, salt))).encode(), digest_size=16)
        assert schema.rank_span_id(trace_id, rank, salt) == (int.from_bytes(whole.digest()[:8], "big") or 1)


def test_trace_ids_are_the_hash_of_their_parts() -> None:
    """The ids hash on from a cached prefix state: the same bytes as hashing the whole text (every rank and
    every recording so far computed them that way), pinned here by value too."""
    def whole(*parts: object) -> int:
        text = "\x1f".join(str(part) for part in parts)
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=16).digest(), "big") or 1

    for seq in (1, 2, 15, 10**12):
        gid = "0a912f293f14942c"
        assert schema.collective_trace_id("job-7", gid, seq) == whole("coll", "job-7", gid, seq)
        assert schema.p2p_trace_id("job-7", "g", 3, 5, seq) == whole("p2p", "job-7", "g", 3, 5, seq)
    assert schema.collective_trace_id("j", "g", 1) == whole("coll", "j", "g", 1) == 0xd0a2f7897d296f47098efa6b8f8885a5
    of_seq = schema.collective_trace_ids("job-7", "0a912f293f14942c")  # the runtime's per-group form
    for seq in (1, 2, 15, 10**12, 0, -3):
        assert of_seq(seq) == schema.collective_trace_id("job-7", "0a912f293f14942c", seq)


def _contract_names() -> dict[str, str]:
    prefixes = ("RES_", "SPAN_", "ATTR_")
    return {name: getattr(schema, name) for name in dir(schema) if name.startswith(prefixes)}


def test_every_contract_name_is_documented_in_the_table() -> None:
    text = DOC.read_text()
    cell = r"((?:[^|\\]|\\.)*)"  # a cell: anything but an unescaped '|'
    rows = re.findall(rf"^\| `([^`]+)` \| {cell} \| {cell} \|", text, flags=re.M)
    assert {name for name, _, _ in rows} == set(_contract_names().values())
    undocumented = [name for name, _, meaning in rows if not meaning.strip()]
    assert not undocumented, f"give these a meaning in docs/gen_schema.py or schema.py: {undocumented}"


@pytest.mark.slow
def test_schema_page_is_current() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_schema", DOC.parent / "gen_schema.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.render() == DOC.read_text(), "run: python docs/gen_schema.py"


def test_no_component_retypes_a_contract_string() -> None:
    """Every component imports its keys from mycroft.schema; string literals of them are a bug."""
    root = Path(__file__).resolve().parent.parent
    names = {value for value in _contract_names().values() if value.startswith("mycroft.")}
    offenders = []
    for folder in ("instrumentation", "collector_processor", "rca_service", "native", "mycroft"):
        for path in (root / folder).rglob("*.py"):
            if path.name == "schema.py":
                continue
            source = path.read_text()
            for name in names:
                if f'"{name}"' in source or f"'{name}'" in source:
                    offenders.append(f"{path.relative_to(root)}: {name}")
    assert not offenders, offenders
