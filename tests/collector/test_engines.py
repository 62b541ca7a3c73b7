"""Which engine hosts the processor behind `mycroft collector run` and the demo, and the fallback.

The standalone processor is the default; rotel is `--engine rotel`. rotel's agent links
libpython3.X.so and embeds it; the collector points it at this interpreter's own base
(LD_LIBRARY_PATH, PYTHONHOME), so it works with the venv activated. Where rotel cannot host the
processor, it says so in one line and runs `mycroft processor serve` behind the same ports. The
fallback tests use a copy of the real rotel agent whose libpython dependency names a version this
machine lacks: the loader refuses it exactly as on a host without that libpython.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from mycroft.collector_processor.collector import (
    ROTEL_AGENT_ENV,
    EmbeddedCollector,
    embedded_python_env,
    failure_reason,
    rotel_binary,
)
from mycroft.collector_processor.config import ProcessorConfig
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from mycroft import schema
from mycroft.faults import made_up_spans as syn
from mycroft.otlp import request_from_records
from tests.conftest import BIN, REPO, SpanSink, free_port

NOTICE = "rotel cannot host the processor here"


def activated(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment `source .venv/bin/activate` leaves (the venv's bin first on PATH, VIRTUAL_ENV),
    plus `extra`."""
    out = dict(os.environ)
    out.pop("PYTHONHOME", None)
    out["PATH"] = os.pathsep.join([os.path.join(sys.prefix, "bin"), out.get("PATH", "")])
    out["VIRTUAL_ENV"] = sys.prefix
    out.update(extra or {})
    return out


@pytest.fixture
def agent_without_libpython(tmp_path: Path) -> Path:
    """A copy of the installed rotel agent whose libpython dependency (e.g. libpython3.11.so.1.0)
    names a version no loader path has (libpython3.11.so.9.9)."""
    soname = sysconfig.get_config_var("INSTSONAME") or f"libpython{sys.version_info[0]}.{sys.version_info[1]}.so.1.0"
    data = rotel_binary().read_bytes()
    needed = soname.encode()
    assert data.count(needed) == 1, soname
    missing = re.sub(rb"\.so\.[0-9.]+$", lambda m: b".so." + b"9" * (len(m.group()) - 4), needed)
    assert len(missing) == len(needed) and missing != needed
    agent = tmp_path / "rotel-agent"
    agent.write_bytes(data.replace(needed, missing))
    agent.chmod(0o755)
    return agent


def _send_collective(grpc_address: str, job: str) -> None:
    t0 = 1_700_000_000_000_000_000
    spans = [syn.collective_span(rank, 7, t0 + rank * 1000, t0 + 10**7, job=job) for rank in range(4)]
    stub = trace_service_pb2_grpc.TraceServiceStub(grpc.insecure_channel(grpc_address))
    stub.Export(request_from_records(spans), timeout=10)


def _summaries(sink: SpanSink, job: str) -> int:
    return sum(1 for s in sink.snapshot() if s.name == schema.SPAN_COLLECTIVE_SUMMARY and s.job_id == job)


# ---------------------------------------------------------------------- without processes
def test_failure_reason_is_the_line_that_says_why() -> None:
    import_error = ("\x1b[2m2026-12-03T17:34:15.339546Z\x1b[0m \x1b[32m INFO\x1b[0m OTLP Receiver for logs disabled\n"
                    "\x1b[2m2026-12-03T17:34:15.459727Z\x1b[0m \x1b[31mERROR\x1b[0m Pipeline returned from run loop "
                    "with error \x1b[3merror\x1b[0m\x1b[2m=\x1b[0mImportError: /x/lib-dynload/_ssl.cpython-311-x86_64"
                    "-linux-gnu.so: undefined symbol: _PyModule_Add\n"
                    "\x1b[2m2026-12-03T17:34:15.459789Z\x1b[0m \x1b[33m WARN\x1b[0m Unexpected early exit of "
                    "pipeline.\n")
    assert failure_reason(import_error, "?") == ("Pipeline returned from run loop with error error=ImportError: "
                                                 "/x/lib-dynload/_ssl.cpython-311-x86_64-linux-gnu.so: undefined "
                                                 "symbol: _PyModule_Add")
    loader = ("/p/rotel-agent: error while loading shared libraries: libpython3.12.so.1.0: cannot open shared "
              "object file: No such file or directory\n")
    assert failure_reason(loader, "?") == loader.strip()
    assert failure_reason("", "rotel exited with code 1 while starting") == "rotel exited with code 1 while starting"


def test_rotel_embeds_this_interpreters_own_base(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/elsewhere")
    monkeypatch.setenv("PYTHONHOME", "/opt/other-python")
    env = EmbeddedCollector(["http://rca:4317"], engine="rotel").environment()  # rotel's
    host = embedded_python_env()
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        libdir = host["LD_LIBRARY_PATH"]
        assert os.path.isfile(os.path.join(libdir, sysconfig.get_config_var("INSTSONAME")))
        assert env["LD_LIBRARY_PATH"].split(os.pathsep) == [libdir, "/opt/elsewhere"]  # ours first
        assert env["PYTHONHOME"].split(os.pathsep)[0] == sys.base_prefix
    else:  # no shared libpython: rotel gets whatever the loader finds, and no foreign PYTHONHOME
        assert host == {} and "PYTHONHOME" not in env
    assert "VIRTUAL_ENV" not in env


def test_standalone_engine_gets_the_same_ports_exports_and_config() -> None:
    config = ProcessorConfig(window_s=3.0, max_detail_per_collective=77)
    collector = EmbeddedCollector(["http://rca:4317", "jaeger:4317"], "127.0.0.1:5317", "127.0.0.1:5318", config,
                                  engine="standalone")
    command = collector.standalone_command()
    assert command[:3] == [sys.executable, "-m", "mycroft.cli"] and command[3:5] == ["processor", "serve"]
    pairs = dict(zip(command[5::2], command[6::2], strict=False))
    assert pairs["--otlp-grpc"] == "127.0.0.1:5317" and pairs["--otlp-http"] == "127.0.0.1:5318"
    assert [command[i + 1] for i, arg in enumerate(command) if arg == "--export"] == ["http://rca:4317", "jaeger:4317"]
    assert ProcessorConfig(**json.loads(pairs["--config-json"])) == config
    with pytest.raises(ValueError, match="engine"):
        EmbeddedCollector(["http://rca:4317"], engine="docker")  # type: ignore[arg-type,unused-ignore]


# ---------------------------------------------------------------------- real processes
@contextmanager
def collector_run(tmp_path: Path, export: str, env: dict[str, str], *args: str) -> Iterator[dict[str, Any]]:
    """`mycroft collector run` as a user runs it; yields its ready document plus "stderr" (a path)."""
    grpc_address, http_address = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    stderr = tmp_path / "collector.stderr"
    command = [str(BIN / "mycroft"), "collector", "run", "--otlp-grpc", grpc_address, "--otlp-http", http_address,
               "--export", export, "--linger", "0.05", "--workdir", str(tmp_path / "work"), *args]
    with open(stderr, "w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True, cwd=str(REPO), env=env)
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()
        assert line.startswith("{"), (line, proc.wait(10), stderr.read_text())
        ready = dict(json.loads(line), grpc=grpc_address, stderr=stderr, proc=proc)
        yield ready
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        ready["code"] = proc.returncode
        ready["stopped"] = json.loads(out.strip().splitlines()[-1])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _through(tmp_path: Path, otlp_sink: tuple[SpanSink, int], env: dict[str, str], job: str,
             *args: str) -> dict[str, Any]:
    """One collective through `mycroft collector run ARGS`: its summary must come out."""
    sink, port = otlp_sink
    with collector_run(tmp_path, f"http://127.0.0.1:{port}", env, *args) as ready:
        _send_collective(ready["grpc"], job)
        assert sink.wait_for(lambda _: _summaries(sink, job) == 1, 20), [s.name for s in sink.snapshot()]
    assert ready["code"] == 0 and ready["stopped"]["counters"]["summaries"] == 1
    return ready


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["standalone", "rotel"])
def test_collector_run_with_the_venv_activated(tmp_path: Path, otlp_sink: tuple[SpanSink, int], engine: str) -> None:
    args = () if engine == "standalone" else ("--engine", engine)  # the default is the standalone processor
    ready = _through(tmp_path, otlp_sink, activated(), f"activated-{engine}", *args)
    assert ready["engine"] == engine
    assert NOTICE not in ready["stderr"].read_text()


@pytest.mark.slow
def test_collector_run_falls_back_when_rotel_cannot_load_its_libpython(
        tmp_path: Path, otlp_sink: tuple[SpanSink, int], agent_without_libpython: Path) -> None:
    env = activated({ROTEL_AGENT_ENV: str(agent_without_libpython)})
    ready = _through(tmp_path, otlp_sink, env, "fallback", "--engine", "rotel")
    assert ready["engine"] == "standalone"
    said = [line for line in ready["stderr"].read_text().splitlines() if NOTICE in line]
    assert len(said) == 1, ready["stderr"].read_text()
    assert "error while loading shared libraries: libpython" in said[0]


def _demo(tmp_path: Path, env: dict[str, str], *args: str) -> str:
    """A short `mycroft demo` (2 ranks, the fault at step 6) as `./dev.sh demo` runs it, ARGS added."""
    result = subprocess.run([str(BIN / "mycroft"), "demo", "--nproc", "2", "--rank", "1", "--step", "6",
                             "--out", str(tmp_path / "demo"), *args], env=env, cwd=str(REPO), capture_output=True,
                            text=True, timeout=240)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    assert "-> verdict CORRECT" in result.stdout, result.stdout
    return result.stdout


@pytest.mark.slow
@pytest.mark.parametrize(("args", "collector"), [
    ((), "standalone Mycroft processor (mycroft processor serve)"),
    (("--engine", "rotel"), "rotel 0.0.1a15 + Mycroft processor"),
])
def test_demo_with_the_venv_activated(tmp_path: Path, args: tuple[str, ...], collector: str) -> None:
    out = _demo(tmp_path, activated(), *args)
    (line,) = [line for line in out.splitlines() if line.startswith("  collector: ")]
    assert line.startswith(f"  collector: {collector} on 127.0.0.1:"), line
    assert NOTICE not in out


@pytest.mark.slow
def test_demo_falls_back_to_the_standalone_processor(tmp_path: Path, agent_without_libpython: Path) -> None:
    out = _demo(tmp_path, activated({ROTEL_AGENT_ENV: str(agent_without_libpython)}), "--engine", "rotel")
    (line,) = [line for line in out.splitlines() if line.startswith("  collector: ")]
    assert line.startswith("  collector: standalone Mycroft processor (mycroft processor serve) on 127.0.0.1:"), line
    assert NOTICE in line and "error while loading shared libraries" in line
    assert out.count(NOTICE) == 1


OTHER_VENVS = [p for p in os.environ.get("MYCROFT_TEST_OTHER_VENVS", "").split(os.pathsep) if p]


@pytest.mark.slow
@pytest.mark.skipif(not OTHER_VENVS, reason="set MYCROFT_TEST_OTHER_VENVS to venvs of other CPythons with "
                    "mycroft-tracing[collector] installed (docs/collector.md)")
@pytest.mark.parametrize("venv", OTHER_VENVS)
def test_collector_run_under_another_cpython(tmp_path: Path, otlp_sink: tuple[SpanSink, int], venv: str) -> None:
    """rotel's wheel for that CPython links its libpython3.X.so: activated, rotel hosts the processor
    (the default standalone engine needs nothing of rotel)."""
    sink, port = otlp_sink
    env = dict(os.environ, PATH=os.pathsep.join([os.path.join(venv, "bin"), os.environ.get("PATH", "")]),
               VIRTUAL_ENV=venv)
    env.pop("PYTHONPATH", None)
    command = [shutil.which("mycroft", path=os.path.join(venv, "bin")) or "mycroft", "collector", "run",
               "--otlp-grpc", f"127.0.0.1:{free_port()}", "--otlp-http", f"127.0.0.1:{free_port()}",
               "--export", f"http://127.0.0.1:{port}", "--linger", "0.05", "--engine", "rotel"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        assert ready["engine"] == "rotel", ready
        _send_collective(ready["otlp_grpc"], "other")
        assert sink.wait_for(lambda _: _summaries(sink, "other") == 1, 20)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and NOTICE not in err
