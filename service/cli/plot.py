"""``artsvc plot``: a job's training curves as a PNG file, from the API or (``--local``) straight from the store.

Both ways draw with :func:`service.curves.render_curves`, so the file is the one ``GET /v1/jobs/{id}/curves.png``
serves. ``--local`` is for a job trained with ``artsvc train`` and no server: it reads ``ARTSVC_DATABASE_URL``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from service.settings import Settings, get_settings

from service.cli.app import app, console, fail
from service.cli.local_store import local_job
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
    with local_job(settings, job_id) as (session, job):
        from service.api.job_curves import job_curves  # matplotlib takes half a second: import it once there is a job

        return job_curves(session, job=job)
