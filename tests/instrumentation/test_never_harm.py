"""Never harm training: collector down, no torch.distributed, instrument in code, restore torch."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from mycroft import schema
from tests.conftest import BIN, free_port, instrumented_env, run_torchrun

JOBS = Path(__file__).parent / "jobs"


def _step_times(out: Path) -> list[float]:
    times: list[float] = []
    for path in out.glob("steptimes-*.txt"):
        times.extend(float(value) for value in path.read_text().split()[5:])  # skip warm-up steps
        path.unlink()
    return times


@pytest.mark.slow
def test_collector_down_training_completes_at_full_speed(tmp_path: Path) -> None:
    closed = free_port()  # nothing listens there
    args = ("--steps", "150", "--size", "4096", "--step-sleep", "0.002", "--out", str(tmp_path))
    pairs: list[tuple[list[float], list[float]]] = []
    for index in range(3):  # interleaved, alternating who goes first, to share the machine's noise
        plain: list[float] = []
        traced: list[float] = []
        for instrumented in ((False, True) if index % 2 == 0 else (True, False)):
            if not instrumented:
                base = run_torchrun(JOBS / "blocking.py", 2, instrumented_env(None), *args, instrumented=False)
                assert base.returncode == 0, base.stderr[-2000:]
                plain += _step_times(tmp_path)
                continue
            env = instrumented_env(closed, MYCROFT_HEARTBEAT_INTERVAL="0.1", OTEL_EXPORTER_OTLP_TIMEOUT="2")
            run = run_torchrun(JOBS / "blocking.py", 2, env, *args)
            assert run.returncode == 0, run.stderr[-2000:]
            traced += _step_times(tmp_path)
            assert "span export failed" in run.stderr or "export queue full" in run.stderr
            assert run.stderr.count("span export failed") <= 2  # said once per rank, not per batch
        pairs.append((plain, traced))
    # A loose bound: the benchmark measures the real overhead; this catches blocking or retry
    # stalls, which slow every pair. On a 2-vCPU machine shared with other test runs, load swings
    # of minutes can shift one pair's medians by a third (seen: 1.35 with load average 13), so
    # the best pair is held to the bound and the middle one to a looser one.
    ratios = sorted(statistics.median(t) / statistics.median(p) for p, t in pairs)
    assert ratios[0] < 1.3 and ratios[1] < 1.6, ratios
    assert max(t for _, traced in pairs for t in traced) < 1.0  # no step ever waited on the exporter's retries


@pytest.mark.slow
def test_script_without_torch_distributed_runs_as_before(tmp_path: Path) -> None:
    env = instrumented_env(free_port())
    plain = subprocess.run([sys.executable, str(JOBS / "no_dist.py")], env=env, capture_output=True, text=True)
    traced = subprocess.run([str(BIN / "opentelemetry-instrument"), sys.executable, str(JOBS / "no_dist.py")],
                            env=env, capture_output=True, text=True, timeout=60)
    assert plain.returncode == traced.returncode == 3
    assert "RESULT 6.0" in traced.stdout
    assert "THREADS []" in traced.stdout  # no background thread without torch.distributed
    assert "PATCHED True" in traced.stdout and "PATCHED False" in plain.stdout
    assert "mycroft" not in traced.stderr.lower()


@pytest.mark.slow
def test_instrument_in_code_with_own_tracer_provider_and_uninstrument_restores_torch(tmp_path: Path) -> None:
    script = tmp_path / "in_code.py"
    script.write_text(f'''
import json, torch, torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.distributed._functional_collectives as funcol
from torch.nn.parallel import DistributedDataParallel as DDP
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.resources import Resource
from mycroft.instrumentation.instrumentor import MycroftInstrumentor

originals = {{name: getattr(dist, name) for name in ("all_reduce", "send", "batch_isend_irecv", "init_process_group")}}
originals["c10d.all_reduce"] = c10d.all_reduce
originals["funcol.all_reduce"] = funcol.all_reduce
originals["ddp.init"] = DDP.__init__
exporter = InMemorySpanExporter()
provider = TracerProvider(resource=Resource.create({{"service.name": "in-code"}}))
provider.add_span_processor(SimpleSpanProcessor(exporter))
instrumentor = MycroftInstrumentor()
instrumentor.instrument(tracer_provider=provider)
assert dist.all_reduce is not originals["all_reduce"] and dist.all_reduce is c10d.all_reduce
dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
t = torch.ones(4)
dist.all_reduce(t)
dist.all_reduce(t, async_op=True).wait()
import time; time.sleep(0.5)
instrumentor.uninstrument()
names = ("all_reduce", "send", "batch_isend_irecv", "init_process_group")
restored = all(getattr(dist, n) is originals[n] for n in names)
restored = restored and c10d.all_reduce is originals["c10d.all_reduce"]
restored = restored and funcol.all_reduce is originals["funcol.all_reduce"]
restored = restored and DDP.__init__ is originals["ddp.init"]
dist.all_reduce(t)  # not traced any more
names = [s.name for s in exporter.get_finished_spans()]
services = {{s.resource.attributes.get("service.name") for s in exporter.get_finished_spans()}}
dist.destroy_process_group()
import os
threads = [open(f"/proc/self/task/{{task}}/comm").read().strip() for task in os.listdir("/proc/self/task")]
print(json.dumps({{"names": names, "restored": restored, "services": sorted(services), "threads": threads}}))
''')
    env = instrumented_env(None)
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    import json

    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["restored"] is True
    assert report["names"].count("all_reduce") == 2
    assert schema.SPAN_HEARTBEAT in report["names"]  # the final heartbeat at uninstrument
    assert report["services"] == ["in-code"]  # the user's resource is kept
    # tracing holds no process group: destroy_process_group stopped gloo's threads. A group kept
    # alive ran them into interpreter shutdown, where one could abort the process at exit.
    assert not [name for name in report["threads"] if "gloo" in name], report["threads"]


@pytest.mark.parametrize("value", ["abc", "-1"])
def test_malformed_configuration_falls_back_to_defaults(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    from mycroft.instrumentation.config import MycroftConfig

    monkeypatch.setenv("MYCROFT_HEARTBEAT_INTERVAL", value)
    monkeypatch.setenv("MYCROFT_QUEUE_SIZE", value)
    config = MycroftConfig.from_env()
    assert config.heartbeat_interval_s == 1.0 and config.queue_size == 65536
