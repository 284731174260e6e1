"""Cross-site request forgery against a real server on loopback: the dashboard's session cookie authorizes a change
only when the request comes from this server's own pages. SameSite=Strict does not stop a page on another port of
the same host, or on a sibling subdomain, from posting a form with the cookie; the Origin check does."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest
from sqlmodel import Session

from service.app import create_app
from service.spec import EvaluationSpec
from service.store import runs
from service.store.tables import LOCAL_OWNER, Alert, AlertState, Job, JobStatus, Role
from tests.databases import sqlite_only
from tests.service.api import seeding
from tests.service.conftest import serve

pytestmark = sqlite_only  # plain HTTP behaviour: the session store itself is tested on both in test_browser_sessions.py


class Target:
    """The three changes an attacker would forge, each on a fresh row, and whether it happened."""

    def __init__(self, engine, owner_id: str) -> None:
        self.engine, self.owner_id = engine, owner_id

    def cancel_job(self) -> tuple[str, Callable[[], bool]]:
        job_id = seeding.new_job(self.engine, owner_id=self.owner_id)
        return f"/v1/jobs/{job_id}/cancel", lambda: self._status(job_id) == JobStatus.cancelled

    def cancel_evaluation(self) -> tuple[str, Callable[[], bool]]:
        spec = EvaluationSpec.model_validate({"model": {"litellm": "openai/sloppy"}, "environment": "math"})
        with Session(self.engine) as session:
            job_id = runs.create_evaluation(session, spec=spec, environment="math", owner_id=self.owner_id).id
            session.commit()
        return f"/v1/evaluations/{job_id}/cancel", lambda: self._status(job_id) == JobStatus.cancelled

    def acknowledge_alert(self) -> tuple[str, Callable[[], bool]]:
        job_id = seeding.new_job(self.engine, owner_id=self.owner_id)
        alert_id = seeding.alert(self.engine, job_id, kind="plateau", step=1)

        def acknowledged() -> bool:
            with Session(self.engine) as session:
                return session.get(Alert, alert_id).state == AlertState.acknowledged

        return f"/v1/alerts/{alert_id}/ack", acknowledged

    def _status(self, job_id: str) -> JobStatus:
        with Session(self.engine) as session:
            return session.get(Job, job_id).status


CHANGES = ["cancel_job", "cancel_evaluation", "acknowledge_alert"]


@pytest.fixture
def operator(engine) -> tuple[str, dict[str, str]]:
    return seeding.principal(engine, role=Role.operator, name="operator")


@pytest.fixture
def target(engine, operator) -> Target:
    return Target(engine, operator[0])


@pytest.fixture
def http(live_server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_server, timeout=30) as client:
        yield client


@pytest.fixture
def cookie(http, live_server, operator) -> dict[str, str]:
    """The Cookie header of a dashboard login of the operator, made as a browser makes it (Origin: this server)."""
    token = operator[1]["Authorization"].removeprefix("Bearer ")
    login = http.post("/ui/login", data={"token": token}, headers={"Origin": live_server})
    assert login.status_code == 303, login.text
    http.cookies.clear()  # each request below says exactly what it sends
    return {"Cookie": "; ".join(f"{name}={value}" for name, value in login.cookies.items())}


def other_port(base: str) -> str:
    host, port = base.rsplit(":", 1)
    return f"{host}:{int(port) + 1}"


@pytest.mark.parametrize("change", CHANGES)
def test_a_form_posted_from_another_port_of_the_same_host_changes_nothing(http, live_server, cookie, target, change):
    path, happened = getattr(target, change)()
    form = {"Origin": other_port(live_server), "Content-Type": "application/x-www-form-urlencoded"}
    response = http.post(path, content=b"x=1", headers=cookie | form)
    assert response.status_code == 403 and "cross-site request refused" in response.json()["detail"]
    assert other_port(live_server) in response.json()["detail"] and not happened()


@pytest.mark.parametrize("change", CHANGES)
def test_a_sibling_subdomain_cannot_use_the_cookie_but_the_site_itself_can(http, live_server, cookie, target, change):
    port = live_server.rsplit(":", 1)[1]
    host = {"Host": f"app.example.test:{port}"}  # the service as a browser names it behind DNS
    path, happened = getattr(target, change)()
    sibling = http.post(path, headers=cookie | host | {"Origin": f"http://evil.example.test:{port}"})
    assert sibling.status_code == 403 and not happened()
    same = http.post(path, headers=cookie | host | {"Origin": f"http://app.example.test:{port}"})
    assert same.status_code == 200, same.text
    assert happened()


@pytest.mark.parametrize("change", CHANGES)
def test_the_cookie_works_from_the_servers_own_pages(http, live_server, cookie, target, change):
    path, happened = getattr(target, change)()
    response = http.post(path, headers=cookie | {"Origin": live_server})
    assert response.status_code == 200, response.text
    assert happened()


def test_without_origin_the_referer_decides_and_without_either_the_change_is_refused(http, live_server, cookie, target):
    path, happened = target.cancel_job()
    bare = http.post(path, headers=cookie)
    assert bare.status_code == 403 and "names no Origin or Referer" in bare.json()["detail"] and not happened()
    foreign = http.post(path, headers=cookie | {"Referer": f"{other_port(live_server)}/page"})
    assert foreign.status_code == 403 and not happened()
    null = http.post(path, headers=cookie | {"Origin": "null", "Referer": f"{live_server}/ui"})  # a sandboxed frame
    assert null.status_code == 403 and not happened()
    own = http.post(path, headers=cookie | {"Referer": f"{live_server}/ui/jobs"})
    assert own.status_code == 200 and happened()


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                                          "text/plain;charset=UTF-8"])  # fmt: skip
def test_a_form_body_is_refused_even_from_the_servers_own_origin(http, live_server, cookie, target, content_type):
    path, happened = target.cancel_job()
    response = http.post(path, content=b"", headers=cookie | {"Origin": live_server, "Content-Type": content_type})
    assert response.status_code == 415 and "cannot be a form post" in response.json()["detail"] and not happened()


def test_reads_with_the_cookie_need_no_origin(http, cookie):
    assert http.get("/v1/jobs", headers=cookie).status_code == 200


@pytest.mark.parametrize("change", CHANGES)
def test_a_bearer_token_is_not_subject_to_the_origin_check(http, live_server, operator, target, change):
    path, happened = getattr(target, change)()
    form = {"Origin": other_port(live_server), "Content-Type": "application/x-www-form-urlencoded"}
    response = http.post(path, content=b"x=1", headers=operator[1] | form)
    assert response.status_code == 200, response.text
    assert happened()


@pytest.fixture
def local_http(settings, engine) -> Iterator[tuple[httpx.Client, str]]:
    """A local-mode server (no credentials at all) on loopback, and its base URL."""
    app = create_app(settings.model_copy(update={"local_mode": True}), engine=engine)
    with serve(app) as (base, _), httpx.Client(base_url=base, timeout=30) as client:
        yield client, base


@pytest.mark.parametrize("change", CHANGES)
def test_local_mode_refuses_a_change_another_site_posts_but_not_the_cli(local_http, engine, change):
    http, base = local_http
    target = Target(engine, LOCAL_OWNER)
    path, happened = getattr(target, change)()
    form = {"Origin": other_port(base), "Content-Type": "application/x-www-form-urlencoded"}
    forged = http.post(path, content=b"x=1", headers=form)
    assert forged.status_code == 403 and "cross-site request refused" in forged.json()["detail"] and not happened()
    assert http.post(path).status_code == 200 and happened()  # the CLI and curl name no origin
