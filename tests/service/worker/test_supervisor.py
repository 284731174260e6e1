"""``artsvc serve`` and the worker processes it supervises: how many it runs and at what priority, a worker killed
with SIGKILL started again (its job resumed and finished), SIGTERM handing the running job back on the way out, and
workers stopping by themselves when serve is killed; with ``--api-processes``, the API processes it supervises too.
Real processes, the API over loopback HTTP, the store a SQLite file: claims, takeovers and releases on PostgreSQL are
tested in test_worker_processes.py and test_leases.py."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from sqlmodel import Session, col, select

from service.store.tables import Job, JobStatus, WorkerRecord
from service.worker.supervisor import ORPHAN_GRACE_S
from tests.databases import sqlite_only
from tests.service.processes import ServeProcess, children_of, environment, loaded_torch
from tests.service.worker.conftest import (
    LONGER_JOB,
    assert_finished_like_the_reference,
    ended,
    history,
    load_job,
    steps_recorded,
    wait_for,
)

pytestmark = sqlite_only


@pytest.fixture
def start_serve(engine, tmp_path) -> Iterator[Callable[..., ServeProcess]]:
    """``start_serve(*args)``: ``artsvc serve`` on the test's store; it and its workers are killed at the end if left."""
    started: list[ServeProcess] = []

    def start(*args: str, **env: str) -> ServeProcess:
        database_url = engine.url.render_as_string(hide_password=False)
        env = environment(database_url=database_url, data_dir=tmp_path / "data", **env)
        serve = ServeProcess(*args, env=env, log_path=tmp_path / f"serve-{len(started) + 1}.log")
        started.append(serve)
        return serve

    yield start
    for serve in started:
        if serve.process.poll() is None:
            for pid in children_of(serve.process.pid):
                os.kill(pid, signal.SIGKILL)
            serve.process.kill()
            serve.process.wait()


def unstopped_pids(engine) -> set[int]:
    """The pids of the workers the store has not seen stop: the live ones, and any killed before it could say so."""
    with Session(engine) as session:
        return set(session.exec(select(WorkerRecord.pid).where(col(WorkerRecord.stopped_at).is_(None))).all())


def pids_of(engine, count: int) -> set[int] | None:
    """The unstopped workers' pids once there are ``count`` of them."""
    pids = unstopped_pids(engine)
    return pids if len(pids) == count else None


def post_job(serve: ServeProcess, spec: dict = LONGER_JOB) -> str:
    response = httpx.post(f"{serve.url}/v1/jobs", json=spec, timeout=30)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def api_children(serve: ServeProcess) -> set[int]:
    """The live API processes of a ``serve --api-processes``."""
    pids = set()
    for pid in children_of(serve.process.pid):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            if b"--listen-fd" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.add(pid)
    return pids


def api_pids(serve: ServeProcess, count: int, *, besides: int | None = None) -> set[int] | None:
    """The live API processes, but ``besides``, once there are ``count`` of them."""
    pids = api_children(serve) - {besides}
    return pids if len(pids) == count else None


def requests_counted(serve: ServeProcess, route: str) -> float:
    """The latency histogram's count of 200s on GET ``route``, as ``/metrics`` shows it."""
    line = f'artsvc_http_request_duration_seconds_count{{method="GET",route="{route}",status="200"}} '
    metrics = httpx.get(f"{serve.url}/metrics", timeout=30).text
    return next((float(row.removeprefix(line)) for row in metrics.splitlines() if row.startswith(line)), 0.0)


def assert_gone(pids: set[int]) -> None:
    for pid in pids:
        with pytest.raises(ProcessLookupError):  # reaped by serve, so not even a zombie
            os.kill(pid, 0)


@pytest.mark.timeout(300)
def test_two_workers_run_as_children_of_serve_at_a_lower_cpu_priority_and_stop_with_it(engine, start_serve):
    serve = start_serve("--workers", "2", ARTSVC_WORKER_CPU_POLICY="idle")  # the default, which the suite sets aside
    pids = wait_for(lambda: pids_of(engine, 2), what="2 live workers", timeout=240, workers=(serve,))
    assert children_of(serve.process.pid) == pids
    ours = os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0)
    api = os.getpriority(os.PRIO_PROCESS, serve.process.pid), os.sched_getscheduler(serve.process.pid)
    assert api == ours  # the API keeps its priority
    assert {os.sched_getscheduler(pid) for pid in pids} == {os.SCHED_IDLE}
    health = httpx.get(f"{serve.url}/healthz", timeout=30).json()
    assert (health["status"], health["workers"]["alive"]) == ("ok", 2)
    assert not any(loaded_torch(pid) for pid in pids)  # a worker without a job has not imported torch and ART

    serve.process.send_signal(signal.SIGTERM)
    assert serve.process.wait(timeout=120) == 0, serve.log()
    assert unstopped_pids(engine) == set(), serve.log()  # each recorded that it stopped
    assert_gone(pids)


@pytest.mark.timeout(600)
def test_a_worker_killed_with_sigkill_is_started_again_and_its_job_resumes_and_finishes(engine, start_serve, reference):
    serve = start_serve("--workers", "1")
    job_id = post_job(serve)
    wait_for(lambda: steps_recorded(engine, job_id, 2), what="2 recorded steps", timeout=240, workers=(serve,))
    (doomed,) = unstopped_pids(engine)
    assert children_of(serve.process.pid) == {doomed}
    os.kill(doomed, signal.SIGKILL)

    wait_for(lambda: ended(engine, job_id), what="the job's end", timeout=300, workers=(serve,))
    assert_finished_like_the_reference(engine, job_id, reference, attempts=2)  # taken over after its lease lapsed
    with Session(engine) as session:  # its torch threads slept while they waited, the API beside them (service/cpu.py)
        assert session.get(Job, job_id).manifest["runtime"]["omp_wait_policy"] == "PASSIVE"
    (successor,) = unstopped_pids(engine) - {doomed}  # the dead one never said it stopped: its record ages out
    assert children_of(serve.process.pid) == {successor}
    assert f"worker 1 (pid {doomed}) was killed by SIGKILL" in serve.log()
    assert "artsvc_worker_restarts_total 1.0" in httpx.get(f"{serve.url}/metrics", timeout=30).text

    serve.process.send_signal(signal.SIGTERM)
    assert serve.process.wait(timeout=120) == 0, serve.log()


@pytest.mark.timeout(600)
def test_sigterm_to_serve_hands_the_running_job_back_at_a_step_boundary_and_every_worker_exits(
    engine, start_serve, reference
):
    serve = start_serve("--workers", "2")
    job_id = post_job(serve)
    wait_for(lambda: steps_recorded(engine, job_id, 2), what="2 recorded steps", timeout=240, workers=(serve,))
    pids = wait_for(lambda: pids_of(engine, 2), what="2 live workers", timeout=240, workers=(serve,))

    serve.process.send_signal(signal.SIGTERM)
    assert serve.process.wait(timeout=300) == 0, serve.log()
    released = load_job(engine, job_id)
    assert released.status is JobStatus.queued and released.worker_id is None and released.lease_expires_at is None
    steps, _ = history(engine, job_id)
    assert released.step >= 2 and steps == reference[0][: released.step]  # every step done so far, as it was
    assert unstopped_pids(engine) == set()  # each recorded that it stopped
    assert_gone(pids)
    log = serve.log()
    assert all(f"(pid {pid}) stopped: exited with code 0" in log for pid in pids), log  # not killed: each let go


@pytest.mark.timeout(300)
@pytest.mark.skipif(sys.platform != "linux", reason="a parent-death signal is Linux's")
def test_the_workers_of_a_serve_killed_with_sigkill_stop_by_themselves_within_seconds_even_mid_phase(engine, start_serve):
    serve = start_serve("--workers", "1")
    wait_for(lambda: pids_of(engine, 1), what="a live worker", timeout=240, workers=(serve,))
    job_id = post_job(serve, {**LONGER_JOB, "training": {**LONGER_JOB["training"], "warm_start_examples": 20_000}})
    wait_for(lambda: load_job(engine, job_id).status is JobStatus.running, what="the job to start", timeout=60)
    time.sleep(1)  # into its warm start: minutes of work without a step boundary
    serve.process.kill()
    serve.process.wait()
    killed = time.monotonic()
    wait_for(lambda: unstopped_pids(engine) == set(), what="the orphaned worker to stop", timeout=ORPHAN_GRACE_S + 10)
    assert time.monotonic() - killed < ORPHAN_GRACE_S  # stopped by itself, not killed by its watchdog
    assert load_job(engine, job_id).status is JobStatus.queued  # handed back for the next worker, not left running


@pytest.mark.timeout(300)
def test_api_processes_share_the_socket_and_the_metrics_are_started_again_and_stop_after_the_workers(
    engine, start_serve
):
    serve = start_serve("--workers", "1", "--api-processes", "2")
    workers = wait_for(lambda: pids_of(engine, 1), what="a live worker", timeout=240, workers=(serve,))
    apis = wait_for(lambda: api_pids(serve, 2), what="2 API processes", timeout=120, workers=(serve,))
    assert children_of(serve.process.pid) == workers | apis  # serve itself answers no request
    shared = Path(next(entry.removeprefix(b"PROMETHEUS_MULTIPROC_DIR=").decode()
                       for entry in Path(f"/proc/{min(apis)}/environ").read_bytes().split(b"\0")
                       if entry.startswith(b"PROMETHEUS_MULTIPROC_DIR=")))  # fmt: skip
    assert shared.name.startswith("artsvc-metrics-") and (shared / ".serve-lock").is_file()  # held while serve lives
    answered, sent = set(), 0
    while answered != apis and sent < 500:  # a new connection each: the kernel hands it to one of them
        assert httpx.get(f"{serve.url}/v1/jobs", timeout=30).status_code == 200
        sent += 1
        answered = {pid for pid in apis if (shared / f"histogram_{pid}.db").exists()}
    assert answered == apis, f"one process answered all {sent} requests"
    assert requests_counted(serve, "/v1/jobs") == sent  # /metrics of either sums both processes' requests
    metrics = httpx.get(f"{serve.url}/metrics", timeout=30).text
    assert "artsvc_api_processes 2.0" in metrics and "artsvc_worker_processes 1.0" in metrics

    doomed = min(apis)
    os.kill(doomed, signal.SIGKILL)
    successors = wait_for(lambda: api_pids(serve, 2, besides=doomed), what="a new API process", timeout=120,
                          workers=(serve,))  # fmt: skip
    wait_for(lambda: all(f"Started server process [{pid}]" in serve.log() for pid in successors),
             what="the new API process to serve (its SIGTERM handler set)", timeout=120, workers=(serve,))  # fmt: skip
    for _ in range(10):
        assert httpx.get(f"{serve.url}/v1/jobs", timeout=30).status_code == 200
    assert requests_counted(serve, "/v1/jobs") == sent + 10  # the dead process's requests still count
    assert "artsvc_api_restarts_total 1.0" in httpx.get(f"{serve.url}/metrics", timeout=30).text
    assert f"api 1 (pid {doomed}) was killed by SIGKILL" in serve.log() or f"api 2 (pid {doomed}) was killed" in serve.log()

    serve.process.send_signal(signal.SIGTERM)
    assert serve.process.wait(timeout=120) == 0, serve.log()
    assert_gone(workers | successors)
    log = serve.log()
    ends = [f"(pid {pid}) stopped: exited with code 0" for pid in (*workers, *successors)]
    assert all(end in log for end in ends), log  # each stopped by itself (the log shows which did not, and how)
    stopped = [log.index(end) for end in ends]
    assert max(stopped[:1]) < min(stopped[1:]), log  # the worker first, then the API processes
    assert not shared.exists()  # the metrics files went with serve
