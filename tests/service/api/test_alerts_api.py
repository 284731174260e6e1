"""Alerts on SQLite and PostgreSQL: a job's, the inbox (operators: all; clients: their own jobs'), and acks."""

from __future__ import annotations

import pytest

from service.store.tables import AlertState, Role
from tests.databases import sqlite_only
from tests.service.api import seeding

ALERT_FIELDS = {
    "id", "job_id", "kind", "step", "message", "evidence", "state", "webhook_status", "created_at",
    "acknowledged_at", "acknowledged_by",
}  # fmt: skip


@pytest.fixture
def world(engine):
    """Alice's job with two alerts, Bob's with one, and an operator."""
    alice, alice_headers = seeding.principal(engine, name="alice")
    bob, bob_headers = seeding.principal(engine, name="bob")
    operator, operator_headers = seeding.principal(engine, Role.operator, name="ops")
    alices, bobs = seeding.new_job(engine, owner_id=alice), seeding.new_job(engine, owner_id=bob)
    ids = {
        "divergence": seeding.alert(engine, alices, kind="divergence", step=4),
        "collapse": seeding.alert(engine, bobs, kind="collapse", step=2),
        "plateau": seeding.alert(engine, alices, kind="plateau", step=6, state=AlertState.acknowledged),
    }
    return {
        "alice": alice_headers, "bob": bob_headers, "operator": operator_headers, "operator_id": operator,
        "alices_job": alices, "bobs_job": bobs, "ids": ids,
    }  # fmt: skip


def kinds(response) -> list[str]:
    assert response.status_code == 200, response.text
    return [alert["kind"] for alert in response.json()["data"]]


def test_a_jobs_alerts_newest_first_with_their_evidence(client, world):
    response = client.get(f"/v1/jobs/{world['alices_job']}/alerts", headers=world["alice"])
    assert kinds(response) == ["plateau", "divergence"]
    divergence = response.json()["data"][1]
    assert set(divergence) == ALERT_FIELDS
    assert divergence["evidence"] == {"val": [0.5, 0.4], "reward": [0.2, 0.6]}
    assert divergence["state"] == "open" and divergence["acknowledged_at"] is None and divergence["step"] == 4
    assert response.json()["next_cursor"] is None
    open_only = client.get(f"/v1/jobs/{world['alices_job']}/alerts", params={"state": "open"}, headers=world["alice"])
    assert kinds(open_only) == ["divergence"]
    assert client.get(f"/v1/jobs/{world['alices_job']}/alerts", headers=world["bob"]).status_code == 404
    assert client.get(f"/v1/jobs/{world['alices_job']}/alerts").status_code == 401


def test_operators_see_every_alert_and_clients_their_own_jobs_only(client, world):
    assert kinds(client.get("/v1/alerts", headers=world["operator"])) == ["plateau", "collapse", "divergence"]
    assert kinds(client.get("/v1/alerts", headers=world["alice"])) == ["plateau", "divergence"]
    assert kinds(client.get("/v1/alerts", headers=world["bob"])) == ["collapse"]
    assert kinds(client.get("/v1/alerts?state=open", headers=world["operator"])) == ["collapse", "divergence"]
    assert kinds(client.get("/v1/alerts?state=acknowledged", headers=world["operator"])) == ["plateau"]
    assert kinds(client.get("/v1/alerts?kind=collapse", headers=world["operator"])) == ["collapse"]
    assert kinds(client.get("/v1/alerts?kind=collapse", headers=world["alice"])) == []
    assert client.get("/v1/alerts").status_code == 401


def test_pages_of_alerts_cover_each_once(client, world):
    seen, cursor = [], None
    while True:
        params = {"limit": 1} | ({"cursor": cursor} if cursor else {})
        page = client.get("/v1/alerts", params=params, headers=world["operator"]).json()
        seen += [alert["id"] for alert in page["data"]]
        if (cursor := page["next_cursor"]) is None:
            break
    assert seen == sorted(world["ids"].values(), reverse=True)


@pytest.mark.parametrize(
    ("query", "field"),
    [("state=closed", "state"), ("kind=divergance", "kind"), ("limit=0", "limit"), ("cursor=0", "cursor"),
     ("cursor=99999999999", "cursor"), ("cursor=abc", "cursor")],
)  # fmt: skip
@sqlite_only
def test_bad_filters_are_refused_saying_which(client, world, query, field):
    response = client.get(f"/v1/alerts?{query}", headers=world["operator"])
    assert response.status_code == 422 and f"query.{field}" in response.json()["detail"]


def test_an_operator_acknowledges_an_alert_once(client, world, engine):
    alert_id, url = world["ids"]["divergence"], f"/v1/alerts/{world['ids']['divergence']}/ack"
    acked = client.post(url, headers=world["operator"])
    assert acked.status_code == 200, acked.text
    body = acked.json()
    assert body["state"] == "acknowledged" and body["acknowledged_by"] == world["operator_id"]
    assert body["acknowledged_at"] is not None and body["id"] == alert_id
    assert client.post(url, headers=world["operator"]).json() == body  # again: unchanged
    assert kinds(client.get("/v1/alerts?state=open", headers=world["operator"])) == ["collapse"]
    assert client.get(f"/v1/jobs/{world['alices_job']}/alerts", headers=world["alice"]).json()["data"][1] == body

    log = client.get(f"/v1/jobs/{world['alices_job']}/events", headers=world["alice"]).json()["data"]
    acks = [event for event in log if event["kind"] == "alert_acknowledged"]
    assert len(acks) == 1 and acks[0]["data"] == {"id": alert_id, "kind": "divergence", "alert_step": 4,
                                                   "by": world["operator_id"]}  # fmt: skip


@sqlite_only
def test_only_operators_acknowledge_alerts(client, world):
    url = f"/v1/alerts/{world['ids']['divergence']}/ack"
    assert client.post(url).status_code == 401
    refused = client.post(url, headers=world["alice"])  # even an alert of the client's own job
    assert refused.status_code == 403 and "operator" in refused.json()["detail"]
    assert kinds(client.get("/v1/alerts?state=open", headers=world["operator"])) == ["collapse", "divergence"]


@pytest.mark.parametrize(("alert_id", "status"), [("2147483647", 404), ("0", 422), ("2147483648", 422), ("x", 422)])
@sqlite_only
def test_acknowledging_a_missing_or_malformed_alert_id_is_refused(client, world, alert_id, status):
    assert client.post(f"/v1/alerts/{alert_id}/ack", headers=world["operator"]).status_code == status
