"""The README's first command (`./dev.sh demo` -> `mycroft demo`), short: 2 ranks, the fault on a
chosen rank, through the demo's collector. Asserts on the verdict and the trace file it leaves,
not on how the collector line is worded."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN, REPO

pytestmark = pytest.mark.slow  # an RCA service, a collector and a 2-rank torchrun job


def test_demo_names_the_blocked_rank_and_leaves_a_replayable_trace(tmp_path: Path) -> None:
    rank = 1
    demo = subprocess.run([str(BIN / "mycroft"), "demo", "--nproc", "2", "--fault", "block", "--rank", str(rank),
                           "--seed", "5", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=240, cwd=str(REPO))
    out = demo.stdout
    assert demo.returncode == 0, (out[-3000:], demo.stderr[-3000:])
    assert re.search(r"^INCIDENT \S+\s+kind=hang\s+status=firing", out, re.M), out
    assert re.search(rf"injected: block on rank {rank} at step \d+\s+-> verdict CORRECT", out), out
    assert f"ROOT CAUSE: rank {rank}: not_entered" in out, out
    # the trace file the demo points at replays to the same root cause offline
    found = re.search(r"traces: (\S+\.otlp\.json)\s+\((\d+) spans", out)
    assert found is not None and int(found.group(2)) > 0, out
    trace = Path(found.group(1))
    assert trace.parent == tmp_path and trace.is_file()
    replay = subprocess.run([str(BIN / "mycroft"), "rca", "analyze", "--otlp-json", str(trace), "--format", "json"],
                            capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert replay.returncode == 2, replay.stderr[-3000:]  # 2: a firing incident (rca_service/cli.py)
    report = json.loads(replay.stdout)
    hangs = [i for i in report["incidents"] if i["kind"] == "hang"]
    assert hangs and hangs[0]["root_causes"][0]["rank"] == rank, report["incidents"]
    assert hangs[0]["root_causes"][0]["kind"] == "not_entered"
