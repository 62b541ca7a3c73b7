"""The embedded collector: rotel with the Mycroft processor loaded, as a managed subprocess.

`mycroft collector run` and the demo both use EmbeddedCollector: it finds the rotel
agent binary shipped in the `rotel` wheel (the optional `collector` extra), starts it
in the foreground with our processor file, one OTLP gRPC exporter per `--export`
endpoint (rotel fans out), and the environment the processor needs inside rotel's
embedded interpreter. `start()` returns once rotel accepts OTLP; `stop()` ends it.

rotel alpha takes one trace exporter: with several endpoints, rotel exports to an
ExportTee in this process, which copies every request to each endpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import site
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from mycroft.otlp_server import split_host_port

from .config import COLLECTOR_OTLP_GRPC, COLLECTOR_OTLP_HTTP, ProcessorConfig
from .export import grpc_target
from .tee import ExportTee

ROTEL_VERSION = "0.0.1a15"  # the pinned wheel (pyproject extra `collector`)
PROCESSOR_FILE = Path(__file__).with_name("rotel_processor.py")


class CollectorError(RuntimeError):
    """rotel is missing or did not come up; the message says what to do."""


def rotel_binary() -> Path:
    """The rotel agent inside the installed `rotel` wheel."""
    try:
        import rotel  # noqa: F401  (only to locate the package)
    except ImportError as exc:
        raise CollectorError("rotel is not installed: pip install 'mycroft-tracing[collector]' "
                             f"(pins rotel=={ROTEL_VERSION})") from exc
    from rotel import __file__ as rotel_init

    binary = Path(rotel_init).with_name("rotel-agent")
    if not binary.exists():
        raise CollectorError(f"rotel is installed but its agent binary is missing: {binary}")
    return binary


def _wait_port(host: str, port: int, deadline: float, proc: subprocess.Popen[bytes]) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CollectorError(f"rotel exited with code {proc.returncode} while starting")
        try:
            with socket.create_connection((host if host not in ("0.0.0.0", "::", "") else "127.0.0.1", port),
                                          timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise CollectorError(f"rotel did not listen on {host}:{port} in time")


class EmbeddedCollector:
    """rotel + the Mycroft processor, listening on OTLP gRPC/HTTP, exporting to `exports`."""

    def __init__(self, exports: Sequence[str], otlp_grpc: str = COLLECTOR_OTLP_GRPC,
                 otlp_http: str = COLLECTOR_OTLP_HTTP, config: ProcessorConfig | None = None,
                 workdir: str | os.PathLike[str] | None = None, batch_timeout: str = "100ms",
                 log_to: IO[bytes] | None = None) -> None:
        if not exports:
            raise ValueError("at least one --export endpoint is required")
        for endpoint in exports:
            grpc_target(endpoint)  # validates
        self.exports = list(exports)
        self.otlp_grpc = otlp_grpc
        self.otlp_http = otlp_http
        self.config = config or ProcessorConfig()
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="mycroft-collector-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.batch_timeout = batch_timeout
        self.stats_file = self.workdir / "processor-stats.json"
        self.log_file = self.workdir / "rotel.log"
        self._log_to = log_to
        self._log_handle: IO[bytes] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.tee: ExportTee | None = None

    @property
    def rotel_export(self) -> str:
        """The one endpoint rotel itself exports to: the only --export, or the local tee."""
        if len(self.exports) == 1:
            endpoint = self.exports[0]
            return endpoint if "://" in endpoint else f"http://{endpoint}"
        if self.tee is None:
            raise CollectorError("the export tee is not started")
        return self.tee.endpoint

    # ------------------------------------------------------------------ command
    def command(self) -> list[str]:
        return [
            str(rotel_binary()), "start",
            "--otlp-grpc-endpoint", self.otlp_grpc,
            "--otlp-http-endpoint", self.otlp_http,
            "--otlp-with-trace-processor", str(PROCESSOR_FILE),
            "--otlp-receiver-metrics-disabled", "--otlp-receiver-logs-disabled",
            "--exporter", "otlp",
            "--otlp-exporter-endpoint", self.rotel_export,
            "--otlp-exporter-protocol", "grpc",
            "--otlp-exporter-compression", "none",  # a local hop: CPU matters more than bytes
            "--traces-batch-timeout", self.batch_timeout,
            "--pid-file", str(self.workdir / "rotel.pid"),
            "--log-file", str(self.log_file),
        ]

    def rotel_env(self) -> dict[str, str]:
        """The same configuration as environment variables only (otel-config/rotel/rotel.env):
        each `rotel start` flag as its ROTEL_* variable, plus the processor's MYCROFT_* ones."""
        env: dict[str, str] = {}
        args = self.command()[2:]
        i = 0
        while i < len(args):
            flag = args[i]
            has_value = i + 1 < len(args) and not args[i + 1].startswith("--")
            if flag not in ("--pid-file", "--log-file"):
                env["ROTEL_" + flag.lstrip("-").replace("-", "_").upper()] = args[i + 1] if has_value else "true"
            i += 2 if has_value else 1
        env.update({k: v for k, v in self.environment().items() if k in (
            "MYCROFT_PYTHONPATH", "MYCROFT_LOOPBACK")})
        return env

    def environment(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items()
               if not key.startswith("ROTEL_") and key not in ("VIRTUAL_ENV", "PYTHONHOME")}
        # an activated venv puts its python first on PATH; rotel's embedded CPython finds its home
        # through it (pyvenv.cfg) and would load this interpreter's standard library, not its own
        # (ImportError: _ssl ... undefined symbol)
        if sys.prefix != sys.base_prefix:
            venv_bin = os.path.realpath(os.path.join(sys.prefix, "bin"))
            env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                          if p and os.path.realpath(p) != venv_bin)
        # rotel's embedded CPython is the system one: give it this interpreter's packages
        # (site directories only: its own standard library must stay its own)
        paths = [*site.getsitepackages(), site.getusersitepackages(),
                 *(p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages")))]
        env["MYCROFT_PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p and os.path.isdir(p)))
        host, port = split_host_port(self.otlp_http)
        env["MYCROFT_LOOPBACK"] = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
        env["MYCROFT_PROCESSOR_CONFIG"] = json.dumps(dataclasses.asdict(self.config))
        env["MYCROFT_PROCESSOR_STATS"] = str(self.stats_file)
        env["MYCROFT_PROCESSOR_FLUSH"] = str(self.workdir / "flush-request")
        return env

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 60.0) -> EmbeddedCollector:
        if self.proc is not None:
            raise CollectorError("already started")
        self.stats_file.unlink(missing_ok=True)
        (self.workdir / "flush-request").unlink(missing_ok=True)
        if len(self.exports) > 1:
            self.tee = ExportTee(self.exports).start()
        out: IO[bytes] | int
        if self._log_to is not None:
            out = self._log_to
        else:
            self._log_handle = open(self.workdir / "rotel.out", "wb")  # noqa: SIM115 (closed in stop)
            out = self._log_handle
        self.proc = subprocess.Popen(self.command(), env=self.environment(), stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        try:
            for address in (self.otlp_grpc, self.otlp_http):
                host, port = split_host_port(address)
                _wait_port(host, port, deadline, self.proc)
            # rotel binds its receivers before it validates the exporter config: make sure
            # it is still up a moment later
            time.sleep(0.3)
            if self.proc.poll() is not None:
                raise CollectorError(f"rotel exited with code {self.proc.returncode} while starting")
            # rotel holds batches until the processor module is imported (seconds on a busy
            # machine); the processor's first stats write says it is loaded
            while not self.stats_file.exists():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise CollectorError("the Mycroft processor did not load inside rotel")
                time.sleep(0.05)
        except CollectorError:
            self.stop()
            raise CollectorError(f"rotel failed to start; see {self.workdir / 'rotel.out'}:\n"
                                 f"{self.output_tail()}") from None
        return self

    def flush(self, timeout: float = 5.0) -> bool:
        """Ask the processor inside rotel to close every open window now (summaries of what is
        still open, condensed detail) and wait until it has handed them to rotel."""
        if not self.running():
            return False
        (self.workdir / "flush-request").touch()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.running():
            if self.stats().get("flushed"):
                return True
            time.sleep(0.05)
        return False

    def stop(self, timeout: float = 10.0) -> int | None:
        """Flush the processor's windows, then SIGTERM (rotel flushes its exporter), SIGKILL after
        `timeout`; returns the exit code."""
        proc = self.proc
        if proc is None:
            if self.tee is not None:
                self.tee.stop()
                self.tee = None
            return None
        if proc.poll() is None:
            self.flush()
            time.sleep(0.3)  # rotel's batch timeout (100 ms) + export of the flushed spans
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        if self.tee is not None:
            self.tee.stop()
            self.tee = None
        return proc.returncode

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stats(self) -> dict[str, object]:
        """The processor's counters / gauges as last written inside rotel ({} before the first)."""
        try:
            return dict(json.loads(self.stats_file.read_text()))
        except (OSError, ValueError):
            return {}

    def output_tail(self, lines: int = 30) -> str:
        try:
            text = (self.workdir / "rotel.out").read_text(errors="replace")
        except OSError:
            return ""
        text = re.sub(r"\x1b\[[0-9;]*m", "", text)
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> EmbeddedCollector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
