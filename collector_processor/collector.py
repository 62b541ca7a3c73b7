"""The embedded collector: the Mycroft processor behind fixed OTLP ports, as a managed subprocess.

`mycroft collector run` and the demo both use EmbeddedCollector. Two engines host the
processor behind the same ports and flags:

- standalone (the default: docs/collector.md has the measurement that decided it):
  `mycroft processor serve` in this interpreter;
- rotel: the rotel agent from the `rotel` wheel (the optional `collector` extra) with our
  processor file loaded into its embedded CPython, one OTLP gRPC exporter (a local ExportTee
  when there are several `--export` endpoints: rotel alpha takes one trace exporter).

rotel's agent links `libpython3.X.so` and embeds whichever the loader finds; its standard
library must come from the same CPython. The environment points rotel at this interpreter's
own base (its libpython directory first on LD_LIBRARY_PATH, PYTHONHOME), so the embedded
interpreter is the one the venv was made from. Where rotel still cannot host the processor
(not installed, no loadable libpython, the processor does not load inside it), engine "rotel"
says why in one line (`notice()`) and starts the standalone engine instead.
`start()` returns once the engine accepts OTLP and the processor is loaded; `stop()` ends it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import site
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Final, Literal

from mycroft.otlp_server import split_host_port

from .config import COLLECTOR_OTLP_GRPC, COLLECTOR_OTLP_HTTP, ProcessorConfig
from .export import grpc_target
from .tee import ExportTee

ROTEL_VERSION = "0.0.1a15"  # the pinned wheel (pyproject extra `collector`)
PROCESSOR_FILE = Path(__file__).with_name("rotel_processor.py")
# another rotel agent binary (e.g. one built for this platform); the wheel's by default
ROTEL_AGENT_ENV: Final = "MYCROFT_ROTEL_AGENT"

Engine = Literal["standalone", "rotel"]
ENGINES: Final[tuple[Engine, ...]] = ("standalone", "rotel")
# what `mycroft collector run` and the demo use unless told: benchmarks/collector_hosts.py measured
# the standalone processor at more spans/s, the same CPU per span and heartbeats through in a tenth of
# rotel's latency, for about 10 MB more memory (docs/collector.md)
DEFAULT_ENGINE: Final[Engine] = "standalone"


class CollectorError(RuntimeError):
    """The collector is missing or did not come up; the message says what to do."""


class RotelUnavailable(CollectorError):
    """rotel cannot host the processor here; `reason` is one line, the message has rotel's output."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}\n{detail}" if detail else reason)
        self.reason = reason


def rotel_binary() -> Path:
    """The rotel agent: $MYCROFT_ROTEL_AGENT, else the one inside the installed `rotel` wheel."""
    override = os.environ.get(ROTEL_AGENT_ENV)
    if override:
        if not os.access(override, os.X_OK):
            raise RotelUnavailable(f"{ROTEL_AGENT_ENV}={override} is not an executable file")
        return Path(override)
    try:
        import rotel  # noqa: F401  (only to locate the package)
    except ImportError as exc:
        raise RotelUnavailable("rotel is not installed: pip install 'mycroft-tracing[collector]' "
                               f"(pins rotel=={ROTEL_VERSION})") from exc
    from rotel import __file__ as rotel_init

    binary = Path(rotel_init).with_name("rotel-agent")
    if not binary.exists():
        raise RotelUnavailable(f"rotel is installed but its agent binary is missing: {binary}")
    return binary


def embedded_python_env() -> dict[str, str]:
    """LD_LIBRARY_PATH / PYTHONHOME that give rotel's embedded CPython this interpreter's own base:
    its shared libpython and its standard library, so the venv's compiled packages match it.
    {} when this CPython has no shared libpython (rotel then embeds whatever libpython the loader
    finds, if any, with that CPython's own standard library)."""
    soname = sysconfig.get_config_var("INSTSONAME")
    if not sysconfig.get_config_var("Py_ENABLE_SHARED") or not soname:
        return {}
    # LIBDIR is where it was built for; a relocated CPython (uv, conda) keeps it under its prefix
    for libdir in (sysconfig.get_config_var("LIBDIR"), os.path.join(sys.base_exec_prefix, "lib")):
        if libdir and os.path.isfile(os.path.join(libdir, soname)):
            home = sys.base_prefix if sys.base_exec_prefix == sys.base_prefix \
                else f"{sys.base_prefix}{os.pathsep}{sys.base_exec_prefix}"
            return {"LD_LIBRARY_PATH": libdir, "PYTHONHOME": home}
    return {}


def failure_reason(output: str, fallback: str) -> str:
    """The one line of rotel's output that says why it failed (the loader's or Python's error)."""
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", output).splitlines() if line.strip()]
    for line in reversed(lines):
        if re.search(r"error|panicked|cannot|undefined symbol", line, re.IGNORECASE):
            return re.sub(r"^\S+Z\s+[A-Z]+\s+", "", line)[:300]  # rotel's timestamp and level
    return (lines[-1] if lines else fallback)[:300]


def _wait_port(host: str, port: int, deadline: float, proc: subprocess.Popen[bytes], name: str) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CollectorError(f"{name} exited with code {proc.returncode} while starting")
        try:
            with socket.create_connection((host if host not in ("0.0.0.0", "::", "") else "127.0.0.1", port),
                                          timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise CollectorError(f"{name} did not listen on {host}:{port} in time")


class EmbeddedCollector:
    """The Mycroft processor listening on OTLP gRPC/HTTP, exporting to `exports`, hosted by rotel or
    standalone (`engine`; "rotel" falls back to standalone where rotel cannot host it; `engine_used` says
    which runs)."""

    def __init__(self, exports: Sequence[str], otlp_grpc: str = COLLECTOR_OTLP_GRPC,
                 otlp_http: str = COLLECTOR_OTLP_HTTP, config: ProcessorConfig | None = None,
                 workdir: str | os.PathLike[str] | None = None, batch_timeout: str = "100ms",
                 log_to: IO[bytes] | None = None, engine: Engine = DEFAULT_ENGINE) -> None:
        if not exports:
            raise ValueError("at least one --export endpoint is required")
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        for endpoint in exports:
            grpc_target(endpoint)  # validates
        self.exports = list(exports)
        self.otlp_grpc = otlp_grpc
        self.otlp_http = otlp_http
        self.config = config or ProcessorConfig()
        self.engine: Engine = engine
        self.engine_used: Literal["rotel", "standalone"] | None = None
        self.fallback_reason: str | None = None  # why engine "rotel" runs standalone
        self._own_workdir = workdir is None
        self._final_stats: dict[str, object] = {}  # what stats() said when stop() removed our temp workdir
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="mycroft-collector-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.batch_timeout = batch_timeout
        self.stats_file = self.workdir / "processor-stats.json"
        self.flush_file = self.workdir / "flush-request"
        self.log_file = self.workdir / "rotel.log"
        self._log_to = log_to
        self._log_handle: IO[bytes] | None = None
        self._out_path = self.workdir / "rotel.out"
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

    def describe(self) -> str:
        """What hosts the processor, in words (for the one line the CLI and the demo print)."""
        if self.engine_used == "rotel":
            return f"rotel {ROTEL_VERSION} + Mycroft processor"
        if self.engine_used == "standalone":
            return "standalone Mycroft processor (mycroft processor serve)"
        return "not started"

    def notice(self) -> str | None:
        """One line when engine "rotel" fell back to the standalone processor, else None."""
        if self.fallback_reason is None:
            return None
        return (f"rotel cannot host the processor here ({self.fallback_reason}); "
                "running the standalone processor behind the same ports")

    # ------------------------------------------------------------------ rotel
    def command(self) -> list[str]:
        """rotel's command line."""
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
        """rotel's environment: this interpreter's base as its embedded CPython, the venv's packages."""
        env = {key: value for key, value in os.environ.items()
               if not key.startswith("ROTEL_") and key not in ("VIRTUAL_ENV", "PYTHONHOME")}
        # an activated venv puts its python first on PATH; rotel's embedded CPython would find its home
        # through it (pyvenv.cfg) and load this interpreter's standard library into another CPython's
        # libpython (ImportError: _ssl ... undefined symbol)
        if sys.prefix != sys.base_prefix:
            venv_bin = os.path.realpath(os.path.join(sys.prefix, "bin"))
            env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                          if p and os.path.realpath(p) != venv_bin)
        host = embedded_python_env()
        if host:  # this CPython's own libpython first, and its standard library with it
            env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, (host["LD_LIBRARY_PATH"],
                                                                   env.get("LD_LIBRARY_PATH"))))
            env["PYTHONHOME"] = host["PYTHONHOME"]
        # give the embedded interpreter this interpreter's packages
        # (site directories only: its standard library is its base's)
        paths = [*site.getsitepackages(), site.getusersitepackages(),
                 *(p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages")))]
        env["MYCROFT_PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p and os.path.isdir(p)))
        host_name, port = split_host_port(self.otlp_http)
        env["MYCROFT_LOOPBACK"] = f"http://{'127.0.0.1' if host_name in ('0.0.0.0', '::') else host_name}:{port}"
        env["MYCROFT_PROCESSOR_CONFIG"] = json.dumps(dataclasses.asdict(self.config))
        env["MYCROFT_PROCESSOR_STATS"] = str(self.stats_file)
        env["MYCROFT_PROCESSOR_FLUSH"] = str(self.flush_file)
        return env

    # ------------------------------------------------------------------ standalone
    def standalone_command(self) -> list[str]:
        """`mycroft processor serve` on the same ports, exports and processor config."""
        command = [sys.executable, "-m", "mycroft.cli", "processor", "serve",
                   "--otlp-grpc", self.otlp_grpc, "--otlp-http", self.otlp_http]
        for endpoint in self.exports:
            command += ["--export", endpoint]
        # the standalone twin of rotel's MYCROFT_PROCESSOR_BUSY: where shedding starts
        backlog = os.environ.get("MYCROFT_PROCESSOR_MAX_BACKLOG")
        if backlog:
            command += ["--max-backlog", backlog]
        return [*command, "--config-json", json.dumps(dataclasses.asdict(self.config)),
                "--stats-file", str(self.stats_file), "--flush-file", str(self.flush_file), "--log-level", "WARNING"]

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 60.0) -> EmbeddedCollector:
        """Start the engine; rotel gets half of `timeout` before the standalone processor replaces it."""
        if self.proc is not None:
            raise CollectorError("already started")
        if self.engine == "rotel":
            try:
                self._start_rotel(timeout / 2)
                self.engine_used = "rotel"
                return self
            except RotelUnavailable as exc:
                self.fallback_reason = exc.reason
        self._start_standalone(timeout)
        self.engine_used = "standalone"
        return self

    def _spawn(self, command: list[str], env: dict[str, str], out_name: str) -> subprocess.Popen[bytes]:
        self.stats_file.unlink(missing_ok=True)
        self.flush_file.unlink(missing_ok=True)
        self._out_path = self.workdir / out_name
        out: IO[bytes] | int
        if self._log_to is not None:
            out = self._log_to
        else:
            self._log_handle = open(self._out_path, "wb")  # noqa: SIM115 (closed in stop)
            out = self._log_handle
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def _wait_loaded(self, name: str, deadline: float, settle_s: float) -> None:
        """Both ports accept, the process is still up `settle_s` later, and the processor has written
        its first stats (rotel holds its pipeline until the module is imported: seconds on a busy host)."""
        assert self.proc is not None
        for address in (self.otlp_grpc, self.otlp_http):
            host, port = split_host_port(address)
            _wait_port(host, port, deadline, self.proc, name)
        time.sleep(settle_s)
        while not self.stats_file.exists():
            if self.proc.poll() is not None:
                raise CollectorError(f"{name} exited with code {self.proc.returncode} while starting")
            if time.monotonic() > deadline:
                raise CollectorError(f"the Mycroft processor did not load inside {name} in time")
            time.sleep(0.05)

    def _start_rotel(self, timeout: float) -> None:
        if len(self.exports) > 1:
            self.tee = ExportTee(self.exports).start()
        try:
            command = self.command()
            self.proc = self._spawn(command, self.environment(), "rotel.out")
            # rotel binds its receivers before it validates the exporter config: settle 0.3 s
            self._wait_loaded("rotel", time.monotonic() + timeout, settle_s=0.3)
        except CollectorError as exc:
            self._halt()
            if isinstance(exc, RotelUnavailable):
                raise
            tail = self.output_tail()
            raise RotelUnavailable(failure_reason(tail, str(exc)),
                                   f"{exc}; see {self.workdir / 'rotel.out'}:\n{tail}") from None

    def _start_standalone(self, timeout: float) -> None:
        self.proc = self._spawn(self.standalone_command(), dict(os.environ), "processor.out")
        try:
            self._wait_loaded("mycroft processor serve", time.monotonic() + timeout, settle_s=0.0)
        except CollectorError as exc:
            self._halt()
            raise CollectorError(f"the standalone processor failed to start: {exc}; see {self._out_path}:\n"
                                 f"{self.output_tail()}") from None

    def flush(self, timeout: float = 5.0) -> bool:
        """Ask the processor to close every open window now (summaries of what is still open,
        condensed detail) and wait until it has handed them on for export."""
        if not self.running():
            return False
        self.flush_file.touch()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.running():
            if self.stats().get("flushed"):
                return True
            time.sleep(0.05)
        return False

    def stop(self, timeout: float = 10.0) -> int | None:
        """Flush the processor's windows, then SIGTERM (both engines flush their exporters), SIGKILL
        after `timeout`; returns the exit code. A work directory this object made is removed (its
        last counters stay readable through stats())."""
        if self.proc is not None and self.proc.poll() is None:
            self.flush()
            if self.engine_used == "rotel":
                time.sleep(0.3)  # rotel's batch timeout (100 ms) + export of the flushed spans
        code = self._halt(timeout)
        if code is not None and self._own_workdir:
            self._final_stats = self.stats()
            shutil.rmtree(self.workdir, ignore_errors=True)
        return code

    def _halt(self, timeout: float = 10.0) -> int | None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
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
        return proc.returncode if proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stats(self) -> dict[str, object]:
        """The processor's counters / gauges as it last wrote them ({} before the first)."""
        try:
            return dict(json.loads(self.stats_file.read_text()))
        except (OSError, ValueError):
            return dict(self._final_stats)

    def output_tail(self, lines: int = 30) -> str:
        """The last lines the engine printed (rotel.out or processor.out in the work directory)."""
        try:
            text = self._out_path.read_text(errors="replace")
        except OSError:
            return ""
        text = re.sub(r"\x1b\[[0-9;]*m", "", text)
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> EmbeddedCollector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
