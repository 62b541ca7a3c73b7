"""abort_job on the 8-rank 3D job (TP 2 x PP 2 x DP 2, gloo) under a real `mycroft rca serve --actions`.

mode act: a block or a deadlock in the 1F1B pipeline -> a critical trusted verdict -> every rank
prints `mycroft: aborting: ... (incident <id>)` and exits 75 within 5 s of the verdict (every
worker process gone, polled in /proc; exit codes from torchrun's error summary). A healthy job
that checkpoints (rank 0 saves 2-4 s while the others wait in a barrier, 3 times) runs to exit 0
under the same acting policy with no action of any kind recorded and no directive published.
The harness is benchmarks/abort_latency.py (which measures the same on more faults and runs).
The frozen (SIGSTOPped) rank may be its host's elected directive poller: it keeps the poller's flock,
so another rank of the host takes the next lock of the chain and polls in its place.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import abort_latency as harness

pytestmark = pytest.mark.slow

NPROC = 8


@pytest.fixture(scope="module")
def acting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    service = harness.Service("act", str(tmp_path_factory.mktemp("rca-act")))
    try:
        yield service
    finally:
        service.stop()


def _why(run: Any) -> str:
    return json.dumps({k: v for k, v in run.figures().items() if k != "actions"}, default=str)[-4000:]


@pytest.mark.parametrize(("fault", "seed"), [("block", 11), ("deadlock", 12)])
def test_act_every_rank_of_the_3d_job_leaves_within_5s_of_the_verdict(acting: Any, tmp_path: Path, fault: str,
                                                                       seed: int) -> None:
    run = harness.run_fault(acting, "3d", fault, random.Random(seed), str(tmp_path))
    assert run.onset is not None, _why(run)
    assert run.critical_at is not None and run.incident is not None, _why(run)
    assert run.action is not None and run.action["mode"] == "act" and run.action["result"] == "done", _why(run)
    # every worker process is gone, the last one within 5 s of the critical verdict
    assert sorted(run.rank_gone_at) == list(range(NPROC)), _why(run)
    assert run.all_gone_at is not None and run.all_gone_at - run.critical_at < 5.0, _why(run)
    # every rank said why, naming the incident, and left with the directive's exit code
    assert sorted(run.lines) == list(range(NPROC)), _why(run)
    assert all(run.incident["id"] in line for line in run.lines.values()), _why(run)
    assert run.exit_codes == dict.fromkeys(range(NPROC), harness.EXIT_CODE), _why(run)
    assert run.torchrun_code not in (0, None), _why(run)
    assert run.ok, _why(run)


def test_act_healthy_checkpointing_3d_job_runs_to_the_end_untouched(acting: Any, tmp_path: Path) -> None:
    run = harness.run_healthy(acting, "checkpoint", random.Random(13), str(tmp_path))
    assert run.torchrun_code == 0, _why(run)
    assert run.actions == [], _why(run)
    assert not run.lines, _why(run)
    assert run.ok, _why(run)


def test_act_every_rank_leaves_when_the_frozen_rank_is_the_hosts_poller(acting: Any, tmp_path: Path) -> None:
    run = harness.run_fault(acting, "3d", "sigstop@poller", random.Random(14), str(tmp_path))
    assert run.onset is not None and run.critical_at is not None, _why(run)
    assert run.poller_rank == run.rank, _why(run)
    assert run.all_gone_at is not None and run.all_gone_at - run.critical_at < 5.0, _why(run)
    assert sorted(run.lines) == [r for r in range(NPROC) if r != run.rank], _why(run)
