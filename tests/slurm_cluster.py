"""A real single-node SLURM cluster for the tests, started and stopped by the test itself.

    from tests.slurm_cluster import slurm_cluster  # noqa: F401   (the pytest fixture)

    def test_x(slurm_cluster):
        out = slurm_cluster.run("srun", "-n", "2", "hostname").stdout
        slurm_cluster.run("srun", "-n", "1", "env", env={"FOO": "1"})   # extra environment
        subprocess.run(["sbatch", ...], env=slurm_cluster.env)          # or any command
        slurm_cluster.root                                              # temp dir, cwd of run()
        slurm_cluster.node                                              # the node's name
        slurm_cluster.hostname                                          # this machine's (NodeHostname)

`start_slurm_cluster(node="node17")` names the node otherwise than the host (NodeName=node17
NodeHostname=<host>, slurmd -N node17), as clusters whose node names are not their host names do:
tasks then see SLURMD_NODENAME=node17, and scontrol / srun --exclude take node17. The fixture
`slurm_node17` is such a cluster.

Everything lives in a fresh temporary directory: a munge key and munged (its own socket,
named to SLURM by ``AuthInfo=socket=...``), slurm.conf, the controller's state, slurmd's
spool and the daemons' logs. slurmctld and slurmd run in the foreground (-D) as children of
the test; ``env`` carries ``SLURM_CONF`` so srun / sbatch / scontrol / sinfo / squeue reach
this cluster and no other. Teardown cancels every job, stops the daemons (SIGTERM, then
SIGKILL to their process groups), kills any process left that carries this cluster's
marker variable in its environment (slurmstepd and job tasks leave the daemons' process
groups) and removes the directory, also when start-up failed.

Needs root (SlurmUser=root, jobs run as root) and the Debian packages slurm-wlm and munge
(``./dev.sh setup`` installs them); the fixture skips with the reason otherwise.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

BINARIES = ("munged", "slurmctld", "slurmd", "slurmstepd", "srun", "sbatch", "scontrol",
            "scancel", "sinfo", "squeue")
MARKER = "MYCROFT_SLURM_CLUSTER"   # set in the daemons' and the clients' environment
STARTUP_TIMEOUT_S = 30.0
PARTITION = "debug"


def missing_requirements() -> str | None:
    """Why a cluster cannot start here, or None."""
    if os.name != "posix" or os.geteuid() != 0:
        return "the SLURM cluster fixture needs root (SlurmUser=root)"
    missing = [name for name in BINARIES if shutil.which(name) is None]
    if missing:
        return (f"SLURM / munge not installed (missing {', '.join(missing)}); "
                "apt-get install slurm-wlm munge, or ./dev.sh setup as root")
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SlurmCluster:
    """A running cluster: ``env``, ``node``, ``run(...)``; see the module's docstring."""

    def __init__(self, root: Path, node: str, cpus: int, hostname: str | None = None) -> None:
        self.root = root
        self.node = node
        self.hostname = hostname or socket.gethostname()
        self.cpus = cpus
        self.partition = PARTITION
        self.conf = root / "etc" / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.ctld_port = free_port()
        self.slurmd_port = free_port()
        while self.slurmd_port == self.ctld_port:
            self.slurmd_port = free_port()
        env = dict(os.environ)
        for key in list(env):
            if key.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_")):
                del env[key]   # e.g. a test run inside a real SLURM job
        env["SLURM_CONF"] = str(self.conf)
        env[MARKER] = str(root)
        self.env: dict[str, str] = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.startup_s: float | None = None
        self.zombies_before = stepd_zombies()

    # ---- use ---------------------------------------------------------------------------

    def run(self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 60.0,
            check: bool = True, input: str | None = None,
            cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run a SLURM client (or any command) against this cluster: ``run("srun", "-n",
        "2", "env")``. `env` adds to / overrides the cluster's environment. It runs in the
        cluster's directory unless `cwd` is given (sbatch writes slurm-<id>.out there).
        check=True raises AssertionError with the output and the daemons' log tails on failure."""
        full = dict(self.env)
        if env:
            full.update(env)
        result = subprocess.run(list(args), env=full, capture_output=True, text=True,
                                timeout=timeout, input=input, check=False, cwd=cwd or self.root)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed rc={result.returncode}\n"
                                 f"stdout: {result.stdout}\nstderr: {result.stderr}\n{self.logs()}")
        return result

    def node_state(self) -> str:
        """sinfo's long state of the node: idle, allocated, mixed, draining, drained; a
        trailing * while the controller has not heard from slurmd."""
        return _sinfo_field(self.env, self.node, "%T")

    def node_reason(self) -> str:
        """The node's drain / down reason as ``sinfo -R`` has it ('' when none)."""
        return _sinfo_field(self.env, self.node, "%E", "-R")

    def job_info(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict (JobState, Reason, Restarts, NodeList, ...)."""
        out = self.run("scontrol", "-o", "show", "job", str(job_id), check=False).stdout
        info: dict[str, str] = {}
        for field in out.split():
            key, sep, value = field.partition("=")
            if sep and key not in info:
                info[key] = value
        return info

    def job_state(self, job_id: str) -> str:
        return self.job_info(job_id).get("JobState", "")

    def wait_for(self, predicate: object, timeout: float = 30.0, what: str = "condition") -> None:
        """Poll `predicate()` until true; AssertionError naming `what` and the logs if not."""
        assert callable(predicate)
        deadline = time.monotonic() + timeout
        while True:
            if predicate():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what}\n{self.logs()}")
            time.sleep(0.2)

    def logs(self, lines: int = 25) -> str:
        """The cluster's state (sinfo, squeue) and the daemons' log tails, for failure messages."""
        parts = []
        for argv in (["sinfo", "-N", "-o", "%N %T %E"], ["squeue", "-o", "%i %j %T %r"]):
            try:
                done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=5, check=False)
                parts.append(f"--- {' '.join(argv)}\n{done.stdout.strip()} {done.stderr.strip()}")
            except (OSError, subprocess.SubprocessError) as exc:
                parts.append(f"--- {argv[0]}: {exc}")
        for name in ("munged.log", "slurmctld.log", "slurmd.log"):
            path = self.root / "log" / name
            try:
                tail = path.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            parts.append(f"--- {name} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(parts)

    # ---- start / stop ------------------------------------------------------------------

    def _write_files(self) -> None:
        for sub in ("etc", "munge", "log", "state", "spool", "run"):
            (self.root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        key = self.root / "munge" / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as fh:
            fh.write(os.urandom(1024))
        (self.root / "etc" / "plugstack.conf").write_text("")   # not the host's /etc/slurm one
        (self.root / "etc" / "cgroup.conf").write_text("")
        root, node = self.root, self.node
        self.conf.write_text("\n".join([
            "# written by tests/slurm_cluster.py",
            "ClusterName=test",
            f"SlurmctldHost={self.hostname}(127.0.0.1)",   # slurmctld checks it is this host
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool'}",
            f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'run' / 'slurmd.pid'}",
            f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
            f"PlugStackConfig={root / 'etc' / 'plugstack.conf'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # no cgroups needed (containers, CI VMs, cgroup v2 hosts without a delegated tree);
            # proctrack/cgroup and task/cgroup also worked on the cgroup v1 dev VM
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "JobRequeue=1",
            "ReturnToService=2",
            "MinJobAge=300",
            "KillWait=5",
            "InactiveLimit=0",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
            "MessageTimeout=10",
            "TreeWidth=16",
            f"NodeName={node} NodeAddr=127.0.0.1 NodeHostname={self.hostname} {self._topology()} State=UNKNOWN",
            f"PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO",
            "",
        ]))

    def _topology(self) -> str:
        """The node's CPUs as ``slurmd -C`` finds them (boards, sockets, cores, threads: with
        CPUs= alone slurmd takes each CPU for a socket); memory left out (the default, 1 MB,
        so no job is refused for it)."""
        try:
            line = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=10,
                                  check=False).stdout.splitlines()[0]
            fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
            keep = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")
            if all(fields.get(key, "").isdigit() for key in keep):
                self.cpus = int(fields["CPUs"])
                return " ".join(f"{key}={fields[key]}" for key in keep)
        except (OSError, IndexError, ValueError, subprocess.SubprocessError):
            pass
        return f"CPUs={self.cpus}"

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 - closed with the process
        try:
            self.procs[name] = subprocess.Popen(
                argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=self.root)
        finally:
            log.close()

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                out = ""
                with contextlib.suppress(OSError):
                    out = (self.root / "log" / f"{name}.out").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with rc={proc.returncode} during start-up\n{out}\n{self.logs()}")

    def start(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        began = time.monotonic()
        deadline = began + timeout
        self._write_files()
        self._spawn("munged", [
            "munged", "--foreground", "--force", f"--socket={self.munge_socket}",
            f"--key-file={self.root / 'munge' / 'munge.key'}",
            f"--pid-file={self.root / 'run' / 'munged.pid'}",
            f"--log-file={self.root / 'log' / 'munged.log'}",
            f"--seed-file={self.root / 'munge' / 'munged.seed'}",
            "--num-threads=2"])
        while not self.munge_socket.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged did not create its socket in {timeout:g} s\n{self.logs()}")
            time.sleep(0.05)
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", ["slurmd", "-D", "-N", self.node, "-f", str(self.conf)])
        state = ""
        while True:
            self._check_alive()
            try:
                state = _sinfo_field(self.env, self.node, "%T")
            except subprocess.TimeoutExpired:
                state = "(sinfo timed out)"
            if state == "idle":
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {self.node} not idle after {timeout:g} s (state {state!r})\n{self.logs()}")
            time.sleep(0.2)
        self.startup_s = time.monotonic() - began

    def stop(self) -> None:
        """Cancel every job, stop the daemons, kill what is left of this cluster, remove its
        directory. Safe to call more than once and after a failed start."""
        leftovers = marked_pids(str(self.root))   # slurmstepd: wait below until reaped, not just dead
        ctld = self.procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            with contextlib.suppress(Exception):
                jobs = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True,
                                      text=True, timeout=10, check=False).stdout.split()
                if jobs:
                    subprocess.run(["scancel", *jobs], env=self.env, capture_output=True,
                                   timeout=10, check=False)
                    end = time.monotonic() + 10
                    while time.monotonic() < end and subprocess.run(
                            ["squeue", "-h", "-t", "R,CG,S,CF", "-o", "%i"], env=self.env,
                            capture_output=True, text=True, timeout=10, check=False).stdout.strip():
                        time.sleep(0.2)
        for name in ("slurmd", "slurmctld", "munged"):   # the controller outlives slurmd's goodbye
            proc = self.procs.get(name)
            if proc is None:
                continue
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self.procs.clear()
        leftovers += kill_marked(str(self.root))
        # slurmstepd daemonizes (its parent becomes init), so its zombies wait for init to reap
        # them, and a zombie's environment cannot be read: wait for the new ones to go
        end = time.monotonic() + 5
        while time.monotonic() < end and (
                any(Path(f"/proc/{pid}").exists() for pid in leftovers)
                or stepd_zombies() - self.zombies_before):
            time.sleep(0.05)
        shutil.rmtree(self.root, ignore_errors=True)


def _sinfo_field(env: Mapping[str, str], node: str, field: str, *options: str) -> str:
    """One field of the node's line in the full ``sinfo -N`` listing. Not ``sinfo -n NODE``:
    in 22.05 that asks for one node, an RPC that skips refreshing the allocation counts, so
    it can show a node mixed long after its jobs ended (seen here: 15 s and more)."""
    out = subprocess.run(["sinfo", "-h", "-N", *options, "-o", f"%N|{field}"], env=dict(env),
                         capture_output=True, text=True, timeout=10, check=False).stdout
    for line in out.splitlines():
        name, _, value = line.partition("|")
        if name.strip() == node:
            return value.strip()
    return ""


def marked_pids(marker_value: str) -> list[int]:
    """Processes whose environment has MARKER=marker_value (the daemons, slurmstepd, tasks)."""
    return pids_with_env(MARKER, marker_value)


def pids_with_env(key: str, value: str) -> list[int]:
    """Processes (readable ones: root sees all) whose environment has key=value."""
    needle = f"{key}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry))
    return found


def kill_marked(marker_value: str, timeout: float = 5.0) -> list[int]:
    """SIGKILL every process of this cluster still alive; returns those it found."""
    pids = marked_pids(marker_value)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + timeout
    while pids and time.monotonic() < end:
        pids_left = [pid for pid in pids if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
        if not pids_left:
            break
        time.sleep(0.05)
    return pids


def stepd_zombies() -> set[int]:
    """slurmstepd processes that exited and wait for their parent (init) to reap them."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _zombie(int(entry), b"(slurmstepd)"):
            found.add(int(entry))
    return found


def _zombie(pid: int, comm: bytes | None = None) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        head, _, tail = stat.rpartition(b")")
        if comm is not None and not (head + b")").endswith(b" " + comm):
            return False
        return tail.split()[0] == b"Z"
    except (OSError, IndexError):
        return False


@contextlib.contextmanager
def start_slurm_cluster(timeout: float = STARTUP_TIMEOUT_S, node: str | None = None) -> Iterator[SlurmCluster]:
    """A running cluster for the with-block; torn down at its end, also on failure. `node`: the
    node's SLURM name (default: this host's name)."""
    reason = missing_requirements()
    if reason:
        raise RuntimeError(reason)
    for attempt in (1, 2):
        root = Path(tempfile.mkdtemp(prefix="mycroft-slurm-"))
        cluster = SlurmCluster(root, node or socket.gethostname(), os.cpu_count() or 1)
        try:
            cluster.start(timeout)
        except BaseException as exc:
            # the free ports were free when chosen; another process may have taken one since
            retry = attempt == 1 and "already in use" in str(exc)
            cluster.stop()
            if retry:
                continue
            raise
        break
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A real single-node SLURM cluster (one per test module); skips when SLURM/munge or
    root are missing, fails with the daemons' logs when it does not come up."""
    from tests.components import require

    require("slurm")  # skips on a developer's machine, fails under CI=true / ./dev.sh test
    with start_slurm_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def slurm_node17() -> Iterator[SlurmCluster]:
    """A real single-node cluster whose node is named node17, not this host's name (NodeHostname
    is): what SLURM calls the node differs from gethostname(), as on many real clusters."""
    from tests.components import require

    require("slurm")
    with start_slurm_cluster(node="node17") as cluster:
        yield cluster
