"""``artsvc serve``: refuses what it must (an unmigrated store, local mode beyond loopback), else serves the API, with
as many worker processes as asked (the workers themselves: tests/service/worker/test_supervisor.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from sqlmodel import Session, select

from service.auth import create_token
from service.store import db as store_db
from service.store.tables import Role, WorkerRecord
from tests.service.processes import children_of
from tests.service.test_cli import artsvc


@pytest.mark.parametrize("api_processes", ["1", "2"])
def test_an_unmigrated_database_is_refused_and_left_alone(api_processes, tmp_path):
    result = artsvc("serve", "--port", "0", "--no-worker", "--api-processes", api_processes, tmp_path=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "run `artsvc db upgrade`" in " ".join(result.stderr.split())
    engine = store_db.make_engine(f"sqlite:///{tmp_path / 'data' / 'artsvc.db'}")
    with pytest.raises(store_db.StoreError, match="schema revision none"):  # serve did not migrate it
        store_db.check_migrated(engine)
    engine.dispose()


def test_local_mode_beyond_loopback_is_refused(tmp_path):
    result = artsvc("serve", "--local", "--host", "0.0.0.0", tmp_path=tmp_path)
    assert result.returncode == 2
    assert "refusing it on non-loopback host '0.0.0.0'" in " ".join(result.stderr.split())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("access_log", [False, True])
def test_it_serves_the_api_where_it_says_without_workers_and_stops_gracefully(access_log, tmp_path):
    url = f"sqlite:///{tmp_path / 'data' / 'artsvc.db'}"
    store_db.upgrade(url)
    engine = store_db.make_engine(url)
    with Session(engine) as session:
        _, token = create_token(session, role=Role.client, name="serve test")
        session.commit()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARTSVC_")}
    env["ARTSVC_DATA_DIR"] = str(tmp_path / "data")
    command = [sys.executable, "-m", "service", "serve", "--port", "0", "--no-worker"]
    command += ["--access-log"] if access_log else []
    server = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        announced = ""
        while "listening on" not in announced:
            announced = server.stderr.readline()
            assert announced, "artsvc serve exited before listening"
        assert "no worker: run `artsvc worker`" in announced
        url = announced.split("listening on ")[1].split()[0]
        assert url.startswith("http://127.0.0.1:")
        headers = {"Authorization": f"Bearer {token}"}
        job = httpx.post(f"{url}/v1/jobs", json={"environment": "math"}, headers=headers, timeout=30)
        assert job.status_code == 201
        # checking a submission builds its environment, which needs neither ART nor torch: the API loads neither
        assert "libtorch" not in Path(f"/proc/{server.pid}/maps").read_text()
        listed = httpx.get(f"{url}/v1/jobs", headers=headers, timeout=30).json()["data"]
        assert [j["id"] for j in listed] == [job.json()["id"]]
        assert httpx.get(f"{url}/v1/jobs", timeout=30).status_code == 401
        health = httpx.get(f"{url}/healthz", timeout=30).json()
        assert (health["status"], health["workers"]["alive"]) == ("degraded", 0)
        assert children_of(server.pid) == set()  # any worker would have been started before the API answered
    finally:
        server.send_signal(signal.SIGTERM)
        printed, rest = server.communicate(timeout=60)
    assert "Application shutdown complete" in rest  # a graceful stop
    assert server.returncode == 0
    with Session(engine) as session:
        assert session.exec(select(WorkerRecord)).all() == []
    engine.dispose()
    assert ('"GET /v1/jobs HTTP/1.1" 200' in printed) is access_log  # one line a request only when asked
