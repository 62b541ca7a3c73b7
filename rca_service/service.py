"""The live RCA service: wires receiver -> ingest queue -> engine -> store / alerts / API.

All analysis happens in the engine (pure); this module only owns threads, clocks,
sockets and the database.
"""

from __future__ import annotations

import gc
import json
import logging
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mycroft import schema
from mycroft.auth import ANONYMOUS_ADMIN, Authenticator, Principal
from mycroft.http_server import HttpLimits, TlsFiles
from mycroft.otlp import DecodeCache, SpanRecord, keep_only_named, keep_only_named_records
from mycroft.otlp_server import OtlpReceiver, split_host_port
from mycroft.security_cli import warn_if_open

from .config import AnalysisConfig
from .incidents import hosts as fleet
from .incidents.action_policy import JobFacts, Policy
from .incidents.actions import ActionRunner, job_facts
from .incidents.alerts import SEND, STAND_DOWN, Alerter, alert_action, stood_down
from .incidents.directives import DirectiveBoard
from .incidents.engine import Engine
from .incidents.store import Store
from .incidents.tracker import FIRING, REFRESHED, Incident
from .ingest.queue import Forwarder, IngestQueue
from .ingest.state import JobState
from .metrics import Metrics
from .web.api import ApiServer

log = logging.getLogger("mycroft.rca")


@dataclass
class ServiceOptions:
    otlp_grpc: str | None = "0.0.0.0:4317"
    otlp_http: str | None = "0.0.0.0:4318"
    http: str = "0.0.0.0:8080"
    db: str = "mycroft-rca.db"
    webhooks: list[str] = field(default_factory=list)
    webhook_secret: str | None = None
    alertmanager: str | None = None
    forward: str | None = None
    external_url: str = ""
    tick_s: float = 0.2
    # of one core: passes of t CPU s (smoothed) wait max(tick_s, t * (1/share - 1)), at most
    # max_pass_wait_s. Small jobs (a pass of a few ms) still run every tick; a 16k-rank job's
    # ~15-25 ms passes run every ~0.3-0.5 s, which a verdict that needs a second of silence
    # hardly notices; the cap keeps the costly pass at a hang's onset (drawing, storing) from
    # pushing the next one seconds away. (0.08 before the passes got cheaper: the same cadence.)
    max_analysis_share: float = 0.05
    max_pass_wait_s: float = 0.5
    max_queued_spans: int = 500_000
    max_queued_heartbeats: int = 100_000  # ~6 s of a 16k-rank job; they never wait behind op spans
    alertmanager_refresh_s: float = 60.0
    alert_min_severity: str = "critical"  # info | warning | critical: the least that pages
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)
    auth: Authenticator | None = None  # None: anyone who reaches a port may write and read
    tls: TlsFiles | None = None  # serves OTLP (gRPC, HTTP) and the API over TLS (mTLS with client_ca)
    limits: HttpLimits = field(default_factory=HttpLimits)  # of the OTLP receivers (the API has its own)
    # --actions FILE (action_policy.py); None: no actions (the fleet memory's suspect rule is the default one)
    actions: Policy | None = None
    directive_max_wait_s: float = 60.0  # the longest a directive poll is held
    hosts_every_s: float = 30.0  # how often the hosts of live jobs are noted in the fleet memory
    fleet_retention_s: float = 30 * 86400.0


#: cyclic-GC thresholds for a serving process (gc.set_threshold): the default first generation
#: (700 net allocations) makes a 16k-rank state, millions of live objects, pay a collection every
#: few hundred heartbeats (~8 us per heartbeat measured, a third of the fold); folded records are
#: freed by reference counting, so rarer collections cost no memory that matters. A young
#: collection traverses what was allocated since the last one and is still alive; the fold's
#: objects that live one heartbeat interval (a rank's in-flight ops, its checked arrays) are
#: mostly gone when the first generation holds 200k (a collection every few seconds at 16k
#: ranks, ~40 ms each): the fold's GC time went from 1.6 to 0.5 us per heartbeat (in process,
#: 16k ranks, steady state; at 50k: every ~1 s, ~16 ms each, most of its objects still alive)
SERVE_GC_THRESHOLDS = (200_000, 20, 20)


#: per-host Prometheus series at most (suspects first, then the hosts with the most incidents): a
#: fleet of 10k hosts must not become 10k series per metric
MAX_HOST_SERIES = 200
#: per-job trace budget series at most (the jobs with the most ranks)
MAX_JOB_SERIES = 100


def trace_budget_series(jobs: Iterable[JobState], limit: int = MAX_JOB_SERIES) -> dict[str, dict[str, float]]:
    """Per job: its trace budget (spans/s, from the ranks' resource) and its ranks' op-span counts
    as their last heartbeats said (kept under the budget, kept as anomalies, sampled away). The ranks
    have no HTTP server; their counts ride in the heartbeats and are summed here."""
    out: dict[str, dict[str, float]] = {"budget": {}, "kept": {}, "anomalies": {}, "sampled_out": {}}
    for job in sorted(jobs, key=lambda j: -len(j.ranks))[:limit]:
        ranks = list(job.ranks.values())
        out["kept"][job.job_id] = float(sum(r.spans_kept for r in ranks))
        out["anomalies"][job.job_id] = float(sum(r.spans_anomalies for r in ranks))
        out["sampled_out"][job.job_id] = float(sum(r.spans_sampled_out for r in ranks))
        budget = next((r.resource.get(schema.RES_TRACE_BUDGET) for r in ranks
                       if r.resource and r.resource.get(schema.RES_TRACE_BUDGET) is not None), None)
        if isinstance(budget, int | float):
            out["budget"][job.job_id] = float(budget)
    return out


def raise_fd_limit(want: int = 65536) -> int:
    """Raise the soft open-file limit towards `want` (capped by the hard one): every held directive
    poll is a socket, and a 1024 soft limit is common. Returns the soft limit now."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        return int(soft)
    except (ImportError, ValueError, OSError):
        return -1


#: the GIL's switch interval for a serving process (sys.setswitchinterval; CPython's default is
#: 5 ms): ten threads (8 gRPC workers decoding, the fold, the analysis, the API) that each hold
#: the GIL for milliseconds were forced to hand it over every 5 ms, and each hand-over let
#: another thread's working set (a 16k-rank state is ~450 MB of objects) push the last one's
#: out of the core's cache. At 50 ms the fold of a 16k-rank job cost ~2 points of a core
#: less (bigjob.py 16k rows, paired runs). What waits longer for the GIL: an analysis pass
#: (0.2-0.5 s apart) or an API request by at most that much, nothing that a verdict notices.
SERVE_SWITCH_INTERVAL_S = 0.05


def tune_gc() -> None:
    """For `mycroft rca serve` (process-wide, so the CLI calls it, not the service object): the
    cyclic GC's thresholds and the GIL's switch interval."""
    gc.set_threshold(*SERVE_GC_THRESHOLDS)
    sys.setswitchinterval(SERVE_SWITCH_INTERVAL_S)


def pass_wait(took_s: float, tick_s: float, share: float, max_wait_s: float = float("inf")) -> float:
    """The pause before the next analysis pass: the tick, stretched so that passes take at most
    `share` of a core (took_s: the pass's CPU seconds; a 16k-rank pass is ~0.02-0.05 s, and
    ingest must keep the rest), but never past `max_wait_s` (nor below the tick)."""
    if share <= 0 or share >= 1:
        return tick_s
    return max(tick_s, min(max_wait_s, took_s * (1.0 / share - 1.0)))


class RcaService:
    def __init__(self, options: ServiceOptions) -> None:
        for address in (options.otlp_grpc, options.otlp_http, options.http):
            if address:
                split_host_port(address)  # a malformed address fails before anything is created
        if options.tls is not None:
            options.tls.server_context()  # unreadable or mismatched cert / key fail before anything binds
        self.options = options
        self.metrics = Metrics()
        self._describe_metrics()
        self.store = Store(options.db)
        self.engine = Engine(options.analysis, firing=self.store.firing())
        self._lock = threading.Lock()
        self.forwarder = Forwarder(options.forward, self.metrics) if options.forward else None
        self.ingest = IngestQueue(self._apply, self.metrics, options.max_queued_spans, tee=self.forwarder,
                                  max_heartbeats=options.max_queued_heartbeats)
        self.receiver = OtlpReceiver(self.ingest.sink, options.otlp_grpc, options.otlp_http, auth=options.auth,
                                     tls=options.tls, limits=options.limits, on_reject=self._rejected,
                                     decode_cache=DecodeCache(), prefilter=self._shed_before_decode,
                                     control=self._control_answer)
        self.alerter = Alerter(self.store, options.webhooks, options.alertmanager, options.webhook_secret,
                               options.external_url)
        self.policy = options.actions or Policy()
        self.board = DirectiveBoard()
        self.board.load(self.store.directives(time.time()))
        self.actions = ActionRunner(options.actions, self.store, self.board, on_done=self._action_done,
                                    poll_window_s=2 * options.directive_max_wait_s + 5.0,
                                    live_ranks=self._live_ranks) \
            if options.actions is not None else None
        try:
            self.api = ApiServer(self, options.http, auth=options.auth, tls=options.tls)
        except Exception:
            self.receiver.stop(0)
            raise
        self._stop = threading.Event()
        self._loop = threading.Thread(target=self._run, name="mycroft-rca-analysis", daemon=True)
        self.started_at = time.time()
        self._last_refresh = 0.0
        self._last_hosts = 0.0
        self._action_series: set[tuple[str, str]] = set()
        self._last_prune = 0.0

    def _control_answer(self) -> bytes | None:
        """Where the ranks that export here poll their directives: this service's HTTP API, on the host they
        reach us at (instrumentation/control_discovery.py)."""
        api = getattr(self, "api", None)
        if api is None:
            return None
        return json.dumps({"port": api.port, "scheme": "https" if self.options.tls else "http"}).encode()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> RcaService:
        if self.forwarder is not None:
            self.forwarder.start()
        self.ingest.start()
        self.receiver.start()
        self.alerter.start()
        if self.actions is not None:
            self.actions.start()
        self.api.start()
        self._loop.start()
        log.info("mycroft rca: OTLP gRPC %s, OTLP HTTP %s, API %s, db %s, auth %s, tls %s", self.receiver.grpc_port,
                 self.receiver.http_port, self.api.port, self.options.db, "on" if self.options.auth else "off",
                 "mTLS" if self.options.tls and self.options.tls.client_ca else "on" if self.options.tls else "off")
        warn_if_open("mycroft rca serve", [self.options.otlp_grpc, self.options.otlp_http, self.options.http],
                     self.options.auth)
        return self

    def stop(self) -> None:
        self.receiver.stop(grace=0.5)
        self.ingest.drain(2.0)
        self.ingest.stop()
        self._stop.set()
        self._loop.join(timeout=5.0)
        if self.actions is not None:
            self.actions.stop()
        self.alerter.deliver_due()
        self.alerter.stop()
        if self.forwarder is not None:
            self.forwarder.flush(2.0)
            self.forwarder.stop()
        self.api.stop()
        self.store.close()

    # ------------------------------------------------------------------ work
    def _rejected(self, reason: str, spans: int) -> None:
        """The receivers refused a request (spans=0: the whole request, before decoding) or spans of it."""
        self.metrics.inc("mycroft_rca_requests_rejected_total", reason=reason)
        if spans:
            self.metrics.inc("mycroft_rca_spans_dropped_total", spans, reason=reason)

    def _shed_before_decode(self, request: Any) -> int:
        """Under an op-span backlog, a gRPC request keeps only its heartbeats, dropped before the
        costly Python decode (or right after the compiled one, when `request` is its records): the
        decoder threads stay free for heartbeats (they never queue behind it)."""
        if not self.ingest.congested():
            return 0
        shed = keep_only_named_records(request, schema.SPAN_HEARTBEAT) if isinstance(request, list) else \
            keep_only_named(request, schema.SPAN_HEARTBEAT)
        if shed:
            self.metrics.inc("mycroft_rca_spans_dropped_total", shed, reason="shed_before_decode")
        return shed

    def _apply(self, records: list[SpanRecord], received_at: float) -> None:
        rejected: dict[str, int] = {}
        started = time.thread_time()
        with self._lock:
            used = self.engine.ingest(records, received_at, rejected=rejected)
        self.metrics.inc("mycroft_rca_cpu_seconds_total", time.thread_time() - started, part="fold")
        self.metrics.inc("mycroft_rca_spans_applied_total", used)
        for reason, count in rejected.items():
            self.metrics.inc("mycroft_rca_spans_dropped_total", count, reason=reason)
        ignored = len(records) - used - sum(rejected.values())
        if ignored:
            self.metrics.inc("mycroft_rca_spans_ignored_total", ignored)

    def analyze_now(self, now: float | None = None) -> None:
        """One pass, as of the oldest heartbeat still queued: a backlog defers verdicts (a rank whose
        newer heartbeats wait in the queue is not silent), it cannot fabricate them."""
        now = time.time() if now is None else now
        horizon = self.ingest.horizon()
        if horizon is not None and horizon < now:
            self.metrics.set("mycroft_rca_ingest_lag_seconds", now - horizon)
            now = horizon
        else:
            self.metrics.set("mycroft_rca_ingest_lag_seconds", 0.0)
        with self._lock:
            events = self.engine.step(now)
            took = self.engine.last_pass.seconds
            jobs = len(self.engine.jobs)
            # where each deciding incident's job runs, read while its state is at hand
            facts = {e.incident.id: job_facts(self.engine.jobs.get(e.incident.job), e.incident) for e in events
                     if self.actions is not None and e.action in ("fired", "updated")}
        self.metrics.note_analysis(took)
        self.metrics.set("mycroft_rca_analysis_seconds", took)
        self.metrics.set("mycroft_rca_jobs", jobs)
        for event in events:
            incident = event.incident
            page = alert_action(event.action, incident, self.options.alert_min_severity) \
                if self.alerter.enabled else None
            if page is not None and event.action != "resolved":
                incident.alerted = page == SEND
            planned = self.actions.plan(incident, facts.get(incident.id, JobFacts()), now) \
                if self.actions is not None and incident.id in facts else []
            # before the alert: what was sent is always on record; the actions it decided in the same transaction
            self.store.save(incident, planned)
            if planned:
                assert self.actions is not None
                self.actions.wake()
                for action in planned:
                    log.warning("action %s %s for incident %s: %s (%s)", action.action, action.target or "-",
                                incident.id, action.result, action.detail[:300])
            self.metrics.inc("mycroft_rca_incident_events_total", action=event.action, kind=incident.kind)
            level = logging.DEBUG if event.action == REFRESHED else \
                logging.WARNING if incident.severity != "info" else logging.INFO
            log.log(level, "incident %s %s (%s): %s", event.action, incident.id, incident.severity, incident.summary)
            if page is not None:
                self.alerter.notify(stood_down(incident, now) if page == STAND_DOWN else incident, now)
        if self.alerter.enabled and now - self._last_refresh >= self.options.alertmanager_refresh_s:
            self._last_refresh = now
            self.alerter.refresh([i for i in self.engine.tracker.active.values() if i.alerted], now)
        if now - self._last_hosts >= self.options.hosts_every_s:
            self._last_hosts = now
            self.note_hosts()
        if now - self._last_prune >= 3600.0:
            self._last_prune = now
            self.store.prune_fleet(now - max(self.options.fleet_retention_s, self.policy.suspects.window_s))

    def note_hosts(self) -> None:
        """Which hosts run which live jobs, into the fleet memory (hosts of healthy jobs are fleet too)."""
        seen: dict[tuple[str, str], tuple[float, float]] = {}
        with self._lock:  # ~16k ranks: a few ms, every hosts_every_s
            for job_id, job in self.engine.jobs.items():
                for rank in job.ranks.values():
                    if not rank.host:
                        continue
                    key = (rank.host, job_id)
                    first, last = seen.get(key, (rank.first_seen, rank.last_seen))
                    seen[key] = (min(first, rank.first_seen), max(last, rank.last_seen))
        if seen:
            self.store.note_hosts_seen((host, job, first, last) for (host, job), (first, last) in seen.items())

    def _live_ranks(self, job_id: str) -> int | None:
        """How many ranks of the job are alive now (no final heartbeat, not silent); None: job unknown.
        A requeue / cancel waits for none to be left after an abort (incidents/actions.py)."""
        from .analysis.triggers import ALIVE, statuses

        with self._lock:
            job = self.engine.jobs.get(job_id)
            if job is None:
                return None
            return sum(1 for status in statuses(job, time.time(), self.options.analysis).values() if status == ALIVE)

    def _action_done(self, incident_id: str) -> None:
        """An action finished: receivers that were paged hear what was done (an update of the incident)."""
        doc = self.store.get(incident_id)
        if doc is None or not doc.get("alerted") or not self.alerter.enabled:
            return
        self.alerter.notify(Incident.from_dict(doc))

    def _run(self) -> None:
        wait = self.options.tick_s
        cost = 0.0  # smoothed CPU seconds per pass: one costly pass (a slowness search) must not stall the next
        while not self._stop.wait(wait):
            started = time.thread_time()  # this thread's CPU: a pass's wall time also counts GIL waits
            try:
                self.analyze_now()
            except Exception:
                log.exception("analysis pass failed")
                self.metrics.inc("mycroft_rca_analysis_errors_total")
            spent = time.thread_time() - started
            self.metrics.inc("mycroft_rca_cpu_seconds_total", spent, part="analysis")
            cost = 0.7 * cost + 0.3 * spent
            wait = pass_wait(cost, self.options.tick_s, self.options.max_analysis_share, self.options.max_pass_wait_s)

    # ------------------------------------------------------------------ API backend
    def list_incidents(self, limit: int, job: str | None, status: str | None,
                       principal: Principal = ANONYMOUS_ADMIN) -> list[dict[str, Any]]:
        allowed = None if principal.all_jobs else principal.allows_job
        listed = self.store.list_incidents(limit, job, status, job_allowed=allowed)
        actions = self.store.actions_of(str(inc["id"]) for inc in listed)
        # drawings: on the page / GET one
        return [{**{k: v for k, v in inc.items() if k != "view"}, "actions": actions[str(inc["id"])]} for inc in listed]

    def get_incident(self, incident_id: str) -> dict[str, Any] | None:
        incident = self.store.get(incident_id)
        if incident is not None:
            incident["actions"] = self.store.actions_of([incident_id])[incident_id]
        return incident

    @property
    def directives(self) -> DirectiveBoard:
        return self.board

    @property
    def max_directive_wait_s(self) -> float:
        return self.options.directive_max_wait_s

    def host_records(self, principal: Principal = ANONYMOUS_ADMIN) -> list[fleet.HostRecord]:
        """The fleet memory folded (hosts.py), of the token's jobs only."""
        now = time.time()
        cfg = self.policy.suspects
        seen, rows, actions = self.store.fleet(now - max(cfg.window_s, fleet.STRIP_DAYS * fleet.DAY_S))
        if not principal.all_jobs:
            seen = [s for s in seen if principal.allows_job(s.job)]
            rows = [r for r in rows if principal.allows_job(r.job)]
            ids = {r.incident for r in rows}
            actions = [a for a in actions if a.incident in ids]
        return fleet.fold(seen, rows, actions, now, cfg)

    def hosts(self, principal: Principal = ANONYMOUS_ADMIN) -> list[dict[str, Any]]:
        now = time.time()
        return [record.to_dict(now) for record in self.host_records(principal)]

    def jobs(self, principal: Principal = ANONYMOUS_ADMIN) -> list[dict[str, Any]]:
        with self._lock:
            summary = self.engine.jobs_summary(time.time())
        return summary if principal.all_jobs else [j for j in summary if principal.allows_job(str(j["job"]))]

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "uptime_s": round(time.time() - self.started_at, 3),
                "jobs": len(self.engine.jobs), "queued_spans": self.ingest.queued,
                "firing": len(self.engine.tracker.active)}

    def metrics_text(self) -> str:
        counts = self.store.count()
        self.metrics.set("mycroft_rca_incidents", counts.get(FIRING, 0), status="firing")
        self.metrics.set("mycroft_rca_incidents", counts.get("resolved", 0), status="resolved")
        self.metrics.set("mycroft_rca_queued_spans", self.ingest.queued)
        self.metrics.set("mycroft_rca_alert_outbox", self.store.outbox_size())
        self.metrics.set("mycroft_rca_alerts_sent", self.alerter.sent)
        self.metrics.set("mycroft_rca_alerts_failed_attempts", self.alerter.failed)
        self.metrics.set("mycroft_rca_alerts_suppressed", self.alerter.suppressed)
        actions = self.store.action_counts()
        self._action_series |= set(actions)  # an owed action that ran leaves owed at 0, not at its old count
        for action, result in self._action_series:
            self.metrics.set("mycroft_rca_actions", actions.get((action, result), 0), action=action, result=result)
        self.metrics.set("mycroft_rca_directive_polls_held", self.board.held())
        self.metrics.set("mycroft_rca_directive_polls", self.board.polls)
        self.metrics.set("mycroft_rca_directives_delivered", self.board.delivered)
        records = self.host_records()
        suspects = [r for r in records if r.suspect]
        self.metrics.set("mycroft_rca_hosts", len(records), state="seen")
        self.metrics.set("mycroft_rca_hosts", len(suspects), state="suspect")
        top = [r for r in records if r.incidents][:MAX_HOST_SERIES]  # suspects sort first
        self.metrics.replace_series("mycroft_rca_host_root_cause_incidents", "host",
                                    {r.host: float(len(r.counted)) for r in top})
        self.metrics.replace_series("mycroft_rca_host_suspect", "host",
                                    {r.host: 1.0 for r in suspects[:MAX_HOST_SERIES]})
        with self._lock:
            traces = trace_budget_series(self.engine.jobs.values())
        self.metrics.replace_series("mycroft_rca_trace_budget_spans_per_second", "job", traces["budget"])
        for outcome in ("kept", "anomalies", "sampled_out"):
            self.metrics.replace_series(f"mycroft_rca_trace_op_spans_{outcome}", "job", traces[outcome])
        return self.metrics.render(time.time())

    def _describe_metrics(self) -> None:
        m = self.metrics
        m.describe("mycroft_rca_spans_received_total", "counter", "Spans accepted by the OTLP receivers")
        m.describe("mycroft_rca_spans_applied_total", "counter", "Spans folded into job state")
        m.describe("mycroft_rca_spans_ignored_total", "counter", "Spans without rank/job or of other kinds")
        m.describe("mycroft_rca_spans_dropped_total", "counter", "Spans refused or lost, by reason")
        m.describe("mycroft_rca_ingest_spans_per_second", "gauge", "Ingest rate over the last 10 s")
        m.describe("mycroft_rca_analysis_seconds", "gauge", "Duration of the last analysis pass")
        m.describe("mycroft_rca_cpu_seconds_total", "counter",
                   "CPU time of the service's own threads by part: fold (ingest), analysis (passes)")
        m.describe("mycroft_rca_ingest_lag_seconds", "gauge",
                   "How far the last analysis pass was behind the clock (the oldest queued record's age)")
        m.describe("mycroft_rca_incident_events_total", "counter", "Incident events by action and kind")
        m.describe("mycroft_rca_incidents", "gauge", "Stored incidents by status")
        m.describe("mycroft_rca_jobs", "gauge", "Jobs with live state")
        m.describe("mycroft_rca_requests_rejected_total", "counter", "Requests refused by the receivers, by reason")
        m.describe("mycroft_rca_analysis_errors_total", "counter", "Analysis passes that raised")
        m.describe("mycroft_rca_queued_spans", "gauge", "Spans waiting in the ingest queue")
        m.describe("mycroft_rca_alert_outbox", "gauge", "Alert deliveries waiting in the outbox")
        m.describe("mycroft_rca_alerts_sent", "gauge", "Alert deliveries accepted by a receiver since start")
        m.describe("mycroft_rca_alerts_failed_attempts", "gauge", "Alert delivery attempts that failed since start")
        m.describe("mycroft_rca_alerts_suppressed", "gauge", "Firing incidents not paged: too many firing at once")
        m.describe("mycroft_rca_actions", "gauge", "Actions recorded by the action policy, by action and result")
        m.describe("mycroft_rca_directive_polls_held", "gauge", "Directive long-polls held open now")
        m.describe("mycroft_rca_directive_polls", "gauge", "Directive polls answered or held since start")
        m.describe("mycroft_rca_directives_delivered", "gauge", "Directives handed to a poll since start")
        m.describe("mycroft_rca_hosts", "gauge", "Hosts in the fleet memory (suspect: on the suspect list)")
        m.describe("mycroft_rca_host_root_cause_incidents", "gauge",
                   f"Per host (at most {MAX_HOST_SERIES}): incidents within the suspect window that named one of its "
                   "ranks as the root cause with a counted cause kind")
        m.describe("mycroft_rca_host_suspect", "gauge", "1 for each host on the suspect list")
        m.describe("mycroft_rca_trace_budget_spans_per_second", "gauge",
                   f"Per job (at most {MAX_JOB_SERIES}): its trace budget, op spans per second for the whole job "
                   "(MYCROFT_TRACE_BUDGET)")
        m.describe("mycroft_rca_trace_op_spans_kept", "gauge",
                   "Per job: op spans its ranks sent under the trace budget, as their last heartbeats counted")
        m.describe("mycroft_rca_trace_op_spans_anomalies", "gauge",
                   "Per job: op spans its ranks sent whatever the budget (failed, timed out, slow)")
        m.describe("mycroft_rca_trace_op_spans_sampled_out", "gauge",
                   "Per job: op spans its ranks did not send (sampled away by the trace budget)")
