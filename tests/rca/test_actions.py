"""Actions on a real `mycroft rca serve --actions FILE` process (and in-process services where a
test needs to reach inside): observe records without acting, act runs an exec exactly once and
publishes an abort directive, a kill -9 between verdict and action runs it once after the
restart, the directive long-poll (answer on publish, 204 on timeout, auth), drain_node through
a stub scontrol with per-host rate limits, the fleet memory's hosts API, suspect list, metrics
and page."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from mycroft.rca_service.incidents.action_policy import parse_policy
from mycroft.rca_service.service import RcaService, ServiceOptions

from mycroft.auth import Authenticator

from .feeds import Feeder
from .helpers import WebhookReceiver, get_json, http, wait_until


def _serve(db: Path, policy: Path, *extra: str) -> tuple[subprocess.Popen[str], dict[str, int]]:
    proc = subprocess.Popen([sys.executable, "-m", "mycroft.cli", "rca", "serve", "--otlp-grpc", "127.0.0.1:0",
                             "--otlp-http", "127.0.0.1:0", "--http", "127.0.0.1:0", "--db", str(db),
                             "--tick", "0.1", "--actions", str(policy), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        raise AssertionError(f"mycroft rca serve exited {proc.returncode}")
    return proc, json.loads(line)


def _incident(api: str, job: str) -> dict[str, Any] | None:
    found = [i for i in get_json(f"{api}/api/v1/incidents?job={job}") if i["kind"] in ("hang", "crash")
             and not i.get("consequence_of")]
    return get_json(f"{api}/api/v1/incidents/{found[-1]['id']}") if found else None


def _actions(api: str, job: str) -> dict[str, dict[str, Any]]:
    incident = _incident(api, job)
    return {a["action"]: a for a in (incident or {}).get("actions", [])}


def _policy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "actions.yaml"
    path.write_text(text)
    return path


def _appender(tmp_path: Path, name: str = "ran") -> tuple[Path, Path]:
    """An exec command that appends one line per run to a file (and keeps its stdin)."""
    out = tmp_path / name
    script = tmp_path / f"{name}.sh"
    script.write_text(f"#!/bin/sh\ncat > {out}.stdin.json\necho \"$(date +%s.%N)\" >> {out}\n")
    script.chmod(0o755)
    return script, out


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.slow
def test_observe_records_what_would_be_done_and_does_nothing(tmp_path: Path) -> None:
    script, ran = _appender(tmp_path)
    policy = _policy(tmp_path, f"""
rules:
  - kinds: [hang]
    do: [abort_job, drain_node, {{exec: {{argv: [{script}]}}}}]
""")
    hook = WebhookReceiver()
    proc, ports = _serve(tmp_path / "rca.db", policy, "--webhook", hook.url)
    feeder = Feeder("obs", ports["otlp_http"])
    api = f"http://127.0.0.1:{ports['http']}"
    try:
        assert wait_until(lambda: len(_actions(api, "obs")) == 3, 15), _incident(api, "obs")
        actions = _actions(api, "obs")
        assert {a["mode"] for a in actions.values()} == {"observe"}
        assert actions["abort_job"]["result"] == "observed"
        assert "would publish an abort" in actions["abort_job"]["detail"]
        assert actions["exec"]["result"] == "observed"
        assert actions["drain_node"]["result"] == "skipped"  # not_entered: the program, not the node
        time.sleep(1.0)
        assert not ran.exists()  # nothing run
        assert http(f"{api}/api/v1/directives?job=obs")[0] == 204  # nothing published
        payload = hook.wait(1)[0]
        assert "abort_job obs: observed (observe)" in payload["alerts"][0]["annotations"]["actions"]
        assert payload["mycroft"]["incident"]["actions"][0]["result"] == "observed"
        incident = _incident(api, "obs")
        assert incident is not None
        page = http(f"{api}/incidents/{incident['id']}")[1].decode()
        assert 'id="actions"' in page and 'data-result="observed"' in page
    finally:
        feeder.stop()
        proc.terminate()
        proc.wait(15)
        hook.close()


@pytest.mark.slow
def test_act_runs_exec_exactly_once_and_publishes_the_abort(tmp_path: Path) -> None:
    script, ran = _appender(tmp_path)
    policy = _policy(tmp_path, f"""
mode: act
rules:
  - kinds: [hang, crash]
    do: [abort_job, {{exec: {{argv: [{script}], timeout_s: 10}}}}]
""")
    hook = WebhookReceiver()
    proc, ports = _serve(tmp_path / "rca.db", policy, "--webhook", hook.url)
    feeder = Feeder("act", ports["otlp_http"])
    api = f"http://127.0.0.1:{ports['http']}"
    try:
        assert wait_until(lambda: _lines(ran) == 1, 15)
        # the abort is out, not done: no rank has acknowledged it yet
        assert wait_until(lambda: {a["action"]: a["result"] for a in _actions(api, "act").values()} ==
                          {"exec": "done", "abort_job": "published"}, 10), _actions(api, "act")
        time.sleep(2.0)  # the hang goes on, incident events keep coming: nothing runs twice
        assert _lines(ran) == 1
        incident = _incident(api, "act")
        assert incident is not None
        stdin = json.loads(Path(f"{ran}.stdin.json").read_text())
        assert stdin["incident"]["id"] == incident["id"] and stdin["action"]["action"] == "exec"
        # a host's poller, as instrumentation/directives.py polls: the directive, then its acknowledgment
        code, body = http(f"{api}/api/v1/directives?job=act&after=0&host=node3")
        directive = json.loads(body)
        assert code == 200 and directive["action"] == "abort" and directive["incident"] == incident["id"]
        assert directive["reason"].startswith("rank 2 (not_entered) in a hang") and directive["exit_code"] == 75
        assert _actions(api, "act")["abort_job"]["result"] == "published"  # handed over, not acknowledged yet
        assert http(f"{api}/api/v1/directives?job=act&after={directive['seq']}&host=node3"
                    f"&acked={directive['seq']}")[0] == 204
        assert wait_until(lambda: _actions(api, "act")["abort_job"]["result"] == "done", 10), _actions(api, "act")
        assert "acknowledged by 1 host(s) of job act: node3" in _actions(api, "act")["abort_job"]["detail"]
        # the receiver heard what was done: a follow-up once the actions completed
        assert wait_until(lambda: any("abort_job act: done" in p["alerts"][0]["annotations"]["actions"]
                                      for p in hook.payloads()), 10), [p["alerts"][0]["annotations"]["actions"]
                                                                       for p in hook.payloads()]
        metrics = http(f"{api}/metrics")[1].decode()
        assert 'mycroft_rca_actions{action="exec",result="done"} 1.0' in metrics
    finally:
        feeder.stop()
        proc.terminate()
        proc.wait(15)
        hook.close()


@pytest.mark.slow  # real processes, seconds each
def test_kill_9_between_verdict_and_action_then_restart_runs_it_once(tmp_path: Path) -> None:
    script, ran = _appender(tmp_path)
    policy = _policy(tmp_path, f"""
mode: act
rules:
  - kinds: [hang]
    delay_s: 4            # decided now, run 4 s later: the window the service is killed in
    do: [abort_job, {{exec: {{argv: [{script}]}}}}]
""")
    db = tmp_path / "rca.db"
    proc, ports = _serve(db, policy)
    feeder = Feeder("k9", ports["otlp_http"])
    api = f"http://127.0.0.1:{ports['http']}"
    try:
        assert wait_until(lambda: {a["result"] for a in _actions(api, "k9").values()} == {"owed"}
                          and len(_actions(api, "k9")) == 2, 15), _actions(api, "k9")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert not ran.exists()  # decided, owed, not run
    proc, ports = _serve(db, policy)
    feeder.port = ports["otlp_http"]
    api = f"http://127.0.0.1:{ports['http']}"
    try:
        assert wait_until(lambda: _lines(ran) == 1, 15)
        assert wait_until(lambda: {a["action"]: a["result"] for a in _actions(api, "k9").values()} ==
                          {"exec": "done", "abort_job": "published"}, 10), _actions(api, "k9")
        time.sleep(2.0)
        assert _lines(ran) == 1
        code, body = http(f"{api}/api/v1/directives?job=k9")
        assert code == 200 and json.loads(body)["seq"] == 1
        assert http(f"{api}/api/v1/directives?job=k9&after=1&acked=1&host=n0")[0] == 204  # its host acknowledges
        assert wait_until(lambda: {a["result"] for a in _actions(api, "k9").values()} == {"done"}, 10), \
            _actions(api, "k9")
        assert http(f"{api}/api/v1/directives?job=k9&after=1")[0] == 204  # one directive, not two
        assert len([i for i in get_json(f"{api}/api/v1/incidents?job=k9") if i["kind"] == "hang"]) == 1
    finally:
        feeder.stop()
        proc.terminate()
        proc.wait(15)
    # and a restart after it ran runs nothing again
    proc, ports = _serve(db, policy)
    try:
        time.sleep(1.5)
        assert _lines(ran) == 1
    finally:
        proc.terminate()
        proc.wait(15)


# ------------------------------------------------------------------ in-process: directives, drains, hosts
INGEST, OTHER, READ = "ingest-token-1", "ingest-token-2", "read-token-1"
AUTH = Authenticator.from_mapping({"tokens": [
    {"token": INGEST, "role": "ingest", "jobs": ["dir-*"]}, {"token": OTHER, "role": "ingest", "jobs": ["else-*"]},
    {"token": READ, "role": "read"}]})


def _service(tmp_path: Path, policy: str, **kw: Any) -> RcaService:
    return RcaService(ServiceOptions(otlp_grpc=None, otlp_http="127.0.0.1:0", http="127.0.0.1:0",
                                     db=str(tmp_path / "rca.db"), tick_s=0.05,
                                     actions=parse_policy(yaml.safe_load(policy)), **kw)).start()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def directive_service(tmp_path: Path) -> Iterator[RcaService]:
    service = _service(tmp_path, "mode: act\nrules: [{kinds: [hang], do: [abort_job]}]", auth=AUTH)
    yield service
    service.stop()


def test_directive_long_poll_answers_on_publish_and_on_timeout(directive_service: RcaService) -> None:
    service = directive_service
    api = f"http://127.0.0.1:{service.api.port}"
    url = f"{api}/api/v1/directives?job=dir-a&after=0"
    # authenticated like ingest: no token 401, a read token may, an ingest token of the job may,
    # an ingest token of other jobs may not
    assert http(url)[0] == 401
    assert http(url, headers=_bearer(OTHER))[0] == 403
    assert http(url, headers=_bearer(READ))[0] == 204
    assert http(f"{api}/api/v1/incidents", headers=_bearer(INGEST))[0] == 403  # still no API reads
    assert http(f"{api}/api/v1/directives?after=0", headers=_bearer(INGEST))[0] == 400  # job is required
    assert http(f"{url}&wait=-1", headers=_bearer(INGEST))[0] == 400
    started = time.monotonic()
    assert http(f"{url}&wait=0.6&host=node0", headers=_bearer(INGEST))[0] == 204  # held, then nothing
    assert 0.5 <= time.monotonic() - started < 3.0
    got: list[tuple[int, bytes, float]] = []

    def poll() -> None:
        request = urllib.request.Request(f"{url}&wait=20&host=node0", headers=_bearer(INGEST))
        with urllib.request.urlopen(request, timeout=30) as response:
            got.append((int(response.status), bytes(response.read()), time.time()))

    threading.Thread(target=poll, daemon=True).start()
    assert wait_until(lambda: service.board.held() == 1, 5)
    feeder = Feeder("dir-a", service.receiver.http_port or 0, run="r1", token=INGEST)
    try:
        assert wait_until(lambda: bool(got), 15)
        code, body, at = got[0]
        directive = json.loads(body)
        assert code == 200 and directive["job"] == "dir-a" and directive["action"] == "abort"
        (action,) = service.store.actions_of([directive["incident"]])[directive["incident"]]
        # out to the 2 polling hosts (node0, 127.0.0.1), done only once one acknowledges it
        assert action["result"] == "published" and "2 host(s) of job dir-a polling" in action["detail"]
        acked = f"{api}/api/v1/directives?job=dir-a&after={directive['seq']}&acked={directive['seq']}&host=node0"
        assert http(acked, headers=_bearer(INGEST))[0] == 204
        assert wait_until(lambda: service.store.actions_of([directive["incident"]])[directive["incident"]][0]
                          ["result"] == "done", 10)
        assert at - directive["issued_at_unix"] < 1.0 and service.board.held() == 0  # woken, not re-polled
        # a relaunch (another run id) is not aborted by it; the same run (or a poll without one) is
        assert directive["run"] == "r1"
        assert http(f"{url}&run=r2", headers=_bearer(INGEST))[0] == 204
        assert http(f"{url}&run=r1", headers=_bearer(INGEST))[0] == 200
    finally:
        feeder.stop()


def test_an_abort_handed_over_but_never_acknowledged_is_undeliverable_saying_so(tmp_path: Path) -> None:
    """A poll took the directive and no host acknowledged it (its ranks gone or frozen before they relayed
    it): after the poll window (2 x the longest hold + 5 s) the abort is undeliverable, not done."""
    service = _service(tmp_path, "mode: act\nrules: [{kinds: [hang], do: [abort_job]}]", directive_max_wait_s=1.0)
    feeder = Feeder("no-ack", service.receiver.http_port or 0)
    try:
        api = f"http://127.0.0.1:{service.api.port}"
        assert wait_until(lambda: _actions(api, "no-ack").get("abort_job", {}).get("result") == "published", 15)
        assert http(f"{api}/api/v1/directives?job=no-ack&after=0&host=frozen")[0] == 200
        assert wait_until(lambda: _actions(api, "no-ack")["abort_job"]["result"] != "published", 15)
        action = _actions(api, "no-ack")["abort_job"]
        assert action["result"] == "undeliverable" and "handed to 1 poll(s)" in action["detail"], action
        assert http(f"{api}/api/v1/directives?job=no-ack&acked=x")[0] == 400
    finally:
        feeder.stop()
        service.stop()


def test_abort_of_a_job_whose_ranks_never_poll_is_undeliverable(tmp_path: Path) -> None:
    service = _service(tmp_path, "mode: act\nrules: [{kinds: [hang], do: [abort_job]}]", directive_max_wait_s=1.0)
    assert service.actions is not None
    service.actions.started_at -= 3600  # a service up for an hour: the job's ranks had every chance to poll
    feeder = Feeder("behind-collector", service.receiver.http_port or 0)
    try:
        api = f"http://127.0.0.1:{service.api.port}"
        assert wait_until(lambda: "abort_job" in _actions(api, "behind-collector")
                          and _actions(api, "behind-collector")["abort_job"]["result"] != "owed", 15)
        action = _actions(api, "behind-collector")["abort_job"]
        assert action["result"] == "undeliverable" and "collector" in action["detail"], action
        assert http(f"{api}/api/v1/directives?job=behind-collector")[0] == 200  # published all the same
    finally:
        feeder.stop()
        service.stop()


@pytest.mark.slow
def test_drain_lost_ranks_host_with_requeue_rate_limited_per_host_and_fleet_memory(tmp_path: Path) -> None:
    calls = tmp_path / "scontrol.calls"
    stub = tmp_path / "scontrol"
    stub.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    stub.chmod(0o755)
    service = _service(tmp_path, f"""
mode: act
rules:
  - kinds: [hang, crash]
    do: [{{drain_node: {{requeue: true}}}}]
slurm: {{scontrol: {stub}}}
suspects: {{min_incidents: 2, window_s: 86400}}
""")
    api = f"http://127.0.0.1:{service.api.port}"
    port = service.receiver.http_port or 0
    feeders = []
    try:
        # two jobs lose a rank on the same host: drained once, the second drain rate-limited (per_host 1/h)
        for name, slurm_job in (("lemon-1", "4242"), ("lemon-2", "4343")):
            hosts = {0: "n-a", 1: "n-b", 2: "lemon", 3: "n-c"} if name == "lemon-1" else \
                {0: "lemon", 1: "n-d", 2: "n-e", 3: "n-f"}
            feeders.append(Feeder(name, port, culprit=2 if name == "lemon-1" else 0, lost=True, hosts=hosts,
                                  slurm_job=slurm_job))

            def drained(job: str = name) -> bool:
                action = _actions(api, job).get("drain_node")
                return action is not None and action["result"] not in ("owed", "running")

            assert wait_until(drained, 20), _incident(api, name)
        first, second = _actions(api, "lemon-1")["drain_node"], _actions(api, "lemon-2")["drain_node"]
        assert first["result"] == "done" and first["target"] == "lemon", first
        assert second["result"] == "rate_limited" and "per_host" in second["detail"], second
        lines = calls.read_text().splitlines()
        assert lines[0].startswith("update nodename=lemon state=drain reason=mycroft hang: rank 2 process_lost: ")
        assert lines[0].count("incident ") == 1
        assert lines[1:] == ["requeue 4242"]
        service.note_hosts()
        hosts_doc = {h["host"]: h for h in get_json(f"{api}/api/v1/hosts")}
        lemon = hosts_doc["lemon"]
        assert lemon["suspect"] and lemon["incidents"] == 2 and lemon["jobs"] == 2, lemon
        assert [(a["action"], a["result"]) for a in lemon["actions"]] == [("drain_node", "rate_limited"),
                                                                          ("drain_node", "done")]
        assert not hosts_doc["n-a"]["suspect"] and hosts_doc["n-a"]["incidents"] == 0
        code, body = http(f"{api}/api/v1/hosts/suspect?format=slurm")
        assert code == 200 and body == b"lemon\n"
        assert [h["host"] for h in get_json(f"{api}/api/v1/hosts/suspect")] == ["lemon"]
        assert http(f"{api}/api/v1/hosts/suspect?format=xml")[0] == 400
        metrics = http(f"{api}/metrics")[1].decode()
        assert 'mycroft_rca_host_suspect{host="lemon"} 1.0' in metrics
        assert 'mycroft_rca_hosts{state="suspect"} 1.0' in metrics
        page = http(f"{api}/hosts")[1].decode()
        assert 'class="host suspect" data-host="lemon"' in page
    finally:
        for feeder in feeders:
            feeder.stop()
        service.stop()


def test_cordon_node_patches_the_kubernetes_node_of_the_lost_rank(tmp_path: Path) -> None:
    """What kubectl cordon sends, to a stand-in API server: the pod's node (k8s.node.name), the token."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[tuple[str, str, str, bytes]] = []

    class Api(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_PATCH(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append((self.path, self.headers.get("Authorization", ""), self.headers.get("Content-Type", ""), body))
            reply = b'{"spec": {"unschedulable": true}}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

    api_server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=api_server.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("sa-token-123\n")
    service = _service(tmp_path, f"""
mode: act
rules: [{{kinds: [hang, crash], do: [cordon_node]}}]
kubernetes: {{api_server: "http://127.0.0.1:{api_server.server_address[1]}", token_file: {token}, ca_file: ""}}
""")
    feeder = Feeder("pods", service.receiver.http_port or 0, culprit=3, lost=True, kube=True)
    try:
        api = f"http://127.0.0.1:{service.api.port}"
        assert wait_until(lambda: _actions(api, "pods").get("cordon_node", {}).get("result") == "done", 20), \
            _actions(api, "pods")
        assert _actions(api, "pods")["cordon_node"]["target"] == "k8s-node3"
        ((path, auth, kind, body),) = seen
        assert path == "/api/v1/nodes/k8s-node3" and auth == "Bearer sa-token-123"
        assert kind == "application/strategic-merge-patch+json"
        assert json.loads(body) == {"spec": {"unschedulable": True}}
    finally:
        feeder.stop()
        service.stop()
        api_server.shutdown()
