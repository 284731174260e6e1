"""The runner of each job kind, imported when a worker first takes a job.

The runners import torch, transformers and ART: 11-12 s of a slow 2-core machine's CPU and 400 MiB of memory. A worker
imports them with its first job instead of at start, so it polls the queue 1.5 s after it starts (14 s before), and
one that never gets a job (the second worker of a quiet ``serve``) holds 85 MiB (490 before).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from service.runner.control import JobInterrupted
from service.runner.finish import Runner
from service.store.tables import JobKind

STOP_CHECK_S = 0.5  # how often a job waiting for the import asks whether it should stop


@functools.cache
def runners() -> dict[JobKind, Runner]:
    """``run_job``, ``run_evaluation`` and ``run_client_batch`` by the kind of job they run (one signature:
    service/runner/finish.py)."""
    from service.art_client.runner import run_client_batch
    from service.evaluation.runner import run_evaluation
    from service.training.loop import run_job

    return {JobKind.training: run_job, JobKind.evaluation: run_evaluation, JobKind.client_batch: run_client_batch}


async def runner_for(kind: JobKind, *, should_stop: Callable[[], bool]) -> Runner:
    """The runner of ``kind``, imported on a thread so that the event loop goes on (leases, signals, the queue);
    ``JobInterrupted`` if the job should stop first: a worker told to stop hands its job back at once, not after
    the import."""
    if runners.cache_info().currsize:
        return runners()[kind]
    loading = asyncio.ensure_future(asyncio.to_thread(runners))
    while not loading.done():
        await asyncio.wait({loading}, timeout=STOP_CHECK_S)
        if not loading.done() and should_stop():
            raise JobInterrupted("stopped while its runner was imported")
    return loading.result()[kind]


async def close_client_models() -> None:
    """Unload the model an ART client's batches kept loaded for their next batch, if a batch ever ran here."""
    if runners.cache_info().currsize:
        from service.art_client.runner import WARM

        await WARM.close()
