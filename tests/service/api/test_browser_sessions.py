"""The dashboard's login on SQLite and PostgreSQL: the cookie holds a session secret of its own, never the API token,
and the session ends when it expires, when the browser logs out, or when its token is revoked."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from service.app import create_app
from service.auth import SESSIONS_PER_TOKEN
from service.store.tables import ApiToken, BrowserSession, utcnow
from tests.databases import sqlite_only
from tests.service.api import seeding

OWN_PAGE = {"Origin": "http://testserver"}  # what a browser sends from the TestClient's pages


def log_in(client: TestClient, token: str):
    response = client.post("/ui/login", data={"token": token}, headers=OWN_PAGE, follow_redirects=False)
    assert response.status_code == 303, response.text
    return response


@pytest.fixture
def owner(engine) -> tuple[str, str]:
    """A client token: its id and its secret."""
    token_id, headers = seeding.principal(engine, name="owner")
    return token_id, headers["Authorization"].removeprefix("Bearer ")


def stored(engine) -> list[BrowserSession]:
    with Session(engine) as session:
        return list(session.exec(select(BrowserSession)).all())


def test_the_cookie_is_a_session_secret_not_the_token(client, engine, settings, owner):
    token_id, token = owner
    cookie = log_in(client, token).headers["set-cookie"]
    secret = client.cookies["artsvc_session"]
    assert token not in cookie and secret != token and "artsvc_token" not in cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and f"Max-Age={settings.session_ttl_s}" in cookie
    assert "Secure" not in cookie  # plain http, cookie_secure unset
    [row] = stored(engine)  # only the secret's sha256 is kept, tied to the token
    assert row.secret_hash == hashlib.sha256(secret.encode()).hexdigest() and row.token_id == token_id
    assert row.expires_at - row.created_at == timedelta(seconds=settings.session_ttl_s) and row.revoked_at is None
    assert client.get("/v1/jobs").status_code == 200
    client.cookies.clear()
    client.cookies.set("artsvc_session", token)  # the token itself is no cookie
    assert client.get("/v1/jobs").status_code == 401


def test_an_expired_session_is_refused(client, engine, owner):
    log_in(client, owner[1])
    assert client.get("/v1/jobs").status_code == 200
    with Session(engine) as session:
        row = session.exec(select(BrowserSession)).one()
        row.expires_at = utcnow() - timedelta(seconds=1)
        session.add(row)
        session.commit()
    response = client.get("/v1/jobs")
    assert response.status_code == 401 and "log in again at /ui/login" in response.json()["detail"]
    assert client.get("/ui", follow_redirects=False).status_code == 303  # the pages send it to the login form
    log_in(client, owner[1])  # a new login clears the expired session away
    assert len(stored(engine)) == 1 and client.get("/v1/jobs").status_code == 200


def test_logout_ends_the_session_on_the_server(client, engine, owner):
    log_in(client, owner[1])
    kept = client.cookies["artsvc_session"]
    logout = client.post("/ui/logout", headers=OWN_PAGE, follow_redirects=False)
    assert logout.status_code == 303 and logout.headers["location"] == "/ui/login"
    assert 'artsvc_session=""' in logout.headers["set-cookie"] and "Max-Age=0" in logout.headers["set-cookie"]
    assert stored(engine)[0].revoked_at is not None
    client.cookies.clear()
    client.cookies.set("artsvc_session", kept)  # a browser (or a thief) that kept the old value
    assert client.get("/v1/jobs").status_code == 401
    assert client.get("/ui", follow_redirects=False).status_code == 303


def test_revoking_the_token_ends_its_sessions(client, engine, owner):
    log_in(client, owner[1])
    assert client.get("/v1/jobs").status_code == 200
    with Session(engine) as session:
        token = session.get(ApiToken, owner[0])
        token.revoked_at = utcnow()
        session.add(token)
        session.commit()
    assert client.get("/v1/jobs").status_code == 401


@sqlite_only
def test_a_logout_posted_from_another_site_keeps_the_session(client, engine, owner):
    log_in(client, owner[1])
    for headers in ({"Origin": "http://testserver:8001"}, {}):
        assert client.post("/ui/logout", headers=headers, follow_redirects=False).status_code == 403
    assert stored(engine)[0].revoked_at is None and client.get("/v1/jobs").status_code == 200


@sqlite_only
def test_the_cookie_is_secure_when_configured_or_on_https(engine, settings, owner):
    with TestClient(create_app(settings.model_copy(update={"cookie_secure": True}), engine=engine)) as client:
        assert "; Secure" in log_in(client, owner[1]).headers["set-cookie"]
        logout = client.post("/ui/logout", headers=OWN_PAGE, follow_redirects=False)
        assert "; Secure" in logout.headers["set-cookie"]
    with TestClient(create_app(settings, engine=engine), base_url="https://testserver") as client:
        response = client.post("/ui/login", data={"token": owner[1]}, headers={"Origin": "https://testserver"},
                               follow_redirects=False)  # fmt: skip
        assert response.status_code == 303 and "; Secure" in response.headers["set-cookie"]


@sqlite_only
def test_the_session_lasts_as_long_as_configured(engine, settings, owner):
    with TestClient(create_app(settings.model_copy(update={"session_ttl_s": 600}), engine=engine)) as client:
        assert "Max-Age=600" in log_in(client, owner[1]).headers["set-cookie"]
    [row] = stored(engine)
    assert row.expires_at - row.created_at == timedelta(seconds=600)


def test_logging_in_again_and_again_keeps_only_the_newest_sessions(client, engine, owner):
    cookies = []
    for _ in range(SESSIONS_PER_TOKEN + 4):
        log_in(client, owner[1])
        cookies.append(client.cookies["artsvc_session"])
        client.cookies.clear()
    assert len(stored(engine)) == SESSIONS_PER_TOKEN
    for cookie, expected in ((cookies[0], 401), (cookies[3], 401), (cookies[4], 200), (cookies[-1], 200)):
        client.cookies.set("artsvc_session", cookie)
        assert client.get("/v1/jobs").status_code == expected
        client.cookies.clear()
