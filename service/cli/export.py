"""``artsvc export``: a trained checkpoint out of the service, through the HTTP API or (``--local``, for a job
trained with ``artsvc train`` and no server) straight from the data directory and store. Both ways write the archive
the API serves (service/checkpoints.py): no optimizer state, the base named portably, never the server's path.

What it writes into DIR::

    DIR/adapter/   the checkpoint's PEFT adapter (adapter_config.json, adapter_model.safetensors) and tokenizer
    DIR/merged/    with --merge: the base model with the adapter merged in, a plain Hugging Face model directory

A DIR that is not empty is refused unless ``--force``, which replaces ``adapter/`` and ``merged/`` and leaves anything
else in DIR alone. The last line of stdout is DIR.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn

from service import checkpoints
from service.adapters import ExportError, base_model_dir, merge, unpack
from service.api_client import ApiError
from service.settings import get_settings
from service.store import runs

from service.cli.app import app, console, fail
from service.cli.local_store import local_job
from service.cli.remote import ApiUrlOption, TokenOption, api_client

STEP = re.compile(r"^(best|latest|[0-9]{1,10})$")


@app.command("export")
def export(
    job_id: Annotated[str, typer.Argument(metavar="JOB_ID", help="The job's id.")],
    output: Annotated[
        Path, typer.Option("--output", "-o", metavar="DIR", help="Where to write: DIR/adapter, and DIR/merged.")
    ],
    step: Annotated[str, typer.Option(help="best (the best validation step), latest, or a step number.")] = "best",
    merge_base: Annotated[
        bool, typer.Option("--merge", help="Also merge the adapter into its base: a plain HF model in DIR/merged.")
    ] = False,
    base_model: Annotated[
        Optional[Path],
        typer.Option(help="The base model's Hugging Face directory here (default: the directory the adapter names, "
                          "relative to here; with --local, the one the job trained on)."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Write into a DIR that is not empty (replaces its adapter/ and merged/).")
    ] = False,
    local: Annotated[
        bool, typer.Option("--local", help="Read the job from ARTSVC_DATA_DIR and its store, not the API (no server).")
    ] = False,
    api_url: ApiUrlOption = None,
    token: TokenOption = None,
) -> None:
    """Download a job's checkpoint as a PEFT adapter into DIR/adapter (with --local, read it from the data directory
    instead); with --merge also write the merged model, which AutoModelForCausalLM.from_pretrained (and vLLM) load,
    to DIR/merged. Prints DIR."""
    if not STEP.match(step):
        raise fail(f"--step must be best, latest or a step number, not {step!r}")
    if base_model is not None and not merge_base:
        raise fail("--base-model is for --merge")
    adapter, merged = output / "adapter", output / "merged"
    created = not output.exists()
    try:
        if merge_base and base_model is not None:
            base_model_dir(adapter, base_model)  # a wrong path fails before the download
        _refuse_to_overwrite(output, force=force)
        with tempfile.TemporaryDirectory(dir=output, prefix=".export-") as scratch:
            archive = Path(scratch) / "adapter.tar.gz"
            if local:
                served, trained_on = _from_store(job_id, step, archive)
                base_model = base_model or trained_on
            else:
                served = _download(job_id, step, archive, api_url=api_url, token=token)
            _remove(adapter, merged)  # only once the new adapter is here: a failed download keeps the old export
            unpack(archive, adapter)
        said = f"wrote the adapter of job {escape(job_id)} step {served} to {escape(str(adapter))}"
        console.print(said, soft_wrap=True, highlight=False)
        if merge_base:
            base = base_model_dir(adapter, base_model)
            with console.status(f"merging the adapter into {escape(str(base))}"):
                merge(adapter, base, merged)
            console.print(f"wrote the merged model to {escape(str(merged))}", soft_wrap=True, highlight=False)
    except ExportError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"cannot write to {output}: {exc.strerror or exc}") from None
    finally:
        if created:
            with contextlib.suppress(OSError):
                output.rmdir()  # only if the export left it empty
    typer.echo(str(output))


def _refuse_to_overwrite(output: Path, *, force: bool) -> None:
    if output.exists() and not output.is_dir():
        raise ExportError(f"{output} exists and is not a directory")
    if output.is_dir() and any(output.iterdir()) and not force:
        raise ExportError(f"{output} is not empty: choose another -o, or --force to replace its adapter/ and merged/")
    output.mkdir(parents=True, exist_ok=True)


def _remove(*paths: Path) -> None:
    for path in paths:
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)


def _from_store(job_id: str, step: str, archive: Path) -> tuple[int, Path | None]:
    """The adapter archive written into ``archive`` from the data directory; returns its step and the base model
    directory the job trained on here (what --merge defaults to)."""
    settings = get_settings()
    wanted: int | str = step if step in ("best", "latest") else int(step)
    with local_job(settings, job_id) as (session, job):
        best = checkpoints.best_step(job, runs.validation_points(session, job_id=job.id))
        try:
            found = checkpoints.open_adapter_archive(job, data_dir=settings.data_dir, step=wanted, best=best)
        except checkpoints.NoCheckpoint as exc:
            raise ExportError(f"job {job.id} {exc}") from None
        except checkpoints.NotExportable as exc:
            raise ExportError(f"job {job.id} ({checkpoints.job_backend(job)} backend): {exc}") from None
    with archive.open("wb") as sink:
        for chunk in found.chunks():
            sink.write(chunk)
    return found.step, checkpoints.trained_base(found.checkpoint)


def _download(job_id: str, step: str, archive: Path, *, api_url: str | None, token: str | None) -> int | None:
    """The adapter archive streamed into ``archive`` with a progress bar; returns the step the API served."""
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeElapsedColumn(), console=console,
    )  # fmt: skip
    with api_client(api_url, token) as client, progress, archive.open("wb") as sink:
        task = progress.add_task(f"job {escape(job_id[:8])} step {step}", total=None)
        try:
            return client.download_adapter(job_id, step, sink, on_bytes=lambda n: progress.advance(task, n))
        except ApiError as exc:
            unreachable = exc.status is None
            raise ExportError(f"{exc}; a job trained here with `artsvc train` exports with --local" if unreachable
                              else str(exc)) from None  # fmt: skip
