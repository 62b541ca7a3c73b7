"""Property-based run of the HTTP API against its own OpenAPI description (schemathesis):
generated and schema-violating requests, each answer checked for status, content type and
schema conformance, auth enforced (missing / invalid tokens must be refused)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from mycroft.rca_service.incidents.action_policy import parse_policy
from mycroft.rca_service.service import RcaService, ServiceOptions
from mycroft.rca_service.web.openapi import OPENAPI

from mycroft.auth import Authenticator
from mycroft.faults.made_up_job import StepJob

from .helpers import get_json, wait_until

schema = schemathesis.openapi.from_dict(OPENAPI)
TOKEN = "fuzz-admin-token"
AUTH = Authenticator.from_mapping({"tokens": [{"token": TOKEN, "role": "admin"}]})


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = Path(tmp_path_factory.mktemp("fuzz")) / "rca.db"
    service = RcaService(ServiceOptions(otlp_grpc=None, otlp_http=None, http="127.0.0.1:0", db=str(db),
                                        tick_s=0.05, auth=AUTH, directive_max_wait_s=0.2,
                                        actions=parse_policy({"rules": [{"kinds": ["hang"],
                                                                         "do": ["abort_job", "drain_node"]}]}))).start()
    job = StepJob("fuzz-job", 4, t0=time.time() - 5.0)  # one live job and one incident to describe
    service.ingest.sink(job.steps(20) + job.heartbeats(time.time(), not_entered=[2]))
    base = f"http://127.0.0.1:{service.api.port}"
    assert wait_until(lambda: bool(service.store.list_incidents(1)), 10)
    try:
        yield base
    finally:
        service.stop()


@schema.parametrize()
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_openapi_description(case: schemathesis.Case, api: str) -> None:
    case.call_and_validate(base_url=api, headers={"Authorization": f"Bearer {TOKEN}"})


def test_the_description_is_served(api: str) -> None:
    import urllib.request

    request = urllib.request.Request(f"{api}/api/v1/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        import json

        assert json.loads(response.read())["paths"].keys() == OPENAPI["paths"].keys()
    assert get_json(f"{api}/healthz")["status"] == "ok"
