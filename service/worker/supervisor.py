"""Worker processes, and API processes beyond the first, as children of ``artsvc serve``: started, started again when
they die, stopped on shutdown.

Training never shares the API's interpreter: each worker child runs ``artsvc worker`` (service/cli/worker.py) on the
store and data folder the API resolved. With ``--api-processes N`` above 1, ``serve`` itself answers no request: it
binds the socket and supervises N children serving the API on it (service/cli/serve.py), whose ``/metrics`` show
these counts through a status file (``SupervisedCounts``). A child that dies (an exit, a signal, kill -9) is started again after a pause that
doubles with each death (1 s up to a minute), so a worker that cannot start does not spin; a child that ran a minute
before dying was healthy, and its successor waits only the first pause. Its jobs' leases expire and the next worker
resumes them from their last checkpoint. Stopping sends SIGTERM to every child (each finishes or checkpoints its
current step and hands its jobs back), waits up to the grace period, then SIGKILLs what is left.

The worker children yield the CPU to the API (``settle_as_child``: SCHED_IDLE, or a higher niceness), so requests
stay fast while jobs train, and on Linux they get SIGTERM when their supervisor dies, so a killed ``serve`` leaves no worker behind.
A worker does not count on that signal alone (its handler runs on an event loop a step may keep busy): a thread of its
own (``watch_parent``) sees the supervisor gone, asks the worker to stop (its jobs stop at their next check and are
handed back) and kills the process if it still runs ORPHAN_GRACE_S later.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from service.cpu import yield_cpu
from service.settings import Settings

log = logging.getLogger(__name__)

FIRST_PAUSE_S = 1.0  # before starting a dead child's successor; doubles with each death
MAX_PAUSE_S = 60.0
HEALTHY_S = 60.0  # a child that ran this long was healthy: its successor waits only FIRST_PAUSE_S
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
ORPHAN_GRACE_S = 10.0  # how long a worker whose supervisor died has to hand its jobs back before it is killed
PARENT_POLL_S = 0.5


def worker_processes(settings: Settings, *, status_dir: Path | None = None) -> Supervisor:
    """``settings.workers`` children running ``artsvc worker`` on this process's store and data folder (command-line
    overrides included), each told this process's pid so it can settle as a child; their counts written in
    ``status_dir`` if given."""
    return Supervisor(
        _our_command("worker"), count=settings.workers, env=_child_env(settings), grace_s=settings.worker_grace_s,
        kind="worker", status_dir=status_dir,
    )  # fmt: skip


def api_processes(settings: Settings, *, listen_fd: int, status_dir: Path, access_log: bool) -> Supervisor:
    """``settings.api_processes`` children serving the API on the listening socket ``listen_fd`` (inherited), on this
    process's settings (command-line overrides included), their metrics and the supervisors' counts in
    ``status_dir``."""
    command = _our_command("serve", "--listen-fd", str(listen_fd), *(["--access-log"] if access_log else []))
    env = _child_env(
        settings, ARTSVC_HOST=settings.host, ARTSVC_LOCAL_MODE=str(settings.local_mode).lower(), ARTSVC_WORKERS="0",
        ARTSVC_API_PROCESSES="1", PROMETHEUS_MULTIPROC_DIR=str(status_dir),
    )  # fmt: skip
    return Supervisor(command, count=settings.api_processes, env=env, grace_s=settings.worker_grace_s, kind="api",
                      pass_fds=(listen_fd,), status_dir=status_dir)  # fmt: skip


def _our_command(verb: str, *args: str) -> list[str]:
    """``artsvc VERB ARGS``, told this process's pid so it can settle as its child."""
    return [sys.executable, "-m", "service", verb, *args, "--supervised-by", str(os.getpid())]


def _child_env(settings: Settings, **extra: str) -> dict[str, str]:
    """This process's environment with the store and data folder it resolved (command-line overrides included)."""
    env = {"ARTSVC_DATABASE_URL": settings.resolved_database_url, "ARTSVC_DATA_DIR": str(settings.data_dir.resolve())}
    return {**os.environ, **env, **extra}


def settle_as_child(*, parent: int, cpu_policy: str | None = None, nice: int = 0) -> bool:
    """What a supervised child does first, before it starts any thread: a worker lowers its CPU priority
    (``service.cpu.yield_cpu`` with ``cpu_policy`` and ``nice``; an API process passes no policy and keeps its own)
    and, on Linux, asks for SIGTERM when ``parent`` dies. False if ``parent`` is already gone (it should not start)."""
    if cpu_policy is not None:
        yield_cpu(policy=cpu_policy, nice=nice)
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    return os.getppid() == parent


def watch_parent(parent: int, on_orphaned: Callable[[], None], *, grace_s: float = ORPHAN_GRACE_S) -> threading.Thread:
    """Start a daemon thread that, once ``parent`` is no longer this process's parent (it died), calls
    ``on_orphaned`` (from that thread) and, if the process still runs ``grace_s`` later (a phase that cannot stop,
    an event loop kept busy), kills it with SIGKILL: a worker nobody supervises never trains on."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        log.warning("the supervisor (pid %d) is gone: stopping, killed in %g s if still running", parent, grace_s)
        on_orphaned()
        time.sleep(grace_s)
        log.error("still running %g s after the supervisor died: killing this process", grace_s)
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


class Supervisor:
    """Keeps ``count`` copies of ``command`` running as child processes until stopped; a Prometheus collector of
    how many run and how many were started again after dying (``kind``: ``worker`` or ``api``, in the metrics' names),
    and with ``status_dir`` the same counts in a file there for ``SupervisedCounts``."""

    def __init__(
        self, command: Sequence[str], *, count: int, env: Mapping[str, str], grace_s: float, kind: str,
        pass_fds: Sequence[int] = (), status_dir: Path | None = None,
    ) -> None:  # fmt: skip
        self.command = list(command)
        self.count = count
        self.env = dict(env)
        self.grace_s = grace_s
        self.kind = kind
        self.pass_fds = tuple(pass_fds)
        self.status_dir = status_dir
        self.restarts = 0
        self._running: dict[int, asyncio.subprocess.Process] = {}  # by child number, 1 to count
        self._hurry = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        """Start the children and start again any that dies, until ``stop`` is set; then stop them all (SIGTERM,
        SIGKILL after ``grace_s`` or ``hurry()``) and return once none is left."""
        self._counts_changed()
        await asyncio.gather(stop.wait(), *(self._keep(number, stop) for number in range(1, self.count + 1)))

    def hurry(self) -> None:
        """Kill the children now instead of waiting out the grace period (a second Ctrl-C)."""
        self._hurry.set()

    def collect(self) -> Iterator[Metric]:
        """For ``/metrics``: the children running now, and how many were started again after one died."""
        yield from _count_metrics(self.kind, running=len(self._running), restarts=self.restarts)

    def _counts_changed(self) -> None:
        """Write the counts for the API processes' ``/metrics`` (replaced whole: a reader never sees half a file)."""
        if self.status_dir is not None:
            path = self.status_dir / f"supervised-{self.kind}.json"
            path.with_suffix(".tmp").write_text(json.dumps({"running": len(self._running), "restarts": self.restarts}))
            path.with_suffix(".tmp").replace(path)

    async def _keep(self, number: int, stop: asyncio.Event) -> None:
        pause = FIRST_PAUSE_S
        while not stop.is_set():
            started = time.monotonic()
            ended = await self._run_one(number, stop)
            if ended is None:
                return
            ran = time.monotonic() - started
            if ran >= HEALTHY_S:
                pause = FIRST_PAUSE_S
            self.restarts += 1
            self._counts_changed()
            log.warning("%s %d %s after %.0f s; starting another in %g s", self.kind, number, ended, ran, pause)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause)
            pause = min(2 * pause, MAX_PAUSE_S)

    async def _run_one(self, number: int, stop: asyncio.Event) -> str | None:
        """One child, until it ends (how it ended, in words) or ``stop`` is set (then it is stopped, and None)."""
        try:
            child = await asyncio.create_subprocess_exec(*self.command, env=self.env, pass_fds=self.pass_fds)
        except OSError as exc:
            return f"could not start: {exc}"
        log.info("%s %d started: pid %d", self.kind, number, child.pid)
        self._running[number] = child
        self._counts_changed()
        try:
            if await _exited(child, stop):
                return f"(pid {child.pid}) {_how(child.returncode)}"
            await self._stop(number, child)
            return None
        finally:
            del self._running[number]
            self._counts_changed()

    async def _stop(self, number: int, child: asyncio.subprocess.Process) -> None:
        _signal(child, signal.SIGTERM)
        if not await _exited(child, self._hurry, timeout=self.grace_s):
            log.warning("%s %d (pid %d) has not stopped: killing it", self.kind, number, child.pid)
            _signal(child, signal.SIGKILL)
            await child.wait()
        log.info("%s %d (pid %d) stopped: %s", self.kind, number, child.pid, _how(child.returncode))


class SupervisedCounts:
    """For the ``/metrics`` of an API process that ``serve`` supervises: the counts its supervisors wrote in
    ``status_dir`` (none yet: nothing)."""

    def __init__(self, status_dir: Path) -> None:
        self.status_dir = status_dir

    def collect(self) -> Iterator[Metric]:
        for kind in ("worker", "api"):
            with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
                counts = json.loads((self.status_dir / f"supervised-{kind}.json").read_text())
                yield from _count_metrics(kind, running=int(counts["running"]), restarts=int(counts["restarts"]))


def _count_metrics(kind: str, *, running: int, restarts: int) -> Iterator[Metric]:
    what = {"worker": "Worker processes", "api": "API processes"}[kind]
    yield GaugeMetricFamily(f"artsvc_{kind}_processes", f"{what} `artsvc serve` runs.", value=running)
    yield CounterMetricFamily(
        f"artsvc_{kind}_restarts", f"{what} `artsvc serve` started again after one died.", value=restarts
    )


async def _exited(child: asyncio.subprocess.Process, event: asyncio.Event, *, timeout: float | None = None) -> bool:
    """Wait for ``child`` to end, or ``event`` to be set, or ``timeout``; whether it ended."""
    waiters = [asyncio.ensure_future(child.wait()), asyncio.ensure_future(event.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return child.returncode is not None


def _signal(child: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
        child.send_signal(sig)


def _how(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"
