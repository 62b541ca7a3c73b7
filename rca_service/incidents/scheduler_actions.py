"""Scheduler-side actions on a root cause: drain a node, requeue or cancel a job, cordon a
Kubernetes node, or run an operator's own command with the incident on stdin.

Every action returns an ActionResult and never raises: a missing binary, a timeout, a
refused request or an invalid argument come back as ``ok=False`` with the reason in
``detail``. Commands run from argument lists (never a shell), in their own session so a
timeout kills the whole process group, with their time and the output kept bounded.

SLURM (``scontrol`` / ``scancel`` from the PATH, or the paths given):

    slurm_drain(node, reason)   scontrol update nodename=<node> state=drain reason=<reason>
    slurm_resume(node)          scontrol update nodename=<node> state=resume
    slurm_requeue(job_id)       scontrol requeue <job_id>
    slurm_cancel(job_id)        scancel <job_id>
    slurm_job_steps(job_id)     squeue -h -s -j <job_id> -o %i  (its running steps: the tasks' lives)

The drain reason is one argument ``reason=<text>``: made a single line of printable ASCII,
double quotes turned into single ones (scontrol strips a leading / trailing ``"``), at most
200 characters. Pass ``env`` to reach another cluster (``SLURM_CONF``).

Kubernetes: k8s_cordon(node, api_server=..., token=..., ca_file=...) sends what
``kubectl cordon`` sends, ``PATCH /api/v1/nodes/<node>`` with the strategic merge patch
``{"spec":{"unschedulable":true}}``, with the stdlib's urllib (no client library). Inside
a pod: api_server ``https://kubernetes.default.svc``, the token from
``/var/run/secrets/kubernetes.io/serviceaccount/token`` and the CA file
``/var/run/secrets/kubernetes.io/serviceaccount/ca.crt``; the service account needs
``patch`` on ``nodes``. The token is sent as a Bearer header and never appears in detail.

run_exec(argv, stdin_json, timeout_s): an operator's command, the incident JSON on its
stdin; killed with its whole process group after timeout_s.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

MAX_REASON = 200          # characters of a drain reason
MAX_OUTPUT = 64 * 1024    # bytes kept of each of a command's stdout and stderr
MAX_DETAIL = 1000         # characters of ActionResult.detail
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_.\-\[\],]+$")                      # a node or hostlist
_SLURM_JOB = re.compile(r"^[0-9]+(?:_[0-9]+|_\[[0-9,\-]+\]|\+[0-9]+)?$")   # 12, 12_3, 12_[1-4], 12+1
_K8S_NODE = re.compile(r"^[a-z0-9](?:[a-z0-9.\-]{0,251}[a-z0-9])?$")      # RFC 1123 subdomain


@dataclass(frozen=True)
class ActionResult:
    ok: bool
    detail: str   # the command run (or request sent) and its output / error, short


def _short(text: str, limit: int = MAX_DETAIL) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def sanitize_reason(reason: str, limit: int = MAX_REASON) -> str:
    """One line of printable ASCII, no double quotes, at most `limit` characters, not empty."""
    out = []
    for ch in str(reason):
        if ch == '"':
            out.append("'")
        elif ch in "\r\n\t\v\f":
            out.append(" ")
        elif " " <= ch <= "~":
            out.append(ch)
        elif ch.isprintable():
            out.append("?")
        # other control characters are dropped
    text = " ".join("".join(out).split())
    if len(text) > limit:
        text = text[: limit - 3].rstrip() + "..."
    return text or "mycroft: no reason given"


def slurm_drain_argv(node: str, reason: str, scontrol: str = "scontrol") -> list[str]:
    _check_node(node)
    return [scontrol, "update", f"nodename={node}", "state=drain", f"reason={sanitize_reason(reason)}"]


def slurm_resume_argv(node: str, scontrol: str = "scontrol") -> list[str]:
    _check_node(node)
    return [scontrol, "update", f"nodename={node}", "state=resume"]


def slurm_requeue_argv(job_id: str, scontrol: str = "scontrol") -> list[str]:
    _check_job(job_id)
    return [scontrol, "requeue", str(job_id)]


def slurm_cancel_argv(job_id: str, scancel: str = "scancel") -> list[str]:
    _check_job(job_id)
    return [scancel, str(job_id)]


def _check_node(node: str) -> None:
    if not isinstance(node, str) or not _SLURM_NAME.match(node) or node.startswith("-"):
        raise ValueError(f"invalid node name {node!r}")


def _check_job(job_id: str) -> None:
    if not _SLURM_JOB.match(str(job_id)):
        raise ValueError(f"invalid job id {job_id!r}")


def slurm_drain(node: str, reason: str, *, scontrol: str = "scontrol", timeout_s: float = 10.0,
                env: Mapping[str, str] | None = None) -> ActionResult:
    """Drain `node` (no new jobs; running ones finish) with `reason` shown by ``sinfo -R``."""
    return _run_built(lambda: slurm_drain_argv(node, reason, scontrol), timeout_s, env)


def slurm_resume(node: str, *, scontrol: str = "scontrol", timeout_s: float = 10.0,
                 env: Mapping[str, str] | None = None) -> ActionResult:
    """Undo a drain: the node takes jobs again."""
    return _run_built(lambda: slurm_resume_argv(node, scontrol), timeout_s, env)


def slurm_requeue(job_id: str, *, scontrol: str = "scontrol", timeout_s: float = 10.0,
                  env: Mapping[str, str] | None = None) -> ActionResult:
    """Requeue a batch job (it must be requeueable: ``--requeue`` or JobRequeue=1)."""
    return _run_built(lambda: slurm_requeue_argv(job_id, scontrol), timeout_s, env)


def slurm_cancel(job_id: str, *, scancel: str = "scancel", timeout_s: float = 10.0,
                 env: Mapping[str, str] | None = None) -> ActionResult:
    return _run_built(lambda: slurm_cancel_argv(job_id, scancel), timeout_s, env)


def k8s_cordon_request(node: str, api_server: str, token: str | None) -> urllib.request.Request:
    """The request ``kubectl cordon`` sends (ValueError for a bad node name or server URL)."""
    if not isinstance(node, str) or not _K8S_NODE.match(node):
        raise ValueError(f"invalid Kubernetes node name {node!r}")
    parsed = urllib.parse.urlsplit(api_server)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"invalid API server URL {api_server!r}")
    url = f"{api_server.rstrip('/')}/api/v1/nodes/{urllib.parse.quote(node, safe='')}"
    body = json.dumps({"spec": {"unschedulable": True}}).encode()
    headers = {"Content-Type": "application/strategic-merge-patch+json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token.strip()}"
    return urllib.request.Request(url, data=body, headers=headers, method="PATCH")


def k8s_cordon(node: str, *, api_server: str, token: str | None, ca_file: str | None,
               timeout_s: float = 10.0) -> ActionResult:
    """Mark a Kubernetes node unschedulable (``kubectl cordon``); see the module's docstring."""
    try:
        request = k8s_cordon_request(node, api_server, token)
    except ValueError as exc:
        return ActionResult(False, str(exc))
    what = f"PATCH {request.full_url} {{\"spec\":{{\"unschedulable\":true}}}}"
    try:
        context = None
        if request.full_url.startswith("https:"):
            context = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            status = response.status
            text = response.read(MAX_OUTPUT).decode("utf-8", "replace")
        unschedulable = None
        try:
            unschedulable = json.loads(text).get("spec", {}).get("unschedulable")
        except (ValueError, AttributeError):
            pass
        ok = 200 <= status < 300
        return ActionResult(ok, _short(f"{what}: HTTP {status}, spec.unschedulable={unschedulable}"))
    except urllib.error.HTTPError as exc:
        try:
            text = exc.read(MAX_OUTPUT).decode("utf-8", "replace")
        except Exception:
            text = ""
        return ActionResult(False, _short(f"{what}: HTTP {exc.code} {exc.reason}: {text}"))
    except Exception as exc:   # URLError, timeouts, TLS errors, a bad CA file ...
        return ActionResult(False, _short(f"{what}: {type(exc).__name__}: {exc}"))


def run_exec(argv: Sequence[str], stdin_json: bytes, timeout_s: float, *,
             env: Mapping[str, str] | None = None) -> ActionResult:
    """Run an operator's command with `stdin_json` on its stdin; its process group is killed
    after `timeout_s`. ok is True when it exits 0 in time."""
    if isinstance(argv, str | bytes) or not argv:
        return ActionResult(False, "run_exec: argv must be a non-empty list of arguments")
    return _run_command([str(arg) for arg in argv], stdin_json, timeout_s, env)


def slurm_job_steps(job_id: str, *, squeue: str = "squeue", timeout_s: float = 10.0,
                    env: Mapping[str, str] | None = None) -> list[str] | None:
    """The job's task steps still running (``12.0``, ``12.1``; not ``12.batch`` / ``12.extern``): a step
    ends when its last task has exited. None when squeue cannot tell (not found, failed, timed out)."""
    try:
        _check_job(job_id)
        done = subprocess.run([squeue, "-h", "-s", "-j", str(job_id), "-o", "%i"], capture_output=True, text=True,
                              timeout=timeout_s, env=dict(env) if env is not None else None, check=False)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return [] if "Invalid job id" in done.stderr else None  # a job that ended and left squeue runs no step
    return [step for step in done.stdout.split()[:1000] if step.rpartition(".")[2].isdigit()]


def _run_built(build: Callable[[], list[str]], timeout_s: float, env: Mapping[str, str] | None) -> ActionResult:
    """Run the command `build` makes; its ValueError (an invalid node or job id) is the result."""
    try:
        argv = build()
    except ValueError as exc:
        return ActionResult(False, str(exc))
    return _run_command(argv, None, timeout_s, env)


def _run_command(argv: list[str], stdin: bytes | None, timeout_s: float,
                 env: Mapping[str, str] | None) -> ActionResult:
    shown = shlex.join(argv)
    try:
        return _run_bounded(argv, shown, stdin, timeout_s, env)
    except Exception as exc:   # never raise
        return ActionResult(False, _short(f"{shown}: {type(exc).__name__}: {exc}"))


def _reader(pipe: IO[bytes], sink: bytearray) -> None:
    try:
        while True:
            chunk = os.read(pipe.fileno(), 65536)
            if not chunk:
                break
            room = MAX_OUTPUT - len(sink)
            if room > 0:
                sink.extend(chunk[:room])
    except (OSError, ValueError):
        pass


def _writer(pipe: IO[bytes], data: bytes) -> None:
    try:
        pipe.write(data)
    except (OSError, ValueError):   # the command exited or closed its stdin: fine
        pass
    finally:
        try:
            pipe.close()
        except (OSError, ValueError):
            pass


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _run_bounded(argv: list[str], shown: str, stdin: bytes | None, timeout_s: float,
                 env: Mapping[str, str] | None) -> ActionResult:
    deadline = time.monotonic() + max(0.0, float(timeout_s))
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True,
            start_new_session=True,   # its own process group: a timeout kills all of it
            env=dict(env) if env is not None else None)
    except OSError as exc:
        return ActionResult(False, _short(f"{shown}: cannot start: {exc}"))
    out, err = bytearray(), bytearray()
    assert proc.stdout is not None and proc.stderr is not None
    threads = [threading.Thread(target=_reader, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=_reader, args=(proc.stderr, err), daemon=True)]
    if stdin is not None:
        assert proc.stdin is not None
        threads.append(threading.Thread(target=_writer, args=(proc.stdin, stdin), daemon=True))
    for thread in threads:
        thread.start()
    timed_out = False
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        timed_out = True
        _killpg(proc.pid)
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
    # the pipes close when every holder is gone: wait a little for descendants left behind,
    # then kill what is left of its process group
    grace = time.monotonic() + (1.0 if not timed_out else 2.0)
    for thread in threads:
        thread.join(timeout=max(0.0, min(deadline + 1.0, grace) - time.monotonic()))
    if any(thread.is_alive() for thread in threads):
        _killpg(proc.pid)
        for thread in threads:
            thread.join(timeout=1.0)
    if not any(thread.is_alive() for thread in threads):   # else a process outside the group holds them
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()
    text = " | ".join(part for part in (
        out.decode("utf-8", "replace").strip(), err.decode("utf-8", "replace").strip()) if part)
    if timed_out:
        return ActionResult(False, _short(f"{shown}: timed out after {timeout_s:g} s, process group killed"
                                          + (f": {text}" if text else "")))
    rc = proc.returncode
    ok = rc == 0
    return ActionResult(ok, _short(f"{shown}: rc={rc}" + (f": {text}" if text else "")))
