"""Data functions behind the jobs API: listing with keyset pagination, idempotent submission, cancel.

Like every store function they take a session and keyword arguments and never commit.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import uuid
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Connection, Row
from sqlmodel import Session, and_, col, or_, select

from service.spec import JobSpec
from service.store import runs
from service.store.events import append_event
from service.store.tables import ClientModel, Job, JobKind, JobStatus, SampledTrajectory, StopReason

ENDED = (JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled)


class JobEnded(Exception):
    """The job already ended; there is nothing to cancel."""


class BadCursor(ValueError):
    """A pagination cursor this module did not make."""


class IdempotencyConflict(Exception):
    """An earlier submission used the same idempotency key with a different spec."""


def request_hash(spec: JobSpec) -> str:
    """sha256 of the spec's canonical JSON: equal for requests that ask for the same job."""
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def earlier_submission(session: Session, *, owner_id: str, idempotency_key: str, request_hash: str) -> Job | None:
    """The job an earlier request with this key made, or None; IdempotencyConflict if it asked for another spec."""
    query = select(Job).where(Job.owner_id == owner_id, Job.idempotency_key == idempotency_key)
    job = session.exec(query).first()
    if job is not None and job.request_hash != request_hash:
        raise IdempotencyConflict(f"idempotency key {idempotency_key!r} was already used with a different job spec")
    return job


def encode_cursor(job: Job | Row[Any]) -> str:
    raw = json.dumps([job.created_at.isoformat(), job.id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The (created_at, id) a cursor points after; BadCursor for anything this module did not make."""
    try:
        raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True)
        value = json.loads(raw)  # JSON and UTF-8 errors are ValueErrors
        if not (isinstance(value, list) and len(value) == 2 and all(isinstance(part, str) for part in value)):
            raise ValueError("not a [created_at, id] pair")
        moment = datetime.fromisoformat(value[0])
        if moment.tzinfo is None:
            raise ValueError("timestamp without a time zone")
        return moment.astimezone(timezone.utc), str(uuid.UUID(value[1]))
    except (ValueError, OverflowError, binascii.Error):
        raise BadCursor(f"malformed cursor {cursor[:64]!r}: pass back a next_cursor from this endpoint") from None


def list_jobs(
    connection: Connection,
    *,
    owner_id: str | None,
    status: JobStatus | None,
    limit: int,
    cursor: str | None,
    kind: JobKind = JobKind.training,
) -> tuple[list[Row[Any]], str | None]:
    """A page of jobs as Core rows (read-only, and no session's cost: the API lists on its event loop), newest
    first by (created_at, id), and the cursor of the next page (None at the end).

    ``owner_id=None`` lists every owner's jobs (operators). A malformed cursor raises BadCursor.
    """
    query = select(*runs.SHOWN_COLUMNS).where(Job.kind == kind)
    if owner_id is not None:
        query = query.where(Job.owner_id == owner_id)
    if status is not None:
        query = query.where(Job.status == status)
    if cursor is not None:
        created_at, job_id = decode_cursor(cursor)
        query = query.where(
            or_(col(Job.created_at) < created_at, and_(col(Job.created_at) == created_at, col(Job.id) < job_id))
        )
    rows = list(connection.execute(query.order_by(col(Job.created_at).desc(), col(Job.id).desc()).limit(limit + 1)))
    page = rows[:limit]
    return page, (encode_cursor(page[-1]) if len(rows) > limit else None)


def request_cancel(session: Session, *, job: Job, requested_by: str) -> Job:
    """Cancel ``job``: a queued one ends now (cancelled; a batch of ART's client with the ``training_failed`` event its
    client waits for), and so does a model's series that ART's client trains (no process runs it: its model takes no
    more training jobs); a running one is flagged and stops at its next step boundary. Raises JobEnded if it already
    ended. Asking twice for a running job changes nothing."""
    session.refresh(job, with_for_update=True)  # a worker claiming it meanwhile wins or waits
    if job.status in ENDED:
        raise JobEnded(f"job {job.id} already ended ({job.status.value})")
    series = session.exec(select(ClientModel.id).where(col(ClientModel.job_id) == job.id)).first() is not None
    if job.status is JobStatus.queued or series:
        job.cancel_requested = True
        if job.kind == JobKind.client_batch:
            data = {"error_message": "the training job was cancelled"}
            append_event(session, job_id=job.id, kind="training_failed", data=data)
        runs.finish_job(
            session, job=job, status=JobStatus.cancelled, stop_reason=StopReason.cancelled,
            best_step=job.best_step, best_val_accuracy=job.best_val_accuracy,
            step0_val_accuracy=job.step0_val_accuracy,
        )  # fmt: skip
    elif not job.cancel_requested:
        job.cancel_requested = True
        session.add(job)
        append_event(session, job_id=job.id, kind="cancel_requested", step=job.step, data={"by": requested_by})
    return job


def trajectories(
    session: Session, *, job_id: str, step: int | None, split: str | None, limit: int
) -> list[SampledTrajectory]:
    """Sampled rollouts of a job, newest step first, optionally of one step and one split."""
    query = select(SampledTrajectory).where(SampledTrajectory.job_id == job_id)
    if step is not None:
        query = query.where(SampledTrajectory.step == step)
    if split is not None:
        query = query.where(SampledTrajectory.split == split)
    order = (col(SampledTrajectory.step).desc(), col(SampledTrajectory.id))
    return list(session.exec(query.order_by(*order).limit(limit)))
