"""Schemathesis over the whole OpenAPI schema: no input makes a server error, every response matches the schema.

It runs against the real app on a migrated SQLite store, as an operator, without an in-process worker:
first each operation alone, then workflows that follow links (submit a job, then read, cancel, list it).
"""

from __future__ import annotations

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance
from sqlmodel import Session, delete, update

from service.app import create_app
from service.auth import create_token
from service.settings import Settings
from service.spec import JobSpec
from service.store import runs
from service.store.tables import (
    Alert, ClientModel, ExampleResult, Job, JobEvent, Role, SampledTrajectory, TrainingStep, ValidationPoint,
)  # fmt: skip

# positive_data_acceptance is left out: values the schema can only call strings (an installed
# environment, an opaque cursor) are rightly refused when they name nothing.
EXCLUDED = [positive_data_acceptance]
# schemathesis's list of statuses that reject invalid data, plus 413: a string past its maxLength can make
# the whole body larger than the API accepts, and that refusal is as right as a 422.
REJECTIONS = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]
QUICK = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture
def api_schema(store, sqlite_url, tmp_path):
    """The app's schema, with an operator token for its bearer scheme and one job to find."""
    app = create_app(Settings(_env_file=None, database_url=sqlite_url, data_dir=tmp_path / "data"), engine=store)
    with Session(store) as session:
        _, secret = create_token(session, role=Role.operator, name="schemathesis")
        session.commit()
    with TestClient(app) as client:
        headers = {"Authorization": f"Bearer {secret}"}
        assert client.post("/v1/jobs", json={"environment": "math"}, headers=headers).status_code == 201
    config = schemathesis.Config.from_dict(
        {
            "auth": {"openapi": {"HTTPBearer": {"bearer": secret}}},
            "checks": {"negative_data_rejection": {"expected-statuses": REJECTIONS}},
        }
    )
    return schemathesis.openapi.from_asgi("/openapi.json", app, config=config)


@pytest.fixture(autouse=True)
def _node_id_for_schemathesis(request):
    """schemathesis 4.32's lazy schemas read ``node._nodeid``, which pytest 9 no longer has."""
    request.node._nodeid = request.node.nodeid


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@QUICK
def test_no_request_makes_a_server_error_and_responses_match_the_schema(case):
    case.call_and_validate(excluded_checks=EXCLUDED)


def reset_jobs(engine) -> None:
    """Every job-related row gone and one queued math job: the state each workflow example starts from."""
    with Session(engine) as session:
        for table in (ExampleResult, JobEvent, SampledTrajectory, Alert, ValidationPoint, TrainingStep, ClientModel):
            session.exec(delete(table))
        session.exec(update(Job).values(parent_id=None))
        session.exec(delete(Job))
        runs.create_job(session, spec=JobSpec(environment="math"))
        session.commit()


def test_workflows_make_no_server_error_and_responses_match_the_schema(api_schema, store):
    class Workflow(api_schema.as_state_machine()):
        def setup(self):
            reset_jobs(store)  # each example starts from the same store, so hypothesis can replay it

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            case.validate_response(response, excluded_checks=EXCLUDED, transport_kwargs=kwargs)

    Workflow.run(settings=settings(QUICK, max_examples=20, stateful_step_count=6))
