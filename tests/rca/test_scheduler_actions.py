"""rca_service/incidents/scheduler_actions.py without SLURM or Kubernetes: the arguments built, the
drain reason made safe, commands run bounded (time, output, the whole process group) and
never raising; k8s_cordon's request against a stdlib HTTP server standing in for the API
server (no kube-apiserver can run here: Debian ships none)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from mycroft.rca_service.incidents import scheduler_actions as sa

PY = sys.executable


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rpartition(b")")[2].split()[0] != b"Z"
    except OSError:
        return False


@pytest.fixture
def fake_scontrol(tmp_path: Path) -> tuple[Path, Path]:
    """An executable that records its arguments (and SLURM_CONF) as JSON, then exits 0."""
    record = tmp_path / "argv.json"
    script = tmp_path / "fake-scontrol"
    script.write_text(f"#!{PY}\nimport json, os, sys\n"
                      f"open({str(record)!r}, 'w').write(json.dumps("
                      "{'argv': sys.argv[1:], 'conf': os.environ.get('SLURM_CONF')}))\n"
                      "print('done')\n")
    script.chmod(0o755)
    return script, record


def test_reason_sanitized() -> None:
    assert sa.sanitize_reason('rank 3\nhung in "all_reduce"\t ok') == "rank 3 hung in 'all_reduce' ok"
    assert sa.sanitize_reason("a\x00b\x1bc\r\nd") == "abc d"
    assert sa.sanitize_reason("naïve ✓") == "na?ve ?"
    assert sa.sanitize_reason("   ") == "mycroft: no reason given"
    long = sa.sanitize_reason("x" * 500)
    assert len(long) == sa.MAX_REASON and long.endswith("...")
    assert all(" " <= ch <= "~" for ch in sa.sanitize_reason("".join(map(chr, range(300)))))


def test_argv_built() -> None:
    assert sa.slurm_drain_argv("node-1", "bad\nGPU") == [
        "scontrol", "update", "nodename=node-1", "state=drain", "reason=bad GPU"]
    assert sa.slurm_drain_argv("gpu[01-04],cpu7", "r", "/opt/slurm/bin/scontrol")[:3] == [
        "/opt/slurm/bin/scontrol", "update", "nodename=gpu[01-04],cpu7"]
    assert sa.slurm_resume_argv("n1") == ["scontrol", "update", "nodename=n1", "state=resume"]
    assert sa.slurm_requeue_argv("123") == ["scontrol", "requeue", "123"]
    assert sa.slurm_cancel_argv("123_4") == ["scancel", "123_4"]
    assert sa.slurm_cancel_argv("7+1") == ["scancel", "7+1"]
    for bad_job in ("", "-1", "12 13", "12;ls", "--signal=KILL", "abc"):
        with pytest.raises(ValueError):
            sa.slurm_requeue_argv(bad_job)
    for bad_node in ("", "-n", "a b", "a=b", "n1;reboot", "n\n1"):
        with pytest.raises(ValueError):
            sa.slurm_drain_argv(bad_node, "r")


def test_invalid_input_is_a_result_not_an_exception(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    never = f"{PY} -c open({str(marker)!r},'w')"   # not a path: would fail anyway
    for result in (sa.slurm_drain("a b", "r", scontrol=never), sa.slurm_resume("", scontrol=never),
                   sa.slurm_requeue("1;2", scontrol=never), sa.slurm_cancel("x", scancel=never)):
        assert not result.ok and "invalid" in result.detail
    assert not marker.exists()


@pytest.mark.slow
def test_drain_passes_reason_as_one_argument(fake_scontrol: tuple[Path, Path]) -> None:
    script, record = fake_scontrol
    result = sa.slurm_drain("node-1", 'GPU 3 "xid 79"\nrank 7', scontrol=str(script),
                            env={**os.environ, "SLURM_CONF": "/etc/other/slurm.conf"})
    assert result.ok, result.detail
    seen = json.loads(record.read_text())
    assert seen["argv"] == ["update", "nodename=node-1", "state=drain", "reason=GPU 3 'xid 79' rank 7"]
    assert seen["conf"] == "/etc/other/slurm.conf"
    assert str(script) in result.detail and "rc=0" in result.detail and "done" in result.detail
    for call, expected in ((lambda: sa.slurm_requeue("42", scontrol=str(script)), ["requeue", "42"]),
                           (lambda: sa.slurm_cancel("42", scancel=str(script)), ["42"]),
                           (lambda: sa.slurm_resume("node-1", scontrol=str(script)),
                            ["update", "nodename=node-1", "state=resume"])):
        assert call().ok
        assert json.loads(record.read_text())["argv"] == expected


@pytest.mark.slow
def test_missing_binary_and_failure_are_results(tmp_path: Path) -> None:
    result = sa.slurm_drain("n1", "r", scontrol=str(tmp_path / "no-such-scontrol"))
    assert not result.ok and "cannot start" in result.detail
    failing = tmp_path / "failing"
    failing.write_text("#!/bin/sh\necho 'slurm_update error: Invalid node name specified' >&2\nexit 1\n")
    failing.chmod(0o755)
    result = sa.slurm_drain("n1", "r", scontrol=str(failing))
    assert not result.ok
    assert "rc=1" in result.detail and "Invalid node name specified" in result.detail


@pytest.mark.slow
def test_exec_gets_stdin() -> None:
    payload = json.dumps({"incident": "inc-1", "root_cause": {"rank": 3}}).encode()
    code = "import sys, json; d = json.load(sys.stdin); print('got', d['incident'], d['root_cause']['rank'])"
    result = sa.run_exec([PY, "-c", code], payload, 20)
    assert result.ok, result.detail
    assert "got inc-1 3" in result.detail


@pytest.mark.slow
def test_exec_big_stdin_unread_and_big_output_bounded() -> None:
    start = time.monotonic()
    result = sa.run_exec([PY, "-c", "import sys; sys.stdout.write('y' * 10_000_000)"], b"x" * 5_000_000, 20)
    assert result.ok, result.detail
    assert len(result.detail) <= sa.MAX_DETAIL
    assert time.monotonic() - start < 15


@pytest.mark.slow
def test_exec_timeout_kills_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    code = ("import subprocess, sys, time\n"
            "child = subprocess.Popen(['sleep', '60'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
            "print('started', flush=True)\n"
            "time.sleep(60)\n")
    start = time.monotonic()
    result = sa.run_exec([PY, "-c", code], b"{}", 3)
    took = time.monotonic() - start
    assert not result.ok
    assert "timed out after 3 s" in result.detail and "started" in result.detail
    assert took < 10, took
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the command's child outlived the timeout"


@pytest.mark.slow
def test_exec_descendant_holding_stdout_does_not_block(tmp_path: Path) -> None:
    pid_file = tmp_path / "bg.pid"
    start = time.monotonic()
    result = sa.run_exec(["sh", "-c", f"sleep 60 & echo $! > {pid_file}; echo main done"], b"", 20)
    assert result.ok, result.detail
    assert "main done" in result.detail
    assert time.monotonic() - start < 8
    bg = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(bg) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(bg)


@pytest.mark.slow
def test_exec_errors_are_results(tmp_path: Path) -> None:
    assert not sa.run_exec([], b"", 1).ok
    assert not sa.run_exec("echo hi", b"", 1).ok   # a string, not a list of arguments
    missing = sa.run_exec([str(tmp_path / "nope")], b"", 1)
    assert not missing.ok and "cannot start" in missing.detail
    failed = sa.run_exec(["sh", "-c", "echo oops >&2; exit 3"], b"", 5)
    assert not failed.ok and "rc=3" in failed.detail and "oops" in failed.detail


class _FakeApi(BaseHTTPRequestHandler):
    seen: list[dict[str, Any]] = []
    status = 200

    def do_PATCH(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
        reply = json.dumps({"kind": "Node", "spec": {"unschedulable": True}} if self.status == 200
                           else {"kind": "Status", "message": "nodes is forbidden"}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_api() -> Iterator[tuple[str, type[_FakeApi]]]:
    handler = type("Handler", (_FakeApi,), {"seen": [], "status": 200})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_k8s_cordon_sends_kubectl_cordon_patch(fake_api: tuple[str, type[_FakeApi]]) -> None:
    url, handler = fake_api
    result = sa.k8s_cordon("gpu-node-7.example", api_server=url + "/", token="s3cret", ca_file=None)
    assert result.ok, result.detail
    assert "HTTP 200" in result.detail and "unschedulable=True" in result.detail
    assert "s3cret" not in result.detail
    (req,) = handler.seen
    assert req["path"] == "/api/v1/nodes/gpu-node-7.example"
    assert req["headers"]["Content-Type"] == "application/strategic-merge-patch+json"
    assert req["headers"]["Authorization"] == "Bearer s3cret"
    assert json.loads(req["body"]) == {"spec": {"unschedulable": True}}


def test_k8s_cordon_failures_are_results(fake_api: tuple[str, type[_FakeApi]]) -> None:
    url, handler = fake_api
    handler.status = 403
    forbidden = sa.k8s_cordon("n1", api_server=url, token=None, ca_file=None)
    assert not forbidden.ok and "HTTP 403" in forbidden.detail and "forbidden" in forbidden.detail
    assert "Authorization" not in handler.seen[0]["headers"]
    assert not sa.k8s_cordon("Bad_Node", api_server=url, token=None, ca_file=None).ok
    assert not sa.k8s_cordon("n1", api_server="ftp://x", token=None, ca_file=None).ok
    with HTTPServer(("127.0.0.1", 0), _FakeApi) as closed:
        port = closed.server_address[1]
    refused = sa.k8s_cordon("n1", api_server=f"http://127.0.0.1:{port}", token=None, ca_file=None,
                            timeout_s=2)
    assert not refused.ok and "URLError" in refused.detail
    bad_ca = sa.k8s_cordon("n1", api_server="https://127.0.0.1:1", token="t", ca_file="/no/such/ca.crt",
                           timeout_s=2)
    assert not bad_ca.ok
