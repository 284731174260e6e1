"""``GET /v1/jobs/{id}/curves.png``: the job's PNG for whoever may see the job, 404 for others, 401 without a token."""

from __future__ import annotations

from sqlmodel import Session

from service.api.job_curves import job_curves
from service.store import runs
from tests.databases import sqlite_only
from tests.service.api import seeding

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def seeded_job(engine) -> tuple[str, dict[str, str]]:
    """A job with steps 1-4, validation at 0, 2 and 4, and two alerts; and its owner's headers."""
    owner, headers = seeding.principal(engine, name="owner")
    job_id = seeding.new_job(engine, owner_id=owner)
    seeding.start(engine, job_id)
    for step in range(5):
        seeding.record(engine, job_id, step, reward=step / 5, accuracy=step / 8 if step % 2 == 0 else None)
    seeding.alert(engine, job_id, kind="kl_spike", step=2)
    seeding.alert(engine, job_id, kind="plateau", step=4)
    return job_id, headers


@sqlite_only
def test_the_owner_gets_the_png_of_the_stored_numbers_uncached(client, engine):
    job_id, headers = seeded_job(engine)
    response = client.get(f"/v1/jobs/{job_id}/curves.png", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/png"
    assert response.headers["cache-control"] == "no-store"
    assert response.content.startswith(PNG_SIGNATURE)
    with Session(engine) as session:
        assert response.content == job_curves(session, job=runs.get_job(session, job_id=job_id))


@sqlite_only
def test_a_job_without_steps_still_has_curves(client, engine):
    owner, headers = seeding.principal(engine)
    job_id = seeding.new_job(engine, owner_id=owner)
    response = client.get(f"/v1/jobs/{job_id}/curves.png", headers=headers)
    assert response.status_code == 200 and response.content.startswith(PNG_SIGNATURE)


@sqlite_only
def test_another_clients_job_is_not_found_and_a_missing_token_is_refused(client, engine):
    job_id, _ = seeded_job(engine)
    _, stranger = seeding.principal(engine, name="stranger")
    response = client.get(f"/v1/jobs/{job_id}/curves.png", headers=stranger)
    assert response.status_code == 404 and "no job" in response.json()["detail"]
    response = client.get(f"/v1/jobs/{job_id}/curves.png")
    assert response.status_code == 401 and response.headers["content-type"] == "application/json"
