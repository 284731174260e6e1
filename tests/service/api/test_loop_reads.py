"""The event loop's kept connection (service/api/loop_reads.py): each read sees what was committed since the last
(tests/service/api/test_auth.py revokes a token between two reads), and a connection the database drops costs one
request nothing."""

from __future__ import annotations

import pytest
from sqlalchemy import text

postgresql_only = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)


@postgresql_only
def test_a_read_that_finds_its_connection_dropped_runs_again_on_a_fresh_one(client, auth, engine, app):
    headers = auth()
    assert client.get("/v1/jobs", headers=headers).status_code == 200
    with engine.connect() as admin:  # this test's own database: only this app's connections end
        query = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                 " WHERE datname = current_database() AND pid <> pg_backend_pid()")
        assert admin.execute(text(query)).all()
    assert [client.get("/v1/jobs", headers=headers).status_code for _ in range(3)] == [200, 200, 200]
    assert app.state.loop_reads.engine.pool.checkedout() == 1


def test_every_keyed_read_of_a_server_shares_one_connection(client, auth, app):
    headers = auth()
    job_id = client.post("/v1/jobs", json={"environment": "math"}, headers=headers).json()["id"]
    for _ in range(5):
        assert client.get(f"/v1/jobs/{job_id}", headers=headers).status_code == 200
    pool = app.state.loop_reads.engine.pool
    assert pool.checkedout() == 1  # kept between requests, never given back and taken again


def test_a_postgresql_read_is_in_autocommit_and_a_sqlite_one_is_not(client, auth, app, engine):
    """PostgreSQL: no BEGIN and ROLLBACK around each read (one round trip, not three). SQLite's driver begins no
    transaction for a read, and autocommit would only add SQLAlchemy's bookkeeping."""
    assert client.get("/v1/jobs", headers=auth()).status_code == 200
    driver = app.state.loop_reads.run(lambda connection: connection.connection.driver_connection)
    if engine.dialect.name == "postgresql":
        assert driver.autocommit is True
    else:
        assert driver.isolation_level is not None  # pysqlite's default: transactions begin at a write only
