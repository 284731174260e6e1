"""``artsvc plot``: a job's training curves as a PNG file, from the API or (``--local``) straight from the store.

Both ways draw with :func:`service.curves.render_curves`, so the file is the one ``GET /v1/jobs/{id}/curves.png``
serves. ``--local`` is for a job trained with ``artsvc train`` and no server: it reads ``ARTSVC_DATABASE_URL``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from sqlalchemy.engine import make_url
from sqlmodel import Session

from service.settings import Settings, get_settings
from service.store import db as store_db
from service.store import runs

from service.cli.app import app, console, fail
from service.cli.remote import ApiUrlOption, TokenOption, api_client


@app.command()
def plot(
    job_id: Annotated[str, typer.Argument(metavar="JOB_ID", help="The job's id.")],
    output: Annotated[
        Optional[Path], typer.Option("--output", "-o", help="Where to write the PNG (default: curves-<JOBID8>.png).")
    ] = None,
    local: Annotated[
        bool, typer.Option("--local", help="Read the job from ARTSVC_DATABASE_URL, not the API (no server needed).")
    ] = False,
    api_url: ApiUrlOption = None,
    token: TokenOption = None,
) -> None:
    """Write a job's training curves (reward, validation accuracy, KL, entropy, length, alerts) to a PNG;
    prints the file's path."""
    settings = get_settings()
    png = _from_store(settings, job_id) if local else _from_api(job_id, api_url=api_url, token=token)
    path = output or Path(f"curves-{job_id[:8]}.png")
    try:
        path.write_bytes(png)
    except OSError as exc:
        raise fail(f"cannot write {path}: {exc.strerror or exc}") from None
    console.print(f"wrote the curves of job {job_id} to {path}", soft_wrap=True, highlight=False)
    typer.echo(str(path))


def _from_api(job_id: str, *, api_url: str | None, token: str | None) -> bytes:
    with api_client(api_url, token) as client:
        return client.curves_png(job_id)


def _from_store(settings: Settings, job_id: str) -> bytes:
    """Render from the configured store without migrating it or creating a missing SQLite file."""
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
            from service.api.job_curves import job_curves  # matplotlib takes half a second: import it once there is a job

            return job_curves(session, job=job)
    finally:
        engine.dispose()

