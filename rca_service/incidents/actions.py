"""From verdict to action: plan with each incident event, run what is owed on a worker thread.

`plan` reads what the store already holds for the incident and the recent actions of the
fleet, and asks the pure `action_policy.decide`; the service writes the result in the same
transaction as the incident event (store.save), so a decision is never lost nor made twice.
The worker runs owed actions once due (a rule's `delay_s`): it marks one running, runs it,
and records its result; after a restart, running ones are run again if idempotent (abort,
drain, cordon) and recorded as interrupted if not (exec). An action whose incident resolved
before it ran is cancelled. abort_job publishes a directive (store + directives.DirectiveBoard)
that the job's ranks long-poll; drain_node / cordon_node / exec go through
scheduler_actions (commands from argument lists, bounded in time, never raising).

Order: an incident's abort runs first (decide puts it first); a drain_node runs at once, and its
requeue / cancel (which kill the ranks) waits until the job's live ranks have left on the abort
(their final heartbeats; a frozen or dead rank is not live) or `slurm.kill_after_abort_s` passed
since the abort was published -- on a thread of its own, so other incidents' actions do not wait:
a scheduler's SIGTERM that beats the abort kills a rank before it prints its line and exits 75.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from mycroft import schema

from ..ingest.state import JobState
from . import scheduler_actions as sched
from .action_policy import (
    ABORT_JOB,
    CANCELLED,
    CORDON_NODE,
    DONE,
    DRAIN_NODE,
    EXEC,
    FAILED,
    OWED,
    PUBLISHED,
    RUNNING,
    UNDELIVERABLE,
    History,
    JobFacts,
    PlannedAction,
    Policy,
    decide,
    paused,
)
from .directives import DirectiveBoard
from .store import ActionRow, Store, directive_dict
from .tracker import FIRING, Incident

log = logging.getLogger("mycroft.rca.actions")

ABORT = "abort"  # the directive's action


def _unheard(job: str, now: float, last: float | None) -> str:
    """Why no rank of `job` can receive its abort, in words."""
    since = f"last poll {now - last:.0f}s ago" if last is not None else "never polled"
    return (f"no rank of job {job} polls /api/v1/directives ({since}): ranks that reach the service only "
            "through a collector need MYCROFT_CONTROL_ENDPOINT set to it (docs/actions.md)")


def job_facts(job: JobState | None, incident: Incident) -> JobFacts:
    """Where the job runs, from its ranks' resources: the run, the SLURM job id (a root-cause rank's
    first, else any rank's), the Kubernetes node of each root-cause host."""
    if job is None:
        return JobFacts()
    causes = [c.get("rank") for c in incident.root_causes[:64]]
    ranks = [job.ranks[r] for r in causes if isinstance(r, int) and r in job.ranks]
    slurm = ""
    for rank in itertools.chain(ranks, itertools.islice(job.ranks.values(), 8)):  # never a 16k-rank list
        value = (rank.resource or {}).get(schema.RES_SLURM_JOB_ID)
        if value not in (None, ""):
            slurm = str(value)
            break
    nodes = {rank.host: str(node) for rank in ranks
             if rank.host and (node := (rank.resource or {}).get(schema.RES_KUBE_NODE_NAME))}
    return JobFacts(run=job.run_id, slurm_job_id=slurm, kube_nodes=nodes)


class ActionRunner:
    """Plans actions (pure decide + the store's history) and runs the owed ones on its own thread."""

    def __init__(self, policy: Policy, store: Store, board: DirectiveBoard, *,
                 on_done: Callable[[str], None] | None = None, poll_window_s: float = 125.0,
                 clock: Callable[[], float] = time.time,
                 live_ranks: Callable[[str], int | None] | None = None) -> None:
        self.policy = policy
        self.store = store
        self.board = board
        self.on_done = on_done  # incident id -> (a follow-up notification)
        self.poll_window_s = poll_window_s  # a job whose ranks poll was polled within this (2 x max wait + slack)
        self.clock = clock
        self.started_at = clock()
        self.live_ranks = live_ranks  # job -> how many of its ranks are alive now (None: job unknown)
        self._killers: list[threading.Thread] = []
        # published aborts waiting for a rank's acknowledgment: row id -> (row, directive seq, published at)
        self._awaiting: dict[int, tuple[ActionRow, int, float]] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ deciding
    def plan(self, incident: Incident, facts: JobFacts, now: float) -> list[PlannedAction]:
        """What the policy says for this incident event (nothing when it cannot apply: no store read)."""
        if not self.policy.rules or incident.consequence_of or incident.status != FIRING:
            return []
        record = incident.to_dict()
        if paused(record):
            return []
        recorded, recent = self.store.action_history(incident.id, now - self.policy.longest_window_s)
        return decide(record, self.policy, History(now, recorded, tuple(recent)), facts)

    # ------------------------------------------------------------------ running
    def start(self) -> ActionRunner:
        again, interrupted = self.store.recover_actions(self.clock())
        if again or interrupted:
            log.warning("actions after a restart: %d owed again, %d exec interrupted (not run twice)",
                        again, interrupted)
        for row, seq in self.store.published_aborts():  # acknowledged after the restart, or not
            self._awaiting[row.id] = (row, seq, self.clock())
        self._thread = threading.Thread(target=self._run, name="mycroft-rca-actions", daemon=True)
        self._thread.start()
        return self

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        for killer in self._killers:
            killer.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_due()
                self.settle_published()
            except Exception:  # a bad row must not stop the others
                log.exception("action pass failed")
            due = self.store.next_due_at()
            wait = 0.5 if due is None else min(0.5, max(0.02, due - self.clock()))
            self._wake.wait(wait)
            self._wake.clear()

    def run_due(self, now: float | None = None) -> int:
        """Run every owed action that is due; how many ran."""
        ran = 0
        while not self._stop.is_set():
            rows = self.store.due_actions(self.clock() if now is None else now, limit=1)
            if not rows:
                return ran
            self.run_one(rows[0])
            ran += 1
        return ran

    def run_one(self, row: ActionRow) -> str:
        """Run one owed action and record its result (returned)."""
        now = self.clock()
        if not self.store.set_action(row.id, RUNNING, row.detail, now, expect=OWED):
            return row.result  # someone else took it
        doc = self.store.get(row.incident)
        if doc is None or doc.get("status") != FIRING:
            why = (doc or {}).get("evidence", {}).get("resolved_because", "gone") if doc else "not found"
            result, detail = CANCELLED, f"incident {row.incident} resolved ({why}) before the action ran"
            self.store.set_action(row.id, result, detail, self.clock())
        elif row.action == ABORT_JOB:
            result, detail = self._abort(row, now)
        elif row.action == DRAIN_NODE and self._kills(row) and self._abort_of(row.incident) is not None:
            # the drain at once, the kill once the abort's ranks have left: on a thread, the others go on
            killer = threading.Thread(target=self._drain_then_kill, args=(row, doc), daemon=True,
                                      name="mycroft-rca-kill")
            self._killers = [k for k in self._killers if k.is_alive()] + [killer]
            killer.start()
            return RUNNING
        else:
            result, detail = self._execute(row, doc)
            self.store.set_action(row.id, result, detail, self.clock())
        self._done(row, result, detail)
        return result

    def _done(self, row: ActionRow, result: str, detail: str) -> None:
        (log.warning if result in (DONE, PUBLISHED, UNDELIVERABLE) else log.error)(
            "action %s %s for incident %s: %s (%s)", row.action, row.target, row.incident, result, detail[:300])
        if self.on_done is not None:
            try:
                self.on_done(row.incident)
            except Exception:
                log.exception("follow-up of action %s failed", row.id)

    def _drain_then_kill(self, row: ActionRow, incident: dict[str, Any]) -> None:
        try:
            result, detail = self._execute(row, incident)
        except Exception as exc:  # never leave the row running
            log.exception("action %s %s failed", row.action, row.target)
            result, detail = FAILED, f"{exc!r}"
        self.store.set_action(row.id, result, detail, self.clock())
        self._done(row, result, detail)

    @staticmethod
    def _kills(row: ActionRow) -> bool:
        params = row.params
        return bool((params.get("requeue") or params.get("cancel")) and params.get("slurm_job_id"))

    def _abort_of(self, incident: str) -> dict[str, Any] | None:
        """This incident's abort_job, when one was decided to run (owed, running or published to polling
        ranks): a kill waits for it. An abort nobody can receive (undeliverable) is not waited for."""
        for action in self.store.actions_of([incident]).get(incident, []):
            if action["action"] == ABORT_JOB and action["result"] in (OWED, RUNNING, PUBLISHED, DONE):
                return dict(action)
        return None

    def await_abort(self, row: ActionRow, poll_s: float = 0.05) -> str:
        """Hold a kill (requeue / cancel) of `row`'s job until the incident's abort has been published, none
        of the job's ranks is alive any more and the job's task steps have ended (squeue), or
        `slurm.kill_after_abort_s` after the abort was published (after the kill was due, while it is
        not); what was waited for, in words."""
        began = self.clock()
        bound = self.policy.slurm.kill_after_abort_s
        while not self._stop.is_set():
            abort = self._abort_of(row.incident)
            if abort is None:
                return ""
            now = self.clock()
            published = abort["result"] in (PUBLISHED, DONE)
            deadline = (float(abort.get("at_unix") or now) if published else began) + bound
            live = self.live_ranks(row.job) if self.live_ranks is not None and published else None
            steps: list[str] | None = []
            if published and (live is None or live <= 0):
                # every rank said goodbye; its process exits a moment later (its host's gather, the groups'
                # abort): SLURM says when -- the step ends once its last task has exited
                slurm = self.policy.slurm
                steps = sched.slurm_job_steps(str(row.params.get("slurm_job_id")), squeue=slurm.squeue,
                                              timeout_s=min(slurm.timeout_s, max(0.1, deadline - now)))
                if not steps:
                    how = "" if steps is not None else "; squeue did not tell the steps"
                    return f"after the abort's ranks left ({self.clock() - began:.1f}s{how})"
            if now >= deadline:
                still = "the abort not published yet" if not published else \
                    f"{live} rank(s) still alive" if live else f"step(s) {', '.join(steps or [])} still running"
                return f"after {bound:g}s (slurm.kill_after_abort_s; {still})"
            self._stop.wait(poll_s)
        return "at the service's stop"

    def _abort(self, row: ActionRow, now: float) -> tuple[str, str]:
        params = row.params
        job = str(params.get("job") or row.job)
        run, reason = str(params.get("run") or ""), str(params.get("reason", ""))
        exit_code, expires = int(params.get("exit_code", 1)), now + float(params.get("ttl_s", 600.0))
        directive = {"job": job, "run": run, "incident": row.incident, "action": ABORT, "reason": reason,
                     "exit_code": exit_code, "issued_at_unix": now, "expires_at_unix": expires}
        polling, last = self.board.pollers(job, now, self.poll_window_s)
        if polling or now - self.started_at < self.poll_window_s:
            result, detail = PUBLISHED, (f"directive {{seq}} published, {polling} host(s) of job {job} polling: "
                                         "done once a rank acknowledges it")
        else:
            result, detail = UNDELIVERABLE, _unheard(job, now, last)
        seq = self.store.finish_with_directive(row, directive, result, detail, self.clock())
        self.board.publish(directive_dict(seq, job, run, row.incident, ABORT, reason, exit_code, now, expires))
        if result == PUBLISHED:
            self._awaiting[row.id] = (row, seq, now)
            self._wake.set()
        return result, detail.replace("{seq}", str(seq))

    def settle_published(self, now: float | None = None) -> int:
        """Published aborts become DONE once a host's poller acknowledged handing them to its ranks, or
        UNDELIVERABLE, saying why, when none did within poll_window_s (a poll is answered at once when
        held, else at the next one: 2 x the longest hold + slack); how many were settled."""
        now = self.clock() if now is None else now
        settled = 0
        for row_id, (row, seq, at) in list(self._awaiting.items()):
            count, hosts = self.board.acknowledged(seq)
            if count:
                named = ", ".join(hosts[:8]) + (f" and {count - 8} more" if count > 8 else "")
                result, detail = DONE, f"directive {seq} acknowledged by {count} host(s) of job {row.job}: {named}"
            elif now - at >= self.poll_window_s:
                handed = self.board.handed(seq)
                _, last = self.board.pollers(row.job, now, self.poll_window_s)
                result, detail = UNDELIVERABLE, (
                    f"directive {seq} handed to {handed} poll(s) of job {row.job}, but no host acknowledged it "
                    f"within {self.poll_window_s:.0f}s (its ranks gone or frozen?)" if handed else
                    f"directive {seq}: {_unheard(row.job, now, last)}")
            else:
                continue
            del self._awaiting[row_id]
            if self.store.set_action(row_id, result, detail, now, expect=PUBLISHED):
                settled += 1
                self._done(row, result, detail)
        return settled

    def _execute(self, row: ActionRow, incident: dict[str, Any]) -> tuple[str, str]:
        params = row.params
        if row.action == DRAIN_NODE:
            slurm = self.policy.slurm
            done = sched.slurm_drain(row.target, str(params.get("reason", "mycroft")), scontrol=slurm.scontrol,
                                     timeout_s=slurm.timeout_s)
            ok, parts = done.ok, [done.detail]
            if params.get("requeue") or params.get("cancel"):
                job_id = str(params.get("slurm_job_id") or "")
                if not job_id:
                    parts.append(f"no SLURM job id reported by the ranks ({schema.RES_SLURM_JOB_ID}): "
                                 f"not {'requeued' if params.get('requeue') else 'cancelled'}")
                else:
                    waited = self.await_abort(row)
                    more = sched.slurm_requeue(job_id, scontrol=slurm.scontrol, timeout_s=slurm.timeout_s) \
                        if params.get("requeue") else \
                        sched.slurm_cancel(job_id, scancel=slurm.scancel, timeout_s=slurm.timeout_s)
                    # a job that ended meanwhile (its script ended with the srun step the abort ended) is cancelled
                    ended = not more.ok and params.get("cancel") and "already completing or completed" in more.detail
                    ok = ok and (more.ok or bool(ended))
                    parts.append(f"{more.detail} ({waited})" if waited else more.detail)
            return (DONE if ok else FAILED), "; ".join(parts)
        if row.action == CORDON_NODE:
            kube = self.policy.kubernetes
            if kube is None:
                return FAILED, "no kubernetes section in the policy"
            try:
                with open(kube.token_file, encoding="utf-8") as f:
                    token = f.read().strip()  # read each time: service-account tokens rotate
            except OSError as exc:
                return FAILED, f"kubernetes token {kube.token_file}: {exc.strerror or exc}"
            done = sched.k8s_cordon(row.target, api_server=kube.api_server, token=token, ca_file=kube.ca_file,
                                    timeout_s=kube.timeout_s)
            return (DONE if done.ok else FAILED), done.detail
        if row.action == EXEC:
            payload = {"incident": {k: v for k, v in incident.items() if k != "view"},
                       "action": {**row.to_dict(), "params": params}}
            done = sched.run_exec([str(a) for a in params.get("argv", [])], json.dumps(payload, default=str).encode(),
                                  float(params.get("timeout_s", 30.0)))
            return (DONE if done.ok else FAILED), done.detail
        return FAILED, f"unknown action {row.action!r}"
