"""The worker: claims jobs under leases, trains several at once, and hands them back on shutdown.
It runs evaluation jobs the same way, under the same hooks (they record only at their end, so an
interrupted one starts over).

Each job runs as an asyncio task through its kind's runner (service/worker/runners.py, imported before the first claim); a
heartbeat renews the leases of the jobs it holds from a thread of its own (a step that keeps the event loop busy does not starve it), and every write of a job renews its lease in the write's own
transaction (service/runner/control.py). A job stops at its next check (about a second apart inside a warm start, a
step's rollouts or a validation; an evaluation's rollout), recording nothing, when the worker shuts down (its lease is released, so
another worker resumes it at once) or when its lease was lost (another worker took it over: its writes are refused,
and the new owner's rows stand). A job that fails is recorded as failed by its runner; the worker goes on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session

from service.alerts import WebhookNotifier
from service.runner.control import JobHooks, JobInterrupted
from service.settings import Settings
from service.store import queue_signal
from service.store.tables import Job, JobKind
from service.worker import leases, runners

log = logging.getLogger(__name__)
T = TypeVar("T")


def default_worker_id() -> str:
    """Host, process and a random suffix: unique even when a pid is reused."""
    return f"{socket.gethostname()[:40]}-{os.getpid()}-{secrets.token_hex(4)}"


@dataclass
class _Held:
    """A job this worker trains, and whether it still holds the job's lease."""

    job_id: str
    renewed_at: float  # time.monotonic() just before the last claim or renewal that succeeded
    lost: bool = False


class Worker:
    """Trains queued jobs from the store, up to ``settings.worker_concurrency`` at once, until stopped."""

    def __init__(self, engine: Engine, settings: Settings, *, worker_id: str | None = None) -> None:
        self.engine = engine
        self.settings = settings
        self.id = worker_id or default_worker_id()
        self._held: dict[str, _Held] = {}
        self._stopping = False
        self._slot_freed = asyncio.Event()
        self._queued = asyncio.Event()  # set when a job is announced (service/store/queue_signal.py)

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and train jobs until ``stop`` is set; then let each running job finish or checkpoint its
        current step, release their leases (back to the queue) and mark this worker stopped."""
        concurrency = self.settings.worker_concurrency
        record = dict(worker_id=self.id, hostname=socket.gethostname(), pid=os.getpid(), concurrency=concurrency)
        await self._db(leases.register_worker, **record)
        notifier = WebhookNotifier(self.settings.alert_webhook_url, self.engine)
        log.info("worker %s started: up to %d job(s) at once", self.id, concurrency)
        tasks: set[asyncio.Task[None]] = set()
        heartbeat_stopped = threading.Event()
        heartbeat = threading.Thread(target=self._heartbeat, args=(heartbeat_stopped,), name="heartbeat", daemon=True)
        heartbeat.start()
        watch = asyncio.create_task(queue_signal.watch(self.engine, self._queued))
        try:
            while not stop.is_set():
                while len(tasks) < concurrency and await self._ready(stop) and (job := await self._claim()) is not None:
                    task = asyncio.create_task(self._train(job, notifier))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                await self._idle(stop)
        finally:
            self._stopping = True  # every job's should_stop() is now True: each stops at its next step boundary
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
            if tasks:
                log.info("worker %s stopping: %d job(s) finish their current step", self.id, len(tasks))
                await asyncio.wait(tasks)
            heartbeat_stopped.set()
            await asyncio.to_thread(heartbeat.join)
            await runners.close_client_models()
            await notifier.aclose()
            try:
                await self._db(leases.stop_worker, worker_id=self.id)
            except SQLAlchemyError as exc:  # its heartbeat just stops, as if it had died
                log.warning("worker %s cannot record that it stopped: %s", self.id, exc)
            log.info("worker %s stopped", self.id)

    async def _ready(self, stop: asyncio.Event) -> bool:
        """Whether to try a claim: not stopping, and the runners imported, which the first job that could be claimed
        starts. A job is claimed only after the import (11-20 s on a slow machine), so its lease never waits on it."""
        if stop.is_set():
            return False
        if runners.loaded():
            return True
        try:
            if not await self._db(leases.any_claimable):
                return False
        except SQLAlchemyError:
            return True  # the claim says why
        try:
            return await runners.load(stop)
        except Exception:  # an installation that cannot train: the worker exits and its supervisor says so
            log.exception("worker %s cannot import its job runners (torch, transformers, ART)", self.id)
            raise

    async def _claim(self) -> Job | None:
        try:
            job = await asyncio.to_thread(self._claim_and_hold)
        except SQLAlchemyError as exc:
            log.warning("worker %s cannot claim jobs: %s", self.id, exc)
            return None
        if job is not None:
            log.info("claimed job %s (attempt %d, from step %d)", job.id, job.attempts, job.step)
        return job

    def _claim_and_hold(self) -> Job | None:
        """Claim a job and hand its lease to the heartbeat in the same thread, as the claim commits: the event loop
        may be busy (another job's step) long past a lease before ``_claim`` resumes, and a lease the heartbeat did
        not know of would lapse meanwhile."""
        asked = time.monotonic()
        job = self._in_transaction(leases.claim_next, worker_id=self.id, lease_seconds=self.settings.lease_seconds,
                                   max_running_per_tenant=self.settings.tenant_max_running_jobs,
                                   max_attempts=self.settings.max_attempts)  # fmt: skip
        if job is not None:
            self._held[job.id] = _Held(job.id, renewed_at=asked)
        return job

    async def _idle(self, stop: asyncio.Event) -> None:
        """Wait for the poll interval, a freed slot, a queued job, or ``stop``, whichever comes first."""
        events = (stop, self._slot_freed, self._queued)
        waiters = [asyncio.ensure_future(event.wait()) for event in events]
        try:
            await asyncio.wait(waiters, timeout=self.settings.poll_seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        self._slot_freed.clear()
        self._queued.clear()

    async def _train(self, job: Job, notifier: WebhookNotifier) -> None:
        held = self._held[job.id]
        hooks = JobHooks(
            on_event=lambda kind, data: log.debug("job %s: %s %s", job.id, kind, data),
            should_stop=lambda: self._stopping or not self._holds(held),
            on_alert=notifier.notify,
            trajectories_per_step=self.settings.trajectories_per_step,
            holds_job=lambda session: self._renew_in(session, held),
        )
        try:
            runner = runners.runners()[JobKind(job.kind)]
            ended = await runner(job.id, db=self.engine, data_dir=self.settings.data_dir, settings=self.settings, hooks=hooks)
            reason = ended.stop_reason.value if ended.stop_reason else "-"
            log.info("finished job %s: %s (%s) at step %d", ended.id, ended.status.value, reason, ended.step)
        except JobInterrupted:
            if not self._holds(held):
                log.warning("stopped job %s: its lease lapsed or was taken over; whoever holds it resumes it", job.id)
            elif await self._db(leases.release, job_id=job.id, worker_id=self.id):
                log.info("released job %s at a step boundary: back in the queue", job.id)
        except Exception as exc:  # its runner recorded it (if the store was unreachable, the lease expires: a retry)
            name = type(exc).__name__
            log.error("job %s failed: %s: %s", job.id, name, exc, exc_info=log.isEnabledFor(logging.DEBUG))
        finally:
            del self._held[job.id]
            self._slot_freed.set()

    def _renew_in(self, session: Session, held: _Held) -> bool:
        """The lease fence, inside a write's transaction: renew the lease, or learn that another worker has the job."""
        if leases.renew(session, job_id=held.job_id, worker_id=self.id, lease_seconds=self.settings.lease_seconds):
            return True
        held.lost = True
        return False

    def _holds(self, held: _Held) -> bool:
        """Whether the lease is surely still ours: not taken over, and renewed within a lease period."""
        return not held.lost and time.monotonic() - held.renewed_at < self.settings.lease_seconds

    def _heartbeat(self, stopped: threading.Event) -> None:
        """Renew the held leases and this worker's record every third of a lease, until ``stopped``. A renewal that
        fails (the store unreachable) leaves the lease to lapse: ``_holds`` then says so and the job stops at its
        next check, writing nothing."""
        while not stopped.wait(self.settings.lease_seconds / 3):
            for held in [h for h in list(self._held.values()) if not h.lost]:
                asked = time.monotonic()
                try:
                    renewed = self._in_transaction(
                        leases.renew, job_id=held.job_id, worker_id=self.id, lease_seconds=self.settings.lease_seconds
                    )
                except SQLAlchemyError as exc:
                    log.warning("cannot renew the lease of job %s: %s", held.job_id, exc)
                    continue
                if renewed:
                    held.renewed_at = asked
                else:
                    held.lost = True
            try:
                self._in_transaction(leases.heartbeat_worker, worker_id=self.id, running_jobs=len(self._held))
            except SQLAlchemyError as exc:
                log.warning("worker %s cannot record its heartbeat: %s", self.id, exc)

    def _in_transaction(self, fn: Callable[..., T], **kwargs: Any) -> T:
        """``fn(session, **kwargs)`` in its own short transaction, committed."""
        with Session(self.engine, expire_on_commit=False) as session:
            result = fn(session, **kwargs)
            session.commit()
            return result

    async def _db(self, fn: Callable[..., T], **kwargs: Any) -> T:
        """``_in_transaction`` off the event loop."""
        return await asyncio.to_thread(self._in_transaction, fn, **kwargs)
