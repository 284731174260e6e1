"""The runner of each job kind, imported when a worker first sees a job it could take.

The runners import torch, transformers and ART: 11-12 s of a slow 2-core machine's CPU and 400 MiB of memory. A worker
imports them when the queue first holds a job for it instead of at start, so it polls the queue 1.5 s after it starts
(14 s before), and one that never gets a job (the second worker of a quiet ``serve``) holds 85 MiB (490 before). It
imports them before it claims the job, not after: a claimed job's lease would otherwise wait out the import.
"""

from __future__ import annotations

import asyncio
import functools

from service.gc_frozen import collector_paused
from service.runner.finish import Runner
from service.store.tables import JobKind


@functools.cache
def runners() -> dict[JobKind, Runner]:
    """``run_job``, ``run_evaluation`` and ``run_client_batch`` by the kind of job they run (one signature:
    service/runner/finish.py)."""
    with collector_paused():  # gc_frozen.py
        from service.art_client.runner import run_client_batch
        from service.evaluation.runner import run_evaluation
        from service.training.loop import run_job

    return {JobKind.training: run_job, JobKind.evaluation: run_evaluation, JobKind.client_batch: run_client_batch}


def loaded() -> bool:
    return bool(runners.cache_info().currsize)


async def load(stop: asyncio.Event) -> bool:
    """Import the runners on a thread, so that the event loop goes on (signals, the heartbeat's record); True once
    they are imported, False if ``stop`` is set first: the worker then stops claiming at once, holding no job (its
    process still lets the thread finish the import before it exits)."""
    if loaded():
        return True
    loading = asyncio.ensure_future(asyncio.to_thread(runners))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not loading.done():
        return False
    loading.result()  # an import that failed raises here
    return True


async def close_client_models() -> None:
    """Unload the model an ART client's batches kept loaded for their next batch, if a batch ever ran here."""
    if loaded():
        from service.art_client.runner import WARM

        await WARM.close()
