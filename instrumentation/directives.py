"""The rank side of `abort_job`: one long-poll per host, relayed to every rank of it, then a prompt exit.

The RCA service publishes an abort for a job (rca_service/incidents/directives.py, docs/actions.md). At
16,384 ranks a poll per rank would be 16k connections, so the ranks of one host elect one
poller: the rank holding an exclusive `flock` on a per-job file in /dev/shm (the kernel
releases it when that process dies, and another rank takes over within RETRY_LOCK_S). It
long-polls `GET {MYCROFT_CONTROL_ENDPOINT}/api/v1/directives?job=&run=&after=&wait=&host=`
(authenticated like ingest: MYCROFT_CONTROL_TOKEN, else the OTLP exporter's
`authorization` header) and writes what it gets to a per-job file beside the lock (atomic
rename). Every rank's runtime thread stats that file each tick (~2 us) and, on an abort for
its job and run, leaves: one line on stderr naming the root cause, a final heartbeat, its
process groups aborted (bounded in time), and `os._exit` with the directive's exit code, so
torchrun's elastic restart or the scheduler's requeue takes over.

A job's files on a host (lock, successor locks, relay file, acks, one member file per rank) go with
the job: each rank removes its member file when it leaves (its runtime's shutdown, or the abort
after its host has gathered), and the last one to leave removes the rest; files of jobs whose
ranks all died (SIGKILL, a node reboot keeps no /dev/shm) are swept by the next job that starts
on the host.

No control endpoint configured -> nothing polls (ranks that reach the service only through
a collector cannot receive aborts; the service records such an abort as undeliverable).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mycroft.instrumentation.control_discovery import OtlpTarget, ask, otlp_target
from mycroft.instrumentation.startup import host_identity
from mycroft.instrumentation.thread_names import name_this_thread

log = logging.getLogger("mycroft.instrumentation")

ENV_CONTROL_ENDPOINT = "MYCROFT_CONTROL_ENDPOINT"
ENV_CONTROL_TOKEN = "MYCROFT_CONTROL_TOKEN"
ENV_RELAY_DIR = "MYCROFT_RELAY_DIR"
POLL_WAIT_S = 30.0  # the service holds a poll this long at most (it caps it too)
RETRY_LOCK_S = 2.0  # a rank that is not the poller tries to become it this often
BACKOFF_S = 5.0  # after a failed poll
DEFAULT_EXIT_CODE = 75
MAX_POLLER_GENERATIONS = 4  # successors of a frozen poller per host
DISCOVERY_RETRY_S = 30.0  # a poller whose OTLP endpoint did not say where the control API is asks again
HOST_GATHER_S = 3.0  # how long a leaving rank waits for its host's other live ranks to have read the abort
ABORT = "abort"


@dataclass(frozen=True, slots=True)
class Control:
    endpoint: str  # "" until found at `discover` (the poller thread asks: control_discovery.ask)
    token: str
    discover: OtlpTarget | None = None


def control_from_env(env: Mapping[str, str]) -> Control | None:
    """Where to poll and with which token (pure): MYCROFT_CONTROL_ENDPOINT, else the OTLP endpoint to ask
    where the service's control API is; None when there is neither."""
    endpoint = env.get(ENV_CONTROL_ENDPOINT, "").strip().rstrip("/")
    target = None if endpoint else otlp_target(env)
    if not endpoint and target is None:
        return None
    token = env.get(ENV_CONTROL_TOKEN, "")
    if not token:
        headers = env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS", "")
        for item in headers.split(","):
            key, _, value = item.partition("=")
            value = urllib.parse.unquote(value.strip())
            if key.strip().lower() == "authorization" and value.lower().startswith("bearer "):
                token = value[7:].strip()
    return Control(endpoint, token, target)


FILE_PREFIX = "mycroft-"


def relay_dir(directory: str | None = None) -> str:
    """Where a host's relay files live: /dev/shm, else the temp dir (the fallback)."""
    return directory or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())


def relay_paths(job_id: str, directory: str | None = None) -> tuple[str, str]:
    """(lock file, directive file) of one job on this host."""
    base = relay_dir(directory)
    tag = hashlib.blake2b(job_id.encode(), digest_size=8).hexdigest()
    return os.path.join(base, f"{FILE_PREFIX}{tag}.lock"), os.path.join(base, f"{FILE_PREFIX}{tag}.directive")


def _job_files(directory: str) -> dict[str, list[str]]:
    """Every job's relay files in `directory`, by job tag (mycroft-<16 hex>.<anything>)."""
    found: dict[str, list[str]] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir(directory):
            if not entry.startswith(FILE_PREFIX):
                continue
            tag, dot, _ = entry[len(FILE_PREFIX):].partition(".")
            if dot and len(tag) == 16 and all(c in "0123456789abcdef" for c in tag):
                found.setdefault(tag, []).append(entry)
    return found


def _members(directory: str, entries: list[str], tag: str) -> tuple[list[int], list[str]]:
    """(pids of the job's live ranks on this host, member files of ranks gone) -- a stopped rank
    (SIGSTOP) is gone: it leaves with nobody (the abort kills it, the scheduler ends it)."""
    live: list[int] = []
    gone: list[str] = []
    marker = f"{FILE_PREFIX}{tag}.member."
    for entry in entries:
        if entry.startswith(marker):
            pid = entry[len(marker):]
            if pid.isdigit() and _running(int(pid)):
                live.append(int(pid))
            else:
                gone.append(entry)
    return live, gone


def _held(path: str) -> bool:
    """Does a live process hold this lock file's flock (a poller of a job without member files)?"""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def sweep_stale(directory: str | None = None, keep: str = "", min_age_s: float = 60.0) -> int:
    """Remove the relay files of jobs none of whose ranks on this host is alive; how many files.

    A job is stale when no member file names a running process, no process holds its poller
    lock, and none of its files changed within `min_age_s` (a job starting right now writes its
    member file first, but an older instrumentation writes none). `keep`: a tag never swept."""
    base = relay_dir(directory)
    removed = 0
    now = time.time()
    for tag, entries in _job_files(base).items():
        if tag == keep:
            continue
        live, _ = _members(base, entries, tag)
        if live:
            continue
        paths = [os.path.join(base, e) for e in entries]
        try:
            if any(now - os.stat(p).st_mtime < min_age_s for p in paths):
                continue
        except OSError:
            continue  # a file went meanwhile: its job is leaving or sweeping itself
        if any(_held(p) for p in paths if p.endswith(".lock") or ".lock." in p):
            continue
        for path in paths:
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed += 1
    return removed


def applies(directive: Mapping[str, Any], job_id: str, run_id: str, since_unix: float) -> bool:
    """Is this directive an abort of this process's job and run (pure)? One older than the process
    is a previous launch's: a relaunch under the same job id must not die of it."""
    if directive.get("action") != ABORT:
        return False
    job = str(directive.get("job", ""))
    if job != job_id and not job_id.startswith(job + "/"):
        return False
    run = str(directive.get("run") or "")
    if run and run_id and run != run_id:
        return False
    issued = directive.get("issued_at_unix")
    return not (isinstance(issued, (int, float)) and issued < since_unix)


def abort_line(directive: Mapping[str, Any]) -> str:
    reason = " ".join(str(directive.get("reason") or "the RCA service asked").split())[:400]
    incident = directive.get("incident")
    return f"mycroft: aborting: {reason}" + (f" (incident {incident})" if incident and
                                             str(incident) not in reason else "")


class DirectiveWatcher:
    """Polls (when this rank is its host's poller) and reads the host's relay file."""

    def __init__(self, control: Control, job_id: str, run_id: str, directory: str | None = None,
                 opener: Callable[..., Any] = urllib.request.urlopen) -> None:
        self.control = control
        self.job_id = job_id
        self.run_id = run_id
        self.started_unix = time.time()
        self.lock_path, self.relay_path = relay_paths(job_id, directory)
        self.directory = os.path.dirname(self.lock_path)
        self.tag = os.path.basename(self.lock_path)[len(FILE_PREFIX):].split(".", 1)[0]
        self.host = host_identity(os.environ)
        self.member_path = f"{self.directory}/{FILE_PREFIX}{self.tag}.member.{os.getpid()}"
        with contextlib.suppress(OSError):
            open(self.member_path, "w").close()  # first: a job with a live member is never swept
        with contextlib.suppress(Exception):
            sweep_stale(self.directory, keep=self.tag)
        self._left = False
        self._opener = opener
        self._lock_fd: int | None = None
        self._next_lock_try = 0.0
        self._seen_mtime = 0.0
        self._after = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.polls = 0
        self.failures = 0
        self._failure_logged = False
        self._discovery_logged = False
        self._ack: int | None = None  # a directive relayed to this host's ranks, acknowledged with the next poll

    # ------------------------------------------------------------------ every rank (runtime thread)
    def check(self) -> dict[str, Any] | None:
        """The abort for this process, if the host's relay file holds one (one stat per call)."""
        now = time.monotonic()
        if self._lock_fd is None and self._thread is None and now >= self._next_lock_try:
            self._next_lock_try = now + RETRY_LOCK_S
            self._try_become_poller()
        try:
            mtime = os.stat(self.relay_path).st_mtime
        except OSError:
            return None
        if mtime == self._seen_mtime:
            return None
        self._seen_mtime = mtime
        try:
            with open(self.relay_path, encoding="utf-8") as handle:
                directive = json.load(handle)
        except (OSError, ValueError):
            return None
        return directive if isinstance(directive, dict) and applies(directive, self.job_id, self.run_id,
                                                                     self.started_unix) else None

    def _try_become_poller(self) -> None:
        """Take the host's poller lock -- or its successor's, when the rank holding it is frozen or dead.

        A SIGSTOPped poller keeps its flock (the kernel frees it only when the process ends), so
        the lock file names its holder's pid: a rank that finds the holder stopped or gone takes
        the next lock of the chain (`<lock>.1`, `.2`, ...) and polls in its place.
        """
        for generation in range(MAX_POLLER_GENERATIONS):
            path = self.lock_path if generation == 0 else f"{self.lock_path}.{generation}"
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError:
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = _holder_pid(fd)
                os.close(fd)
                if holder is None or _running(holder):
                    return  # a live poller polls for the host
                continue  # frozen or gone: the next in the chain
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
            self._lock_fd = fd
            self._thread = threading.Thread(target=self._poll_loop, name="mycroft-directives", daemon=True)
            self._thread.start()
            return

    # ------------------------------------------------------------------ the host's poller
    def _find_endpoint(self) -> bool:
        """The control API, asked of the OTLP endpoint when none was configured (this thread only: the
        answer may take seconds); said once either way."""
        target = self.control.discover
        if self.control.endpoint or target is None:
            return bool(self.control.endpoint)
        found = ask(target, self.control.token)
        if found is None:
            if not self._discovery_logged:
                self._discovery_logged = True
                log.info("mycroft: %s:%d does not say where its control API is (a collector in front?): actions "
                         "cannot reach this job until %s is set; asking again every %.0f s",
                         target.host, target.port, ENV_CONTROL_ENDPOINT, DISCOVERY_RETRY_S)
            return False
        self.control = Control(found, self.control.token, target)
        log.info("mycroft: directives from %s (found at the OTLP endpoint %s:%d)", found, target.host, target.port)
        return True

    def _poll_loop(self) -> None:
        name_this_thread("mycroft-directiv")
        while not self._stop.is_set() and not self._find_endpoint():
            self._stop.wait(DISCOVERY_RETRY_S)
        while not self._stop.is_set():
            try:
                directive = self.poll_once()
            except Exception as exc:
                self.failures += 1
                if not self._failure_logged:
                    self._failure_logged = True
                    log.warning("mycroft: cannot poll %s for directives (%r); retrying every %.0f s, "
                                "further failures counted", self.control.endpoint, exc, BACKOFF_S)
                self._stop.wait(BACKOFF_S)
                continue
            if directive is not None:
                self._relay(directive)
                seq = directive.get("seq")
                if isinstance(seq, int):
                    self._ack = seq  # the next poll (at once) tells the service its ranks have it

    def poll_once(self, wait_s: float = POLL_WAIT_S) -> dict[str, Any] | None:
        fields: dict[str, Any] = {"job": self.job_id, "run": self.run_id, "after": self._after, "wait": int(wait_s),
                                  "host": self.host}
        acked = self._ack
        if acked is not None:
            fields["acked"] = acked
        query = urllib.parse.urlencode(fields)
        request = urllib.request.Request(f"{self.control.endpoint}/api/v1/directives?{query}")
        if self.control.token:
            request.add_header("Authorization", f"Bearer {self.control.token}")
        self.polls += 1
        with self._opener(request, timeout=wait_s + 10) as response:
            if acked is not None and self._ack == acked:
                self._ack = None  # the service has it (a failed poll keeps it for the next)
            if response.status == 204:
                return None
            directive = json.loads(response.read(1 << 16))
        if not isinstance(directive, dict):
            return None
        seq = directive.get("seq")
        if isinstance(seq, int) and seq > self._after:
            self._after = seq
        return directive

    def _relay(self, directive: dict[str, Any]) -> None:
        """Atomically replace the host's relay file: every rank of the host reads it."""
        if self._left:
            return  # the job's files are gone with its ranks: nothing to relay to
        tmp = f"{self.relay_path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(directive, handle)
        os.replace(tmp, self.relay_path)

    # ------------------------------------------------------------------ leaving together
    def acknowledge(self, directive: Mapping[str, Any]) -> None:
        """Mark this rank as having read the abort (a file per pid beside the relay file)."""
        with contextlib.suppress(OSError):
            open(_ack_prefix(self.relay_path, directive) + str(os.getpid()), "w").close()

    def wait_for_host(self, directive: Mapping[str, Any], local_ranks: int, timeout_s: float = HOST_GATHER_S) -> int:
        """Hold this rank until every live rank of its host has read the abort (or `timeout_s`).

        The launcher tears the job down when its first worker exits (torchrun SIGTERMs the
        rest), so a rank that leaves at once can silence a sibling whose runtime thread had
        not yet read the relay file: that sibling's log would lack the line naming the root
        cause. A frozen rank reads nothing: it is not waited for. Returns the ranks counted.
        """
        prefix = _ack_prefix(self.relay_path, directive)
        directory, name = os.path.split(prefix)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                acked = sum(1 for entry in os.listdir(directory) if entry.startswith(name))
            except OSError:
                return 0
            # the host's live ranks: its launcher's running workers, at most as many as it started
            expected = min(local_ranks, len(siblings(os.getppid())[0]) + 1)
            if acked >= expected or time.monotonic() >= deadline:
                self.stop()  # this rank leaves now: the host's files go with its last rank
                return acked
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None
        self.leave()

    def leave(self) -> bool:
        """This rank leaves the host's relay: its member file goes, and when no live rank of the job
        remains on the host (each removes its own file before it looks, so the last one to leave
        sees none), every file of the job goes too. True when this rank cleaned up."""
        if self._left:
            return False
        self._left = True
        with contextlib.suppress(OSError):
            os.unlink(self.member_path)
        entries = _job_files(self.directory).get(self.tag, [])
        live, _ = _members(self.directory, entries, self.tag)
        if live:
            return False
        for entry in entries:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.directory, entry))
        return True


    def sweep_after_kills(self, settle_s: float = 0.5) -> bool:
        """After this rank killed its frozen siblings (reap_stopped_siblings): the job's files go once no
        live rank of it is left on the host. A sibling SIGKILLed a moment ago reads as running while it
        dies, so a rank that left just before could not clean up: waited for up to settle_s. True when
        the files went."""
        deadline = time.monotonic() + settle_s
        while True:
            entries = _job_files(self.directory).get(self.tag, [])
            live, _ = _members(self.directory, entries, self.tag)
            if not [pid for pid in live if pid != os.getpid()]:
                for entry in entries:
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self.directory, entry))
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


def _ack_prefix(relay_path: str, directive: Mapping[str, Any]) -> str:
    """Acks are per directive: a relaunch under the same job id counts afresh."""
    tag = directive.get("seq", directive.get("issued_at_unix", ""))
    return f"{relay_path}.{tag}.ack."


def _holder_pid(fd: int) -> int | None:
    """The pid the lock's holder wrote into it (None: not written yet)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None


def _running(pid: int, proc: str = "/proc") -> bool:
    """The process exists and is not stopped (SIGSTOP), traced-stopped or a zombie."""
    try:
        with open(os.path.join(proc, str(pid), "stat"), encoding="ascii", errors="replace") as handle:
            state = handle.read().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("T", "t", "Z", "X")


def siblings(parent: int, proc: str = "/proc") -> tuple[list[int], list[int]]:
    """(running, stopped) processes of the same parent -- the launcher's other workers -- but this one."""
    running: list[int] = []
    stopped: list[int] = []
    with contextlib.suppress(OSError):
        for entry in os.listdir(proc):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(os.path.join(proc, entry, "stat"), encoding="ascii", errors="replace") as handle:
                    fields = handle.read().rsplit(")", 1)[-1].split()
            except OSError:
                continue
            if len(fields) > 1 and fields[1] == str(parent):
                if fields[0] in ("T", "t"):
                    stopped.append(int(entry))
                elif fields[0] not in ("Z", "X"):
                    running.append(int(entry))
    return running, stopped


def stopped_siblings(parent: int, proc: str = "/proc") -> list[int]:
    """Processes of the same parent (the launcher's other workers) that are stopped (SIGSTOP, state T)."""
    return siblings(parent, proc)[1]


def reap_stopped_siblings() -> int:
    """Kill the launcher's stopped workers: a frozen rank runs no code, so it cannot leave on the abort,
    and torchrun would wait its whole SIGTERM grace period (30 s) on it before restarting the job."""
    parent = os.getppid()
    if parent <= 1:
        return 0
    killed = 0
    for pid in stopped_siblings(parent):
        with contextlib.suppress(OSError):
            os.kill(pid, 9)
            killed += 1
    return killed


def abort_process_groups(timeout_s: float = 1.0) -> None:
    """Abort every process group (NCCL: communicator abort), bounded: a backend whose abort blocks
    must not keep a condemned rank alive."""

    def run() -> None:
        with contextlib.suppress(Exception):
            import torch.distributed.distributed_c10d as c10d

            for pg in list(c10d._world.pg_map):
                with contextlib.suppress(Exception):
                    pg.abort()

    worker = threading.Thread(target=run, name="mycroft-abort", daemon=True)
    worker.start()
    worker.join(timeout_s)
