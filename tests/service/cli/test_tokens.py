"""``artsvc token create``: refuses an unmigrated store, prints a secret (last stdout line) that authenticates."""

from __future__ import annotations

from sqlmodel import Session

from service.auth import authenticate
from service.store import db as store_db
from service.store.tables import Role

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
