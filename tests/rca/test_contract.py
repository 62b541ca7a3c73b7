"""Issue 44: the typed, single-meaning span contract (schema.CONTRACT) and the receiver checking it."""

from __future__ import annotations

import random

from mycroft.rca_service.config import AnalysisConfig
from mycroft.rca_service.ingest.state import CONTRACT_REFUSED, apply_records

from mycroft import schema
from mycroft.faults.bigjob import BigJob, Layout
from mycroft.faults.nccl_model.cluster import Cluster, plan
from mycroft.faults.simfaults import plan as sim_plan
from mycroft.otlp import SpanRecord


def test_every_attribute_has_a_wire_type_and_a_unit_in_the_contract() -> None:
    names = [n for n, v in vars(schema).items() if n.startswith(("ATTR_", "RES_")) and isinstance(v, str)]
    missing = [n for n in names if n not in schema.CONTRACT]
    assert not missing, f"untyped attributes (add them to schema._CONTRACT_TABLE): {missing}"
    kinds = {kind for kind, _ in schema.CONTRACT.values()}
    assert kinds <= {"string", "int", "double", "bool", "string[]", "int[]", "double[]", "bool[]"}, kinds


def test_ages_s_has_one_meaning_and_the_flow_identities_are_stated() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs"))
    import gen_schema

    page = gen_schema.render()
    assert "seconds since the flow started" not in page  # the old, second meaning
    assert page.count("last moved") >= 2
    for needed in ("*global* (torch) ranks", "commHash", "seq offset", "snapshot"):
        assert needed in page, needed


def test_contract_problems_names_wrong_types_and_ragged_tables() -> None:
    ok = {schema.ATTR_HB_COMM_S: 1.5, schema.ATTR_HB_OPS_DONE: 3, schema.ATTR_HB_FLOW_COMMS: ["a", "b"],
          schema.ATTR_HB_FLOW_DONE: [1, 2], schema.ATTR_HB_FLOW_SENDS: [True, False]}
    assert schema.contract_problems(ok) == []
    bad = dict(ok, **{schema.ATTR_HB_OPS_DONE: 3.5, schema.ATTR_HB_FLOW_DONE: [1],
                      schema.ATTR_HB_FLOW_SENDS: [1, 0]})
    problems = schema.contract_problems(bad)
    assert any(schema.ATTR_HB_OPS_DONE in p for p in problems)
    assert any(schema.ATTR_HB_FLOW_DONE in p and "long" in p for p in problems)
    assert any(schema.ATTR_HB_FLOW_SENDS in p and "bool" in p for p in problems)


def _heartbeats_of_both_models() -> list[SpanRecord]:
    c = Cluster(layout="dp", fault=plan("slow_link_one_way", 5), seconds=12.0, seed=5)
    rng = random.Random(1)
    out = [c.heartbeat("m", r, 10.3, 1, 1.0, rng) for r in range(c.world)]
    job = BigJob("b", Layout(64, 8, 1), 10, 1.0, fault=sim_plan("nic_bw_limit", 64, 8, 3))
    job.fault_at = 1.0
    job.tick(2.0)
    out += [job.record(r, 2.0) for r in range(64)]
    return out


def test_both_models_send_what_the_contract_says() -> None:
    beats = _heartbeats_of_both_models()
    assert sum(1 for b in beats if schema.ATTR_HB_FLOW_COMMS in b.attributes) >= 8
    for beat in beats:
        assert schema.contract_problems(beat.attributes) == [], beat.attributes


def test_the_receiver_drops_a_ragged_flow_table_and_keeps_the_heartbeat() -> None:
    beat = next(b for b in _heartbeats_of_both_models() if schema.ATTR_HB_FLOW_COMMS in b.attributes)
    rank = int(beat.attributes[schema.ATTR_RANK])  # type: ignore[arg-type]
    beat.attributes[schema.ATTR_HB_FLOW_DONE] = list(beat.attributes[schema.ATTR_HB_FLOW_DONE])[:-1]  # type: ignore[arg-type]
    beat.resource = {schema.RES_JOB_ID: "ragged", schema.RES_RANK: rank, schema.RES_WORLD_SIZE: 32}
    jobs: dict = {}
    rejected: dict[str, int] = {}
    apply_records(jobs, [beat], 1.8e9 + 10.4, AnalysisConfig(), use_span_time=True, rejected=rejected)
    job = jobs["ragged"] if "ragged" in jobs else next(iter(jobs.values()))
    state = job.ranks[rank]
    assert state.hb_counter == 1 and state.flows == {}  # folded, without the table it could misread
    assert rejected[CONTRACT_REFUSED] == 1
