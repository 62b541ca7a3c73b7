"""Nothing of Mycroft's in the user's objects: save, load, deep-copy and state_dict as without it.

One real 2-rank gloo job (jobs/user_objects.py) runs plain and under `opentelemetry-instrument`
with every MYCROFT_DDP_HOOK setting; every attempt (torch.save + torch.load, copy.deepcopy of a
DDP model, its optimizer and its state, an FSDP2 model and its state_dict, a DTensor, a process
group, a Work) must end the same way, and every state_dict must be the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mycroft.instrumentation.patching import DDP_API

from mycroft import schema
from tests.conftest import SpanSink, instrumented_env, run_torchrun

JOBS = Path(__file__).parent / "jobs"
WORLD = 2
# what plain torch 2.13 can save and copy: Mycroft must not take any of it away
MUST_WORK = ("ddp.save_load", "ddp.deepcopy", "ddp.deepcopy.step", "ddp.module.save_load", "ddp.module.deepcopy",
             "optimizer.save_load", "optimizer.deepcopy", "optimizer.state_dict.save_load",
             "optimizer.state_dict.deepcopy", "fsdp2.state_dict.save_load", "fsdp2.state_dict.deepcopy",
             "fsdp2.optimizer.state_dict.save_load", "fsdp2.optimizer.state_dict.deepcopy",
             "dtensor.save_load", "dtensor.deepcopy")


def _reports(out: Path) -> list[dict[str, dict[str, object]]]:
    reports = [json.loads((out / f"objects-{rank}.json").read_text()) for rank in range(WORLD)]
    for rank in range(WORLD):
        (out / f"objects-{rank}.json").unlink()
    return reports


@pytest.mark.slow
def test_user_objects_save_copy_and_state_dict_as_without_mycroft(
        tmp_path: Path, otlp_sink: tuple[SpanSink, int]) -> None:
    sink, port = otlp_sink
    env = instrumented_env(port, MYCROFT_HEARTBEAT_INTERVAL="0.2")
    plain_run = run_torchrun(JOBS / "user_objects.py", WORLD, env, "--out", str(tmp_path), instrumented=False)
    assert plain_run.returncode == 0, plain_run.stderr[-3000:]
    plain = _reports(tmp_path)
    for rank, report in enumerate(plain):
        outcomes = report["outcomes"]
        assert all(outcomes[name] == "ok" for name in MUST_WORK), (rank, outcomes)
        digests = report["digests"]
        for name in ("ddp", "ddp.module", "optimizer", "fsdp2.state_dict", "dtensor"):
            assert digests[f"{name}.save_load"] == digests[f"{name}.deepcopy"] == digests[name], name

    for hook in ("auto", "0", "1"):
        run = run_torchrun(JOBS / "user_objects.py", WORLD, {**env, "MYCROFT_DDP_HOOK": hook},
                           "--out", str(tmp_path))
        assert run.returncode == 0, (hook, run.stderr[-3000:])
        traced = _reports(tmp_path)
        for rank in range(WORLD):
            outcomes, expected = traced[rank]["outcomes"], plain[rank]["outcomes"]
            differing = {name: (expected.get(name), outcomes.get(name))
                         for name in set(expected) | set(outcomes) if expected.get(name) != outcomes.get(name)}
            assert not differing, (hook, rank, differing)  # (plain, instrumented)
            # the same parameters, buffers and optimizer state, to the byte, in every copy
            digests, expected_digests = traced[rank]["digests"], plain[rank]["digests"]
            assert digests == expected_digests, (hook, rank, [k for k in expected_digests
                                                              if digests.get(k) != expected_digests[k]])
    # Mycroft really traced those runs: DDP's all-reduces went through its hook when asked
    spans = sink.snapshot()
    assert any(s.name == schema.SPAN_HEARTBEAT for s in spans)
    ddp_spans = [s for s in spans if s.attributes.get(schema.ATTR_API) == DDP_API]
    assert ddp_spans, "MYCROFT_DDP_HOOK=1 put no DDP bucket span out"
