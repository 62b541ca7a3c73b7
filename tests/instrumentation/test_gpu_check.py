"""benchmarks/gpu_check.py: its decisions and checks, on synthetic spans and on this GPU-less machine.

The whole script also runs on the CPU simulator (`--backend nccl_like`, ~2 min here: every
check passes, see docs/instrumentation.md); these tests keep its logic honest cheaply.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mycroft import schema
from mycroft.otlp import SpanRecord

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
assert spec and spec.loader
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


def _span(kind: str, rank: int, trace: int, span_id: int, start: float, end: float, parent: int = 0,
          **attrs: Any) -> SpanRecord:
    return SpanRecord(trace_id=trace, span_id=span_id, parent_span_id=parent, name="x", start_ns=int(start * 1e9),
                      end_ns=int(end * 1e9), attributes={schema.ATTR_SPAN_KIND: kind, schema.ATTR_RANK: rank, **attrs})


def _env(**kw: Any) -> dict[str, Any]:
    base = {"torch": "2.13.0", "cuda_available": True, "nccl_available": True, "gpus": 1, "_nccl_tuple": (2, 30, 3),
            "nccl_version": "2.30.3"}
    return {**base, **kw}


def test_what_can_run_follows_the_nccl_version_and_the_gpus() -> None:
    assert "no CUDA" in gpu_check.why_not(_env(cuda_available=False), "nccl")
    assert "older than 2.27" in gpu_check.why_not(_env(_nccl_tuple=(2, 21, 5), nccl_version="2.21.5"), "nccl")
    assert gpu_check.why_not(_env(), "nccl") is None
    assert gpu_check.why_not(_env(cuda_available=False), "nccl_like") is None
    layout, how = gpu_check.two_rank_layout(_env(), "nccl")
    assert layout and layout["NCCL_MULTI_RANK_GPU_ENABLE"] == "1" and layout["NCCL_P2P_DISABLE"] == "1"
    layout, how = gpu_check.two_rank_layout(_env(_nccl_tuple=(2, 28, 3), nccl_version="2.28.3"), "nccl")
    assert layout is None and "< 2.30" in how
    layout, how = gpu_check.two_rank_layout(_env(gpus=2, _nccl_tuple=(2, 28, 3)), "nccl")
    assert layout and "NCCL_MULTI_RANK_GPU_ENABLE" not in layout and "2 GPUs" in how


def test_join_long_kernel_and_timing_checks_pass_and_fail_on_what_they_claim() -> None:
    py = [_span(schema.KIND_COLLECTIVE, r, 10 + s, 100 * r + s, 1.0 * s, 1.0 * s + (0.31 if s == 3 else 0.01),
                **{schema.ATTR_SEQ: s, schema.ATTR_TIMING: schema.TIMING_DEVICE_POLLED})
          for r in (0, 1) for s in range(1, 6)]
    native = [_span(schema.KIND_NATIVE_COLL, p.rank, p.trace_id, 1000 + p.span_id, p.start_ns / 1e9,
                    p.end_ns / 1e9, parent=p.span_id, **{schema.ATTR_SEQ: p.attributes[schema.ATTR_SEQ]}) for p in py]
    reports = [{"rank": 0, "kernel_call_s": 0.001}, {"rank": 1, "kernel_call_s": 0.002}]
    assert gpu_check.check_join(py + native)["ok"]
    assert gpu_check.check_long_kernel(py + native, reports, 3, 0.3)["ok"]
    assert gpu_check.check_device_timing(py)["ok"]
    # a native span in a trace of its own (unmapped communicator) is not joined
    stray = [_span(schema.KIND_NATIVE_COLL, 0, 999, 5, 0, 1, parent=77, **{schema.ATTR_SEQ: 1}) for _ in range(3)]
    assert not gpu_check.check_join(py + native + stray * 2)["ok"]
    # a call that blocked for the kernel, or a span that ended at enqueue, fails the long-kernel check
    assert not gpu_check.check_long_kernel(py + native, [{"rank": 0, "kernel_call_s": 0.3}], 3, 0.3)["ok"]
    assert not gpu_check.check_long_kernel(py + native, reports, 2, 0.3)["ok"]
    mixed = [*py, _span(schema.KIND_COLLECTIVE, 0, 1, 1, 0, 1, **{schema.ATTR_TIMING: schema.TIMING_EXACT})]
    assert not gpu_check.check_device_timing(mixed)["ok"]
    beat = _span(schema.KIND_HEARTBEAT, 0, 1, 2, 0, 1, **{schema.ATTR_HB_GROUP_FR_COMPLETED: [-1, 7]})
    assert gpu_check.check_frontier([beat])["ok"]
    assert not gpu_check.check_frontier([_span(schema.KIND_HEARTBEAT, 0, 1, 2, 0, 1)])["ok"]
    assert gpu_check.verdict({"a": {"ok": True}, "b": {"ok": None}}) == "pass"
    assert gpu_check.verdict({"a": {"ok": True}, "b": {"ok": False}}) == "fail"
    assert gpu_check.verdict({"b": {"ok": None}}) == "skipped"


def test_plugin_and_event_checks_read_the_rank_reports() -> None:
    reports = [{"rank": r, "ring": {"comms": [{"api_version": 6}], "kinds": {"coll_done": 3, "kernel_channel": 3,
                                                                            "flow_done": 6}}} for r in (0, 1)]
    assert gpu_check.check_plugin(reports, 2) == {**gpu_check.check_plugin(reports, 2), "ok": True, "abi_versions": [6]}
    assert not gpu_check.check_plugin([reports[0], {"rank": 1, "ring": {"exists": False}}], 2)["ok"]
    spans = [_span(schema.KIND_NATIVE_COLL, 0, 1, 1, 0, 1)]
    assert gpu_check.check_events(reports, spans, expect_flows=True)["ok"]
    no_flows = [{"rank": 0, "ring": {"comms": [{}], "kinds": {"coll_done": 3, "kernel_channel": 3}}}]
    result = gpu_check.check_events(no_flows, spans, expect_flows=True)
    assert not result["ok"] and "flow_done" in result["detail"]


@pytest.mark.slow  # a subprocess that imports torch
def test_on_a_machine_without_a_gpu_it_says_so_and_skips() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["verdict"] == "skipped" and result["ran_on_gpu"] is False
    assert "no CUDA" in result["reason"] and result["checks"] == {}


def test_abi_expected_per_nccl_version_and_the_default_kernel_channel_mask() -> None:
    assert [gpu_check.expected_abi(v) for v in ((2, 27, 3), (2, 28, 9), (2, 29, 7), (2, 30, 7), (2, 31, 2))] == [
        4, 5, 6, 6, 7]
    assert gpu_check.expected_abi(None) is None
    assert gpu_check.kernel_channels_by_default(6) and not gpu_check.kernel_channels_by_default(7)
    assert gpu_check.why_not(_env(_nccl_tuple=(2, 31, 2), nccl_version="2.31.2"), "nccl") is None
    reports = [{"rank": r, "ring": {"comms": [{"api_version": 6}]}} for r in (0, 1)]
    assert gpu_check.check_plugin(reports, 2, (2, 30, 7))["ok"]
    wrong = gpu_check.check_plugin(reports, 2, (2, 31, 2))  # 2.31 must have picked v7
    assert not wrong["ok"] and wrong["abi_expected"] == 7 and "expected v7" in wrong["detail"]
    # 2.31's default mask: no kernel-channel records expected, and any that come are a failure
    spans = [_span(schema.KIND_NATIVE_COLL, 0, 1, 1, 0, 1)]
    no_kch = [{"rank": 0, "ring": {"kinds": {"coll_done": 3, "flow_done": 6}}}]
    assert gpu_check.check_events(no_kch, spans, expect_flows=True, expect_kernel=False)["ok"]
    assert not gpu_check.check_events(no_kch, spans, expect_flows=True)["ok"]
    with_kch = [{"rank": 0, "ring": {"kinds": {"coll_done": 3, "flow_done": 6, "kernel_channel": 3}}}]
    assert not gpu_check.check_events(with_kch, spans, expect_flows=True, expect_kernel=False)["ok"]


def test_chain_check_matches_ranks_by_pid_and_fails_on_foreign_handles_or_missed_calls() -> None:
    reports = [{"rank": r, "ring": {"path": f"/dev/shm/mycroft-nccl-{100 + r}", "kinds": {"coll_done": 40}}}
               for r in (0, 1)]
    counts = [{"pid": 100 + r, "inits": 1, "starts": {"2": 41}, "bad_ctx": 0, "bad_handle": 0, "bad_parent": 0}
              for r in (0, 1)]
    assert gpu_check.check_chain(reports, counts, 2)["ok"]
    assert not gpu_check.check_chain(reports, counts[:1], 2)["ok"]  # rank 1's chained plugin never ran
    assert not gpu_check.check_chain(reports, [counts[0], {**counts[1], "bad_handle": 2}], 2)["ok"]
    assert not gpu_check.check_chain(reports, [counts[0], {**counts[1], "starts": {"2": 39}}], 2)["ok"]


def test_inspector_check_needs_its_dumps_and_mycroft_records(tmp_path: Path) -> None:
    reports = [{"rank": 0, "ring": {"kinds": {"coll_done": 5}}}]
    assert not gpu_check.check_inspector(reports, tmp_path / "none")["ok"]
    (tmp_path / "dump").mkdir()
    (tmp_path / "dump" / "rank0.log").write_text('{"coll": "AllReduce"}\n')
    assert gpu_check.check_inspector(reports, tmp_path / "dump")["ok"]
    assert not gpu_check.check_inspector([{"rank": 0, "ring": {"kinds": {}}}], tmp_path / "dump")["ok"]
