"""Real training libraries from the registries, zero-code under `opentelemetry-instrument torchrun`:
one rank hangs at a point of a step, the RCA names it.

HF Accelerate (DDP through `Accelerator.prepare`), megatron-core (parallel_state groups with
`group_desc`, megatron DDP's bucketed grad reduce inside `_coalescing_manager`), DeepSpeed (ZeRO 2 on
its CPU accelerator, whose first init JIT-builds a C++ extension, ~75 s once), torchtitan (its
llama3 debug model, TP x FSDP2), PyTorch Lightning (`Trainer.fit` with strategy ddp, the block in
its step hooks) and the Transformers `Trainer` (DDP with find_unused_parameters, whose lazily waited
unused-parameter all-reduce reads in flight on every rank) are installed by the set-up
(examples/frameworks/README.md); where one is missing its test skips on a plain pytest and fails
under CI / ./dev.sh test (tests/components.py).
"""

from __future__ import annotations

import subprocess
import threading
import time
from typing import Any

import pytest

from mycroft.faults.inject import free_port, kill_tree, local_rca
from mycroft.faults.scoring import diagnose
from tests.components import require
from tests.conftest import BIN, REPO, instrumented_env

pytestmark = pytest.mark.slow

EXAMPLES = REPO / "examples" / "frameworks"
CASES = [  # (script, its options, module that must be importable, rank, step, point)
    ("accelerate_ddp.py", (), "accelerate", 1, 4, "between_fwd_bwd"),
    ("megatron_core_tp_dp.py", ("--tp", "2"), "megatron.core", 3, 3, "before_step"),
    ("deepspeed_zero.py", ("--stage", "2"), "deepspeed", 2, 12, "before_forward"),
    ("torchtitan_llama3_tp_fsdp.py", ("--tp", "2"), "torchtitan", 0, 3, "between_fwd_bwd"),
    ("lightning_ddp.py", (), "lightning", 1, 6, "before_step"),
    ("hf_trainer.py", (), "transformers", 2, 7, "between_fwd_bwd"),
]


def _watch_output(proc: subprocess.Popen[str], marker: str, seen: dict[str, Any]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.setdefault("lines", []).append(line)
        if marker in line and "onset" not in seen:
            seen["onset"] = time.time()


@pytest.mark.parametrize("case", CASES, ids=[c[0].removesuffix(".py") for c in CASES])
def test_a_hung_rank_in_a_real_library_is_named(case: tuple[str, tuple[str, ...], str, int, int, str]) -> None:
    script, options, module, rank, step, point = case
    require(module)
    with local_rca() as rca:
        job = f"lib-{script.split('_')[0]}-{free_port()}"
        env = instrumented_env(None, MYCROFT_JOB_ID=job, MYCROFT_HEARTBEAT_INTERVAL="0.5", MYCROFT_STACK_AFTER="0.3",
                               OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{rca.otlp_grpc}", DS_ACCELERATOR="cpu")
        command = [str(BIN / "opentelemetry-instrument"), str(BIN / "torchrun"), "--nproc-per-node", "4",
                   "--master-port", str(free_port()), str(EXAMPLES / script), *options, "--steps", "100000",
                   "--block-rank", str(rank), "--block-step", str(step), "--block-point", point]
        seen: dict[str, Any] = {}
        with subprocess.Popen(command, env=env, cwd=str(EXAMPLES), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True) as proc:
            reader = threading.Thread(target=_watch_output, args=(proc, f"rank {rank}: blocking", seen), daemon=True)
            reader.start()
            try:
                deadline = time.time() + 300
                found = None
                while time.time() < deadline and proc.poll() is None:
                    if "onset" in seen:
                        found = diagnose("block", rank, seen["onset"] - 1.0, rca.incidents(job))
                        if found.correct:
                            break
                    time.sleep(0.2)
            finally:
                kill_tree(proc)
        output = "".join(seen.get("lines", []))[-4000:]
        assert "onset" in seen, output
        assert found is not None and found.correct, (rca.incidents(job), output)
        latency = found.incident["detected_at_unix"] - seen["onset"]
        assert latency < 20, latency
