"""A straggler in a DDP job is named, with DDP's own all-reduce (the default) and with the comm hook.

The RCA names a straggler from each rank's compute / wait split (the heartbeats' comm_s and
ops_done). By default DDP keeps its C++ reducer's all-reduce (no comm hook, for its cost): the
recorder times the reducer's end-of-backward wait instead (instrumentation/ddp_wait.py); without
that a DDP rank read as computing all of its time and a straggler was named by no rule. With
MYCROFT_DDP_HOOK=1 each bucket is timed on the training thread. The slow rank sleeps (a data
loader's way) or computes (a throttled device's way).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from mycroft.faults.inject import kill_tree, local_rca
from mycroft.faults.scoring import diagnose
from tests.conftest import instrumented_env, torchrun_command

JOB = Path(__file__).parent / "jobs" / "ddp_straggler.py"


@pytest.mark.slow
@pytest.mark.parametrize(("hook", "busy", "slow_rank"), [("auto", "0", 2), ("auto", "1", 1), ("1", "0", 2)],
                         ids=["builtin-sleeps", "builtin-computes", "hook-sleeps"])
def test_a_slow_rank_of_a_ddp_job_is_named_a_straggler(hook: str, busy: str, slow_rank: int) -> None:
    onset = os.path.join(tempfile.mkdtemp(prefix="mycroft-straggler-"), "onset.json")
    with local_rca() as rca:
        env = instrumented_env(None, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{rca.otlp_grpc}",
                               MYCROFT_HEARTBEAT_INTERVAL="0.5", MYCROFT_DDP_HOOK=hook, STRAGGLER_RANK=str(slow_rank),
                               STRAGGLER_BUSY=busy, STRAGGLER_EXTRA_S="0.06",
                               STRAGGLER_ONSET_FILE=onset)
        with subprocess.Popen(torchrun_command(JOB, 4), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True) as proc:
            try:
                deadline = time.time() + 90
                found: Any = None
                at = 0.0
                while time.time() < deadline and proc.poll() is None:
                    time.sleep(0.5)
                    if not os.path.exists(onset):
                        continue
                    at = json.loads(Path(onset).read_text())["onset"]
                    found = diagnose("straggler", slow_rank, at, rca.service.store.list_incidents(100, None))
                    if found.correct or found.settled_wrong:
                        break
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            finally:
                kill_tree(proc)
            seen = [(i["kind"], i["severity"], round(i["detected_at_unix"] - at, 2), i["summary"][:160])
                    for i in rca.service.store.list_incidents(100, None)]
    assert found is not None and found.correct, seen
    assert found.incident["kind"] == "slowdown" and found.false_alarms == 0, seen
