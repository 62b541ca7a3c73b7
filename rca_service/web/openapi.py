"""OpenAPI 3 description of the RCA service's HTTP API (served at /api/v1/openapi.json).

Kept next to the routes (api.py) and checked against the running server by a
property-based run in the tests (tests/rca/test_api_fuzz.py): every answer must be one
the description lists, with the declared content type.
"""

from __future__ import annotations

from typing import Any

_ERROR = {"$ref": "#/components/schemas/Error"}


def _errors(*codes: int) -> dict[str, Any]:
    text = {400: "bad or unknown query parameter", 401: "missing or invalid bearer token (with --auth-config)",
            403: "the token's role or job patterns do not allow this", 404: "no such incident",
            500: "internal error (logged)", 503: "too many connections"}
    return {str(code): {"description": text[code], "content": {"application/json": {"schema": _ERROR}}}
            for code in codes}


_AUTH_ERRORS = (401, 403, 500, 503)

OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {
        "title": "Mycroft RCA service API",
        "version": "1",
        "description": "Incidents (root causes of hangs and slowdowns) and the actions taken on them, live job "
                       "state, the fleet memory of hosts, directives for the ranks, health and metrics. "
                       "Read-only: spans go to the OTLP ports. With --auth-config every path but /healthz "
                       "needs a read or admin bearer token (/api/v1/directives also takes an ingest token of the "
                       "job); lists show only the token's jobs.",
    },
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
            "Incident": {
                "type": "object",
                "required": ["id", "job", "kind", "status", "detected_at", "root_causes"],
                "properties": {
                    "id": {"type": "string"},
                    "job": {"type": "string"},
                    "kind": {"type": "string"},
                    "status": {"type": "string", "enum": ["firing", "resolved"]},
                    "severity": {"type": "string"},
                    "summary": {"type": "string"},
                    "detected_at": {"type": "string"},
                    "root_causes": {"type": "array", "items": {"type": "object"}},
                    "wait_for_graph": {"type": "object"},
                    "view": {"type": "object", "description": "the page's drawing: condensed wait-for graph "
                             "(nodes, edges, chains) and timeline, or per-rank compute / arrival series"},
                    "root_cause_hosts": {"type": "object", "description": "rank -> host of each root-cause rank",
                                         "additionalProperties": {"type": "string"}},
                    "actions": {"type": "array", "items": {"$ref": "#/components/schemas/Action"},
                                "description": "what the action policy did (or, observing, would have done)"},
                },
            },
            "Action": {
                "type": "object",
                "required": ["action", "mode", "target", "at", "result", "detail"],
                "properties": {
                    "action": {"type": "string", "enum": ["abort_job", "drain_node", "cordon_node", "exec"]},
                    "mode": {"type": "string", "enum": ["observe", "act"]},
                    "target": {"type": "string", "description": "the job, or the host / node"},
                    "at": {"type": "string", "description": "when its result was recorded"},
                    "result": {"type": "string", "enum": ["owed", "running", "done", "failed", "observed",
                                                          "rate_limited", "skipped", "cancelled", "interrupted",
                                                          "undeliverable"]},
                    "detail": {"type": "string"},
                    "rule": {"type": "string"},
                },
            },
            "Directive": {
                "type": "object",
                "required": ["seq", "job", "action", "incident", "reason", "exit_code"],
                "properties": {
                    "seq": {"type": "integer", "description": "pass it back as `after`"},
                    "job": {"type": "string"},
                    "run": {"type": "string", "nullable": True},
                    "action": {"type": "string", "enum": ["abort"]},
                    "incident": {"type": "string"},
                    "reason": {"type": "string", "description": "one line naming the root cause"},
                    "exit_code": {"type": "integer"},
                    "issued_at": {"type": "string"},
                },
            },
            "Host": {
                "type": "object",
                "required": ["host", "suspect", "incidents"],
                "properties": {
                    "host": {"type": "string"},
                    "suspect": {"type": "boolean"},
                    "suspect_until": {"type": "string", "nullable": True},
                    "incidents": {"type": "integer", "description": "warning / critical incidents one of its ranks "
                                  "was the root cause of (consequences not counted)"},
                    "recent_incidents": {"type": "integer"},
                    "by_kind": {"type": "object"},
                    "by_cause": {"type": "object"},
                    "first_seen": {"type": "string", "nullable": True},
                    "last_seen": {"type": "string", "nullable": True},
                    "jobs": {"type": "integer"},
                    "last_incident": {"type": "object", "nullable": True},
                    "actions": {"type": "array", "items": {"type": "object"}},
                },
            },
            "Job": {
                "type": "object",
                "required": ["job", "world_size", "ranks_seen"],
                "properties": {
                    "job": {"type": "string"},
                    "world_size": {"type": "integer"},
                    "ranks_seen": {"type": "integer"},
                    "status_counts": {"type": "object"},
                    "groups": {"type": "array", "items": {"type": "object"}},
                    "ranks": {"type": "array", "items": {"type": "object"}},
                    "agents": {"type": "array", "items": {"type": "object"},
                               "description": "torchrun agents of a multi-node launch (one per node): host, "
                                              "node_rank, nodes_min / nodes_max / nodes_joined, waited_s, done"},
                },
            },
        },
    },
    "security": [{"bearer": []}],
    "paths": {
        "/healthz": {
            "get": {
                "summary": "Liveness; open even with --auth-config",
                "security": [],
                "responses": {
                    "200": {"description": "serving", "content": {"application/json": {"schema": {
                        "type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}}}}},
                    **_errors(400, 500, 503),
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics (text exposition format)",
                "responses": {"200": {"description": "metrics", "content": {"text/plain": {"schema": {
                    "type": "string"}}}}, **_errors(400, *_AUTH_ERRORS)},
            }
        },
        "/api/v1/openapi.json": {
            "get": {"summary": "This description",
                    "responses": {"200": {"description": "OpenAPI 3 document", "content": {
                        "application/json": {"schema": {"type": "object"}}}}, **_errors(400, *_AUTH_ERRORS)}}
        },
        "/api/v1/incidents": {
            "get": {
                "summary": "Incidents, newest first",
                "parameters": [
                    {"name": "limit", "in": "query", "schema": {"type": "integer"},
                     "description": "at most this many (clamped to 1..10000; default 100)"},
                    {"name": "job", "in": "query", "schema": {"type": "string"},
                     "description": "only this job (and its other runs, JOB#RUN)"},
                    {"name": "status", "in": "query", "schema": {"type": "string", "enum": ["firing", "resolved"]}},
                ],
                "responses": {"200": {"description": "incidents", "content": {"application/json": {"schema": {
                    "type": "array", "items": {"$ref": "#/components/schemas/Incident"}}}}},
                    **_errors(400, *_AUTH_ERRORS)},
            }
        },
        "/api/v1/incidents/{incident_id}": {
            "get": {
                "summary": "One incident",
                "parameters": [{"name": "incident_id", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "the incident", "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/Incident"}}}}, **_errors(400, 404, *_AUTH_ERRORS)},
            }
        },
        "/incidents/{incident_id}": {
            "get": {
                "summary": "The incident page: root cause, evidence, wait-for graph and timeline (static HTML + SVG)",
                "parameters": [{"name": "incident_id", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "the page", "content": {"text/html": {"schema": {
                    "type": "string"}}}}, **_errors(400, 404, *_AUTH_ERRORS)},
            }
        },
        "/incidents/{incident_id}/graph.svg": {
            "get": {
                "summary": "The incident's wait-for graph alone",
                "parameters": [{"name": "incident_id", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "the drawing", "content": {"image/svg+xml": {"schema": {
                    "type": "string"}}}}, **_errors(400, 404, *_AUTH_ERRORS)},
            }
        },
        "/jobs": {
            "get": {
                "summary": "Page: live jobs with their ranks' status, and recent incidents linked",
                "responses": {"200": {"description": "the page", "content": {"text/html": {"schema": {
                    "type": "string"}}}}, **_errors(400, *_AUTH_ERRORS)},
            }
        },
        "/api/v1/directives": {
            "get": {
                "summary": "The next directive for a job's ranks (abort), now or within `wait` s (a long poll)",
                "description": "Answered at once when a directive with seq > after is live for the job (and the run, "
                               "when both name one), else held until one is published or `wait` runs out (204). "
                               "Takes an ingest token of the job as well as a read one.",
                "parameters": [
                    {"name": "job", "in": "query", "required": True, "schema": {"type": "string", "minLength": 1},
                     "description": "the job id the ranks report (mycroft.job.id)"},
                    {"name": "after", "in": "query", "schema": {"type": "integer", "minimum": 0},
                     "description": "the last seq seen (default 0)"},
                    {"name": "wait", "in": "query", "schema": {"type": "number", "minimum": 0},
                     "description": "seconds to hold the request (clamped to 60; default 0)"},
                    {"name": "run", "in": "query", "schema": {"type": "string"},
                     "description": "the poller's run (mycroft.run.id): directives of another run are not served"},
                    {"name": "host", "in": "query", "schema": {"type": "string"},
                     "description": "the polling host (who listens is recorded: an abort nobody polls for is "
                                    "undeliverable)"},
                    {"name": "acked", "in": "query", "schema": {"type": "integer", "minimum": 0},
                     "description": "the seq of a directive this host's poller handed to its ranks: the abort "
                                    "is done once a host acknowledged it"},
                ],
                "responses": {"200": {"description": "a directive", "content": {"application/json": {"schema": {
                    "$ref": "#/components/schemas/Directive"}}}},
                    "204": {"description": "no directive within `wait`"},
                    **_errors(400, *_AUTH_ERRORS)},
            }
        },
        "/api/v1/hosts": {
            "get": {
                "summary": "The fleet memory: every host seen, its root-cause incidents, actions; suspects first",
                "parameters": [{"name": "limit", "in": "query", "schema": {"type": "integer"},
                                "description": "at most this many (clamped to 1..10000; default 100)"}],
                "responses": {"200": {"description": "hosts", "content": {"application/json": {"schema": {
                    "type": "array", "items": {"$ref": "#/components/schemas/Host"}}}}},
                    **_errors(400, *_AUTH_ERRORS)},
            }
        },
        "/api/v1/hosts/suspect": {
            "get": {
                "summary": "The suspect hosts, each with its expiry; format=slurm: one line for srun --exclude=",
                "parameters": [{"name": "format", "in": "query",
                                "schema": {"type": "string", "enum": ["json", "slurm"]}}],
                "responses": {"200": {"description": "suspects", "content": {
                    "application/json": {"schema": {"type": "array", "items": {"$ref": "#/components/schemas/Host"}}},
                    "text/plain": {"schema": {"type": "string"}}}},
                    **_errors(400, *_AUTH_ERRORS)},
            }
        },
        "/hosts": {
            "get": {
                "summary": "Page: the hosts of the fleet, lemon nodes first",
                "responses": {"200": {"description": "the page", "content": {"text/html": {"schema": {
                    "type": "string"}}}}, **_errors(400, *_AUTH_ERRORS)},
            }
        },
        "/api/v1/jobs": {
            "get": {
                "summary": "Live state of every job (of the token's jobs)",
                "responses": {"200": {"description": "jobs", "content": {"application/json": {"schema": {
                    "type": "array", "items": {"$ref": "#/components/schemas/Job"}}}}},
                    **_errors(400, *_AUTH_ERRORS)},
            }
        },
    },
}
