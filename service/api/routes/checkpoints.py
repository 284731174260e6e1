"""A job's checkpoints: which steps are on disk with their validation accuracy, and one step's PEFT adapter as a
.tar.gz (service/checkpoints.py reads the disk)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Response
from fastapi.responses import StreamingResponse

from service import checkpoints
from service.api.deps import CallerDep, SessionDep, SettingsDep, visible_job
from service.api.errors import ErrorBody
from service.api.routes.jobs import MAX_STEP
from service.api.schemas import CheckpointList, CheckpointPublic
from service.store import runs

router = APIRouter(prefix="/v1", tags=["jobs"])

StepPath = Annotated[
    str,
    Path(pattern=r"^(best|latest|[0-9]{1,10})$", description="A step number, `best` (the best validation step) or "
                                                             "`latest` (the newest checkpoint)."),
]  # fmt: skip
ARCHIVE = {
    200: {
        "content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}}},
        "description": "The adapter directory (adapter_config.json, adapter_model.safetensors and the tokenizer's "
        "files, no optimizer state) as a tar.gz holding one folder, `<model>-<job id 8>-step<NNNN>/`; the config "
        "names its base by Hugging Face id where the job's base model has one, else by the base directory's name.",
        "headers": {"Checkpoint-Step": {"description": "The step served.", "schema": {"type": "integer"}}},
    },
    404: {"model": ErrorBody, "description": "No such job, or no checkpoint at that step."},
    409: {"model": ErrorBody, "description": "The checkpoint is not a PEFT adapter (an embedded-backend job)."},
}


@router.get("/jobs/{job_id}/checkpoints")
def list_checkpoints(job_id: str, session: SessionDep, caller: CallerDep, settings: SettingsDep) -> CheckpointList:
    """The job's checkpoints on disk, each with the validation accuracy recorded at its step and whether it can be
    downloaded as a PEFT adapter; the best and the latest step; the backend and base model."""
    job = visible_job(session, caller=caller, job_id=job_id)
    points = runs.validation_points(session, job_id=job.id)
    at = {p.step: p for p in points}
    found = checkpoints.find(checkpoints.model_dir(job, settings.data_dir))
    data = [
        CheckpointPublic(step=c.step, format=c.format.value, exportable=c.exportable,
                         accuracy=at[c.step].accuracy if c.step in at else None,
                         greedy_accuracy=at[c.step].greedy_accuracy if c.step in at else None)  # fmt: skip
        for c in found
    ]
    return CheckpointList(
        job_id=job.id, backend=checkpoints.job_backend(job), base_model=checkpoints.job_base_model(job),
        best_step=checkpoints.best_step(job, points), latest_step=found[-1].step if found else None, data=data,
    )  # fmt: skip


@router.get("/jobs/{job_id}/checkpoints/{step}/adapter", response_class=Response, responses=ARCHIVE)
def download_adapter(
    job_id: str, step: StepPath, session: SessionDep, caller: CallerDep, settings: SettingsDep
) -> StreamingResponse:
    """One checkpoint as its PEFT adapter, streamed: load it with `PeftModel.from_pretrained(base, folder)`, or let
    `artsvc export` download it and merge it into the base model."""
    wanted: int | str = step if step in ("best", "latest") else int(step)
    if isinstance(wanted, int) and wanted > MAX_STEP:
        raise HTTPException(422, f"step: at most {MAX_STEP}")
    job = visible_job(session, caller=caller, job_id=job_id)
    best = checkpoints.best_step(job, runs.validation_points(session, job_id=job.id)) if wanted == "best" else None
    try:
        archive = checkpoints.open_adapter_archive(job, data_dir=settings.data_dir, step=wanted, best=best)
    except checkpoints.NoCheckpoint as exc:
        raise HTTPException(404, f"job {job.id} {exc}") from None
    except checkpoints.NotExportable as exc:
        raise HTTPException(409, f"job {job.id} ({checkpoints.job_backend(job)} backend): {exc}") from None
    headers = {"Content-Disposition": f'attachment; filename="{archive.folder}.tar.gz"',
               "Checkpoint-Step": str(archive.step), "Cache-Control": "no-store"}  # fmt: skip
    return StreamingResponse(archive.chunks(), media_type="application/gzip", headers=headers)
