"""abort_job end to end: a real `mycroft rca serve` policy, a real torchrun job, a real fault.

mode act: every live rank reads the directive through its host's poller and relay file, prints
one line naming the root cause, and exits with the directive's exit code within seconds of the
critical verdict; mode observe: the action is recorded, nothing is killed.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from typing import Any

import pytest
from mycroft.rca_service.incidents.action_policy import parse_policy

from mycroft.faults.inject import free_port, job_command, job_env, kill_tree, local_rca

pytestmark = pytest.mark.slow

NPROC = 4
EXIT_CODE = 75


def _policy(mode: str) -> Any:
    return parse_policy({"mode": mode, "rules": [{"kinds": ["hang", "crash", "deadlock", "mismatch"],
                                                  "min_severity": "critical", "do": ["abort_job"]}]})


def _run(mode: str, fault: str, rank: int, timeout_s: float,
         configured: bool = True) -> tuple[subprocess.CompletedProcess[str], float, Any]:
    """(the job's result, when it ended, the hang incident with its actions). Not `configured`: no
    MYCROFT_CONTROL_ENDPOINT, the ranks find the control API at the OTLP endpoint they export to."""
    with local_rca(actions=_policy(mode)) as rca:
        work = tempfile.mkdtemp(prefix="mycroft-abort-")
        job = f"abort-{mode}-{fault}-{os.getpid()}"
        env = job_env(rca.otlp_grpc, job, fault, rank, 12, 100_000, os.path.join(work, "onset.json"), 0.5, 0.05)
        env.pop("MYCROFT_CONTROL_ENDPOINT", None)
        if configured:
            env["MYCROFT_CONTROL_ENDPOINT"] = rca.api
        command = job_command(NPROC, free_port())
        with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) as proc:
            try:
                out, _ = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                kill_tree(proc)
                out, _ = proc.communicate()
            ended = time.time()
            result = subprocess.CompletedProcess(command, proc.returncode, out, "")
        incidents = [i for i in rca.incidents(job) if i["kind"] in ("hang", "crash") and not i.get("consequence_of")]
        incident = rca.service.get_incident(incidents[0]["id"]) if incidents else None
    return result, ended, incident


@pytest.mark.parametrize(("fault", "configured"), [("block", False), ("sigstop", True)],
                         ids=["block-found", "sigstop-configured"])
def test_act_every_live_rank_leaves_with_the_exit_code_and_the_line(fault: str, configured: bool) -> None:
    rank = 2
    result, ended, incident = _run("act", fault, rank, 120, configured)
    assert incident is not None, result.stdout[-3000:]
    actions = {a["action"]: a for a in incident["actions"]}
    assert actions["abort_job"]["mode"] == "act" and actions["abort_job"]["result"] == "done", actions
    lines = [line for line in result.stdout.splitlines() if line.startswith("mycroft: aborting:")]
    live = NPROC - (1 if fault == "sigstop" else 0)  # a stopped process runs no code: the launcher ends it
    assert len(lines) >= live, result.stdout[-3000:]
    assert all(f"rank {rank}" in line and incident["id"] in line for line in lines), lines
    assert result.stdout.count(f"exitcode  : {EXIT_CODE}") + result.stdout.count(f"(exitcode: {EXIT_CODE})") >= 1
    assert result.returncode != 0
    critical_at = incident["critical_at_unix"]
    assert critical_at is not None and ended - critical_at < 5.0, (ended, critical_at)


def test_observe_records_the_abort_and_kills_nothing() -> None:
    result, _, incident = _run("observe", "block", 1, 25)
    assert incident is not None, result.stdout[-3000:]
    actions = {a["action"]: a for a in incident["actions"]}
    assert actions["abort_job"]["mode"] == "observe" and actions["abort_job"]["result"] == "observed", actions
    assert "mycroft: aborting" not in result.stdout
    assert f"exitcode  : {EXIT_CODE}" not in result.stdout  # the job ran on until the test ended it
