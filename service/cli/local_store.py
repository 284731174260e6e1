"""The store as the ``--local`` verbs read it (``plot``, ``export``): a job trained with ``artsvc train`` and no server,
read from ``ARTSVC_DATABASE_URL`` (default: the SQLite file in ``ARTSVC_DATA_DIR``), which is never migrated or
created here."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlmodel import Session

from service.settings import Settings
from service.store import db as store_db
from service.store import runs
from service.store.tables import Job

from service.cli.app import fail


@contextmanager
def local_job(settings: Settings, job_id: str) -> Iterator[tuple[Session, Job]]:
    """A session on the configured store and the job ``job_id`` in it; exits 2 with what to do when there is no
    store, it is not migrated, or it holds no such job."""
    url = settings.resolved_database_url
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").expanduser().is_file():
        raise fail(f"no store at {parsed.database or url}: run `artsvc train` first, or set ARTSVC_DATABASE_URL")
    try:
        engine = store_db.make_engine(url)
        store_db.check_migrated(engine)
    except store_db.StoreError as exc:
        raise fail(str(exc)) from None
    try:
        with Session(engine) as session:
            job = runs.get_job(session, job_id=job_id) if runs.is_job_id(job_id) else None
            if job is None:
                raise fail(f"no job {job_id!r} in {parsed.render_as_string()}")
            yield session, job
    finally:
        engine.dispose()
