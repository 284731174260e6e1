"""``artsvc token``: ``create`` refuses an unmigrated store and prints a secret (last stdout line) that authenticates;
``list`` shows each token's use and never a secret; ``revoke`` ends bearer use, dashboard sessions, the fast GET path
and new logins at once, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from sqlmodel import Session
from typer.testing import CliRunner, Result

from service.api.token_use import TokenUse
from service.auth import authenticate, hash_token
from service.cli import app
from service.settings import get_settings
from service.store import db as store_db
from service.store.tables import Role

from tests.service.api import seeding
from tests.service.api.test_browser_sessions import OWN_PAGE
from tests.service.test_cli import artsvc


def test_an_unmigrated_database_is_refused_with_what_to_run(tmp_path):
    result = artsvc("token", "create", "--role", "client", tmp_path=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert "run `artsvc db upgrade`" in " ".join(result.stderr.split()) and "Traceback" not in result.stderr


def test_the_printed_token_authenticates_with_its_role(tmp_path):
    url = f"sqlite:///{tmp_path / 'data' / 'artsvc.db'}"
    store_db.upgrade(url)
    secrets = {}
    for role in Role:
        result = artsvc("token", "create", "--role", role.value, "--name", f"{role.value} test", tmp_path=tmp_path)
        assert result.returncode == 0, result.stderr
        secrets[role] = result.stdout.splitlines()[-1]
    engine = store_db.make_engine(url)
    with Session(engine) as session:
        for role, secret in secrets.items():
            assert authenticate(session.connection(), token=secret).role is role
        assert authenticate(session.connection(), token=secrets[Role.client] + "x") is None
    engine.dispose()


@pytest.fixture
def token_cli(database_url, monkeypatch) -> Callable[..., Result]:
    """``artsvc token ARGS`` run in this process (the real typer app) on the test's database, SQLite or PostgreSQL."""
    monkeypatch.setenv("ARTSVC_DATABASE_URL", database_url)
    get_settings.cache_clear()

    def run(*args: str) -> Result:
        return CliRunner().invoke(app, ["token", *args])

    yield run
    get_settings.cache_clear()


def test_list_shows_every_token_with_its_use_and_never_a_secret(token_cli, app, client, engine):
    app.state.token_use = TokenUse(engine, flush_after_s=0)  # written at once, not a minute later
    used, headers = seeding.principal(engine, name="ci runner")
    idle, _ = seeding.principal(engine, Role.operator, name="on call")
    job_id = seeding.new_job(engine, owner_id=used)
    assert client.get(f"/v1/jobs/{job_id}", headers=headers).status_code == 200  # the fast GET path notes the use
    result = wait_for(lambda: token_cli("list", "--json"), lambda r: '"last_used_at":null' not in r.stdout.split("\n")[0])
    listed = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(t["id"], t["name"], t["role"], t["revoked_at"]) for t in listed] == [
        (used, "ci runner", "client", None), (idle, "on call", "operator", None)]  # fmt: skip
    assert listed[0]["last_used_at"] is not None and listed[1]["last_used_at"] is None
    assert set(listed[0]) == {"id", "name", "role", "created_at", "last_used_at", "revoked_at"}
    secret = headers["Authorization"].removeprefix("Bearer ")
    table = token_cli("list")
    assert table.exit_code == 0 and idle in table.stderr and "never" in table.stderr  # the id whole, to revoke
    assert secret not in table.output + result.output and hash_token(secret) not in table.output + result.output


def test_a_revoked_token_is_refused_by_bearer_cookie_fast_get_and_login(token_cli, client, engine):
    token_id, headers = seeding.principal(engine)
    secret = headers["Authorization"].removeprefix("Bearer ")
    job_id = seeding.new_job(engine, owner_id=token_id)
    assert client.post("/ui/login", data={"token": secret}, headers=OWN_PAGE, follow_redirects=False).status_code == 303
    assert client.get("/v1/jobs").status_code == 200  # the session cookie
    assert client.get(f"/v1/jobs/{job_id}", headers=headers).status_code == 200

    result = token_cli("revoke", token_id)
    assert result.exit_code == 0 and f"client token {token_id} (test) revoked" in result.stderr
    assert client.get("/v1/jobs").status_code == 401
    assert client.get("/v1/jobs", headers=headers).status_code == 401
    assert client.get(f"/v1/jobs/{job_id}", headers=headers).status_code == 401
    client.cookies.clear()
    assert client.post("/ui/login", data={"token": secret}, headers=OWN_PAGE, follow_redirects=False).status_code != 303

    again = token_cli("revoke", token_id)
    assert again.exit_code == 0 and "was already revoked at" in again.stderr and "nothing changed" in again.stderr
    unknown = token_cli("revoke", "no-such-token")
    assert unknown.exit_code == 2 and "no token 'no-such-token'" in unknown.stderr


def wait_for(run: Callable[[], Result], done: Callable[[Result], bool], timeout_s: float = 5.0) -> Result:
    """``run()`` until ``done`` says its result is the one awaited (the API writes a token's use on a thread)."""
    deadline = time.monotonic() + timeout_s
    while not done(result := run()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert result.exit_code == 0, result.output
    return result
