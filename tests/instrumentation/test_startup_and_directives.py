"""Pure parts of start-up reporting (who a process is before init) and of the abort directive path."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
from mycroft.instrumentation import directives
from mycroft.instrumentation.startup import init_environment, launch_facts, launch_job_id


def test_torchrun_facts_and_a_job_id_every_node_shares() -> None:
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "4",
           "TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
    facts = launch_facts(env)
    assert facts is not None
    assert (facts.rank, facts.world_size, facts.local_rank, facts.node_rank, facts.local_world_size) == (5, 8, 1, 1, 4)
    assert facts.launcher == "torchrun"
    other_node = launch_facts({**env, "RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0"})
    assert other_node is not None and other_node.job_id == facts.job_id  # the rendezvous endpoint is shared
    assert launch_job_id({**env, "MASTER_PORT": "29501"}) != facts.job_id
    assert launch_job_id({**env, "TORCHELASTIC_RUN_ID": "llama-7"}) == "llama-7"
    assert launch_job_id({**env, "MYCROFT_JOB_ID": "mine"}) == "mine"


def test_srun_without_torchrun_and_what_is_not_a_launch() -> None:
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NNODES": "2",
           "SLURM_JOB_ID": "812", "SLURM_STEP_ID": "0"}
    facts = launch_facts(env)
    assert facts is not None
    assert (facts.rank, facts.world_size, facts.node_rank, facts.local_world_size) == (3, 4, 1, 2)
    assert facts.job_id == "slurm-812.0" and facts.slurm_job_id == "812" and facts.launcher == "slurm"
    assert launch_facts({}) is None
    # a rank outside its world, a rank that is no number:
    assert launch_facts({"RANK": "4", "WORLD_SIZE": "4", "MASTER_ADDR": "a", "MASTER_PORT": "1"}) is None
    assert launch_facts({"RANK": "x", "WORLD_SIZE": "4", "MASTER_ADDR": "a", "MASTER_PORT": "1"}) is None
    assert launch_facts({"RANK": "0", "WORLD_SIZE": "4"}) is None  # no job id to agree on before init


def test_control_endpoint_and_token_from_the_environment() -> None:
    assert directives.control_from_env({"OTEL_TRACES_EXPORTER": "none"}) is None  # no endpoint, nothing to ask
    control = directives.control_from_env({"MYCROFT_CONTROL_ENDPOINT": "http://rca:8080/",
                                           "OTEL_EXPORTER_OTLP_HEADERS": "x=1,authorization=Bearer%20s3cret"})
    assert control == directives.Control("http://rca:8080", "s3cret")
    assert directives.control_from_env({"MYCROFT_CONTROL_ENDPOINT": "http://rca", "MYCROFT_CONTROL_TOKEN": "t",
                                        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20x"}).token == "t"


def test_which_directives_apply() -> None:
    now = time.time()
    abort = {"action": "abort", "job": "j", "run": "r.0", "issued_at_unix": now, "reason": "rank 2 (not_entered)",
             "incident": "abc"}
    assert directives.applies(abort, "j", "r.0", now - 1)
    assert directives.applies({**abort, "run": ""}, "j", "r.0", now - 1)
    assert not directives.applies(abort, "j", "r.1", now - 1)  # another launch of the job
    assert not directives.applies(abort, "k", "r.0", now - 1)
    assert not directives.applies(abort, "j", "r.0", now + 1)  # older than this process: a previous launch's
    assert not directives.applies({**abort, "action": "drain"}, "j", "r.0", now - 1)
    assert directives.abort_line(abort) == "mycroft: aborting: rank 2 (not_entered) (incident abc)"


class _Response(io.BytesIO):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(body)
        self.status = status

    def __enter__(self) -> _Response:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def test_one_poller_per_host_relays_to_every_rank(tmp_path: Path) -> None:
    asked: list[str] = []
    answers = [_Response(204, b""), _Response(200, json.dumps(
        {"seq": 3, "action": "abort", "job": "j", "run": "r", "issued_at_unix": time.time() + 5,
         "reason": "rank 1 (process_lost)", "incident": "i1", "exit_code": 75}).encode())]

    def opener(request: Any, timeout: float) -> _Response:
        asked.append(request.full_url)
        assert request.get_header("Authorization") == "Bearer tok"
        return answers.pop(0)

    control = directives.Control("http://rca", "tok")
    first = directives.DirectiveWatcher(control, "j", "r", str(tmp_path), opener=opener)
    second = directives.DirectiveWatcher(control, "j", "r", str(tmp_path), opener=opener)
    first._try_become_poller()
    second._try_become_poller()
    assert first._thread is not None and second._thread is None  # the flock elects one
    deadline = time.time() + 10
    got: dict[int, Any] = {}  # each watcher's directive, whenever it saw it: the poller thread may write
    while time.time() < deadline and len(got) < 2:  # the relay file between the two checks of one round
        for index, watcher in enumerate((first, second)):
            directive = watcher.check()
            if directive:
                got[index] = directive
        time.sleep(0.05)
    first.stop()
    second.stop()
    assert [got[index]["incident"] for index in sorted(got)] == ["i1", "i1"]
    assert "after=0" in asked[0] and "job=j" in asked[0] and "wait=30" in asked[0]
    assert "after=3" not in asked[0] and first._after == 3


def test_stopped_siblings_are_found_by_parent(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for pid, state, ppid in ((10, "T", 7), (11, "S", 7), (12, "T", 8)):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(f"{pid} (python (x)) {state} {ppid} 1 1")
    assert directives.stopped_siblings(7, str(proc)) == [10]


@pytest.mark.slow
def test_a_frozen_poller_is_replaced_a_running_one_is_not(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    control = directives.Control("http://127.0.0.1:9", "")
    watcher = directives.DirectiveWatcher(control, "frozen", "r", str(tmp_path))
    hold = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); os.pwrite(fd, str(os.getpid()).encode(), 0); print('held', flush=True); "
            "time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", hold, watcher.lock_path], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        watcher._try_become_poller()
        assert watcher._thread is None  # a live poller polls for the host
        os.kill(holder.pid, signal.SIGSTOP)
        time.sleep(0.1)
        watcher._try_become_poller()
        assert watcher._thread is not None  # its successor does
        assert Path(f"{watcher.lock_path}.1").read_text() == str(os.getpid())
    finally:
        watcher.stop()
        holder.kill()
        holder.wait()


_GATHER = """
import sys, time
from mycroft.instrumentation import directives
control = directives.Control("http://127.0.0.1:9", "")
watcher = directives.DirectiveWatcher(control, "gather", "r", sys.argv[1])
abort = {"seq": 9, "action": "abort"}
time.sleep(float(sys.argv[2]))
if sys.argv[3] == "ack":
    watcher.acknowledge(abort)
started = time.monotonic()
counted = watcher.wait_for_host(abort, int(sys.argv[4]), timeout_s=8.0)
print(counted, round(time.monotonic() - started, 2), flush=True)
"""


def _siblings(tmp_path: Path, *specs: tuple[float, str, int]) -> list[tuple[int, float]]:
    """Run one gathering process per (delay, ack|quit, local ranks) as siblings; their (counted, waited)."""
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", _GATHER, str(tmp_path), str(delay), what, str(ranks)],
                              stdout=subprocess.PIPE, text=True) for delay, what, ranks in specs]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        counted, waited = out.split()
        results.append((int(counted), float(waited)))
    return results


@pytest.mark.slow
def test_a_leaving_rank_waits_for_its_hosts_live_ranks_to_read_the_abort(tmp_path: Path) -> None:
    # the first reader waits for the slow one (1.5 s later), not the whole 8 s
    (first, waited), (second, _) = _siblings(tmp_path, (0.0, "ack", 2), (1.5, "ack", 2))
    assert first == 2 and second == 2 and 0.8 < waited < 6.0, (first, waited)


@pytest.mark.slow
def test_a_sibling_that_ends_without_reading_is_not_waited_for(tmp_path: Path) -> None:
    (first, waited), _ = _siblings(tmp_path, (0.0, "ack", 2), (1.0, "quit", 0))
    assert first == 1 and waited < 6.0, (first, waited)


def test_init_arguments_complete_what_the_launcher_did_not_say() -> None:
    env = init_environment({}, {"rank": 2, "world_size": 4, "init_method": "tcp://10.0.0.5:29500"})
    facts = launch_facts(env)
    assert facts is not None and (facts.rank, facts.world_size) == (2, 4) and facts.job_id.startswith("job-")
    assert env["MASTER_ADDR"] == "10.0.0.5" and env["MASTER_PORT"] == "29500"
    # the launcher's word wins; defaults (-1) and other init methods add nothing
    assert init_environment({"RANK": "1", "WORLD_SIZE": "8"}, {"rank": 3})["RANK"] == "1"
    assert launch_facts(init_environment({}, {"rank": -1, "world_size": -1, "init_method": "env://"})) is None


def test_the_launcher_agent_its_endpoint_job_id_and_the_job_hosts() -> None:
    from mycroft.instrumentation.agent import agent_job_id, endpoint_from_argv, expand_hostlist, is_launcher_agent

    assert is_launcher_agent(["/venv/bin/python", "/venv/bin/torchrun", "--nnodes", "2", "train.py"])
    assert is_launcher_agent(["python3", "-m", "torch.distributed.run", "--nnodes", "2", "train.py"])
    assert is_launcher_agent(["python3", "-m", "torch.distributed.launch", "--nnodes", "2", "train.py"])
    assert not is_launcher_agent(["python", "train.py", "torchrun"])  # a worker, or a script named anything
    assert not is_launcher_agent(["python", "-m", "torch.distributed.launch_helper"])
    assert endpoint_from_argv(["torchrun", "--rdzv-endpoint", "head:29400", "t.py", "--rdzv-endpoint", "x"]) == \
        "head:29400"
    assert endpoint_from_argv(["torchrun", "--rdzv_endpoint=head:1", "t.py"]) == "head:1"
    assert endpoint_from_argv(["torchrun", "--master-addr", "n0", "--master_port=7", "t.py"]) == "n0:7"
    assert endpoint_from_argv(["torchrun", "t.py"]) == "127.0.0.1:29500"
    assert agent_job_id({}, "llama", "c10d:h:1") == "llama"
    assert agent_job_id({"MYCROFT_JOB_ID": "mine"}, "llama", "c10d:h:1") == "mine"
    assert agent_job_id({}, "none", "c10d:h:1") == agent_job_id({}, "", "c10d:h:1") != agent_job_id({}, "none", "c:h:2")
    assert expand_hostlist("gpu[01-03,07],login2") == ["gpu01", "gpu02", "gpu03", "gpu07", "login2"]
    assert expand_hostlist("a[8-10]-ib,b") == ["a8-ib", "a9-ib", "a10-ib", "b"]
    assert expand_hostlist("node7") == ["node7"] and expand_hostlist("") == []
    assert expand_hostlist("bad[1-") == [] and expand_hostlist("x[3-1]") == [] and expand_hostlist("x[0-99999]") == []
