"""`mycroft simulate` at small N through a real `mycroft rca serve` process over OTLP/gRPC."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow  # real processes, seconds each
@pytest.mark.parametrize("compression", ["none", "gzip"])  # gzip: what an OTel Collector's otlp exporter sends
def test_a_blocked_rank_of_256_is_the_root_cause_over_the_real_path(compression: str) -> None:
    out = subprocess.run([sys.executable, "-m", "mycroft.cli", "simulate", "--ranks", "256", "--tp", "8",
                          "--fault", "block", "--fault-rank", "77", "--seconds", "9", "--warmup", "4",
                          "--prebuild-s", "3", "--compression", compression],
                         capture_output=True, text=True, timeout=180, cwd=str(REPO))
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["verdict"] == "hang" and result["right"], result
    assert result["verdict_root_causes"][0] == ["not_entered", 77]
    assert result["heartbeats_lost"] == 0 and result["false_incidents_before_fault"] == 0, result
    assert 0 < result["detected_s"] < 4.0, result
    assert result["offered_heartbeats_s"] > 200 and result["heartbeat_bytes_per_rank_s"] > 500


def test_nccl_faults_need_a_data_parallel_ring_of_three() -> None:
    from mycroft.faults.simulate import main

    with pytest.raises(SystemExit, match="data-parallel ring of at least 3"):
        main(["--ranks", "64", "--tp", "8", "--pp", "8", "--fault", "all"])
    with pytest.raises(SystemExit, match="nic_down"):
        main(["--ranks", "32", "--tp", "8", "--pp", "2", "--fault", "nic_down,block"])
