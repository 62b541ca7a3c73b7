"""Who a rank is under srun / sbatch, whoever sets RANK and when; the host identity; the relay
files of a job leaving /dev/shm with its last rank, and stale ones swept at the next start."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
from mycroft.instrumentation import directives
from mycroft.instrumentation.directives import Control, DirectiveWatcher, sweep_stale
from mycroft.instrumentation.startup import (
    host_identity,
    launch_facts,
    launch_job_id,
    launch_resource,
    slurm_tasks_on_node,
)

from mycroft import schema

SRUN = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NNODES": "2",
        "SLURM_JOB_ID": "812", "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
        "SLURMD_NODENAME": "node17", "MASTER_ADDR": "node16", "MASTER_PORT": "29500"}


def test_srun_identity_whoever_sets_rank() -> None:
    before = launch_facts(SRUN)  # at start-up: the script has not set RANK yet
    after = launch_facts({**SRUN, "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"})  # at the abort: it has
    for facts in (before, after):
        assert facts is not None
        assert (facts.rank, facts.world_size, facts.local_rank, facts.node_rank) == (5, 8, 1, 1)
        assert facts.local_world_size == 4  # the per-host wait before the exit counts 4 ranks, not 0
        assert facts.job_id == "slurm-812.0" and facts.launcher == "slurm"
        assert (facts.slurm_job_id, facts.slurm_step_id) == ("812", "0")
    # a script whose own ranks are not SLURM's (mp.spawn inside one task): its ranks, SLURM's job
    spawned = launch_facts({**SRUN, "RANK": "2", "WORLD_SIZE": "16", "LOCAL_RANK": "2"})
    assert spawned is not None and (spawned.rank, spawned.world_size, spawned.launcher) == (2, 16, "env")
    assert spawned.job_id == "slurm-812.0"
    # torchrun inside an allocation: torchrun's identity and job id
    elastic = launch_facts({**SRUN, "RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4",
                            "GROUP_RANK": "0", "TORCHELASTIC_RUN_ID": "llama"})
    assert elastic is not None and elastic.launcher == "torchrun" and elastic.job_id == "llama"
    assert launch_job_id({**SRUN, "TORCHELASTIC_RUN_ID": "none"}).startswith("job-")


def test_tasks_on_this_node() -> None:
    assert slurm_tasks_on_node({"SLURM_STEP_TASKS_PER_NODE": "3,2(x2),1", "SLURM_NODEID": "0"}) == 3
    assert slurm_tasks_on_node({"SLURM_STEP_TASKS_PER_NODE": "3,2(x2),1", "SLURM_NODEID": "2"}) == 2
    assert slurm_tasks_on_node({"SLURM_STEP_TASKS_PER_NODE": "3,2(x2),1", "SLURM_NODEID": "3"}) == 1
    assert slurm_tasks_on_node({"SLURM_TASKS_PER_NODE": "4", "SLURM_NODEID": "0"}) == 4
    assert slurm_tasks_on_node({"SLURM_NTASKS": "8", "SLURM_NNODES": "2"}) == 4
    assert slurm_tasks_on_node({"SLURM_STEP_TASKS_PER_NODE": "x(y"}) == 0


def test_host_identity() -> None:
    assert host_identity({"SLURMD_NODENAME": "node17", "K8S_NODE_NAME": "k1"}, "vm") == "node17"
    assert host_identity({"K8S_NODE_NAME": "gke-pool-3"}, "trainer-0") == "gke-pool-3"
    assert host_identity({}, "vm") == "vm"
    assert host_identity({}) == socket.gethostname()


def test_resource_names_the_slurm_node_and_keeps_the_os_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "node17")
    facts = launch_facts(SRUN)
    assert facts is not None
    resource = launch_resource(facts)
    assert resource[schema.RES_HOST_NAME] == "node17"
    assert resource[schema.RES_OS_HOST_NAME] == socket.gethostname()
    assert resource[schema.RES_SLURM_STEP_ID] == "0" and resource[schema.RES_SLURM_JOB_ID] == "812"


def _watcher(job: str, directory: Path) -> DirectiveWatcher:
    return DirectiveWatcher(Control("http://127.0.0.1:9", ""), job, "r1", directory=str(directory))


def test_relay_files_go_with_the_last_rank(tmp_path: Path) -> None:
    a, b = _watcher("job-a", tmp_path), _watcher("job-a", tmp_path)
    # two ranks of one host: b is played by this process's parent (alive, running)
    b.member_path = b.member_path.rsplit(".", 1)[0] + f".{os.getppid()}"
    open(b.member_path, "w").close()
    a._relay({"action": "abort", "seq": 1})
    a.acknowledge({"seq": 1})
    open(a.lock_path, "w").close()
    assert len(list(tmp_path.iterdir())) == 5  # 2 members, relay, ack, lock
    assert not a.leave()  # b still runs
    assert sorted(p.name.split(".", 1)[1] for p in tmp_path.iterdir())[0].startswith("directive")
    os.unlink(b.member_path)  # b leaves (its own file first) ...
    b._left = True
    assert a._left and not a.leave()  # once only
    c = _watcher("job-a", tmp_path)
    assert c.leave()  # ... and the last one to leave cleans up
    assert list(tmp_path.iterdir()) == []


def test_stale_jobs_are_swept_at_the_next_start(tmp_path: Path) -> None:
    # a dead job: its rank's pid no longer runs, its files an hour old
    dead = next(pid for pid in range(4_000_000, 4_100_000) if not os.path.exists(f"/proc/{pid}"))
    stale = _watcher("job-dead", tmp_path)
    os.rename(stale.member_path, stale.member_path.rsplit(".", 1)[0] + f".{dead}")
    stale._relay({"action": "abort", "seq": 3})
    stale.acknowledge({"seq": 3})
    old = time.time() - 3600
    for path in tmp_path.iterdir():
        os.utime(path, (old, old))
    assert len(list(tmp_path.iterdir())) == 3  # the dead job's member, relay and ack files
    assert sweep_stale(str(tmp_path), keep=stale.tag) == 0
    live = _watcher("job-live", tmp_path)  # the next job to start on the host sweeps them
    open(live.lock_path, "w").close()
    os.utime(live.lock_path, (old, old))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [os.path.basename(live.member_path), os.path.basename(live.lock_path)])
    assert sweep_stale(str(tmp_path)) == 0  # a live job's old lock stays
    # a new job's start sweeps too; fresh files of a job that has no member yet are left alone
    fresh = tmp_path / f"{directives.FILE_PREFIX}{'0' * 16}.lock"
    fresh.touch()
    _watcher("job-next", tmp_path)
    assert fresh.exists()
    live.leave()
