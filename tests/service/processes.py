"""Our own commands as child processes of a test, on the test's store and data folder: ``artsvc worker`` and
``artsvc serve``, each with its output in a file, and a look at which processes a process started."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

LEASE_SECONDS = 3  # a killed worker's jobs are taken over within seconds


def environment(*, database_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    """This process's environment without its ``ARTSVC_*`` variables, plus the store, the data folder (shared by every
    worker: the checkpoints live there), short leases, quick polls, serve's workers at a niceness rather than in
    SCHED_IDLE (the suite's other pytest process keeps the cores busy, and a SCHED_IDLE worker would wait it out), and
    ``extra``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("ARTSVC_")}
    return env | {"ARTSVC_DATABASE_URL": database_url, "ARTSVC_DATA_DIR": str(data_dir),
                  "ARTSVC_LEASE_SECONDS": str(LEASE_SECONDS), "ARTSVC_POLL_SECONDS": "0.2",
                  "ARTSVC_WORKER_CPU_POLICY": "nice", **extra}  # fmt: skip


class _Logged:
    """A ``python -m service`` command as a child process, its output in ``log_path``; run away from any .env file
    of the repository."""

    def __init__(self, *args: str, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "w") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                [sys.executable, "-m", "service", *args], env=env, cwd=log_path.parent, stdout=log, stderr=log
            )

    def log(self) -> str:
        return f"--- {self.log_path.name} ---\n{self.log_path.read_text()}"


class WorkerProcess(_Logged):
    """``artsvc worker``."""

    def __init__(self, *args: str, env: dict[str, str], log_path: Path) -> None:
        super().__init__("worker", *args, env=env, log_path=log_path)


class ServeProcess(_Logged):
    """``artsvc serve --local --port 0``; ``url`` is where it said it listens (it accepts connections from then on)."""

    def __init__(self, *args: str, env: dict[str, str], log_path: Path) -> None:
        super().__init__("serve", "--local", "--port", "0", *args, env=env, log_path=log_path)
        deadline = time.monotonic() + 120
        while "listening on " not in (said := log_path.read_text()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"artsvc serve did not say where it listens:\n{self.log()}")
            time.sleep(0.1)
        self.url = said.split("listening on ")[1].split()[0]


def children_of(pid: int) -> set[int]:
    """The live processes whose parent is ``pid`` (Linux: read from /proc)."""
    children = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (command name)": state, ppid, ...
        except (FileNotFoundError, ProcessLookupError):  # it ended meanwhile
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            children.add(int(stat.parent.name))
    return children


def loaded_torch(pid: int) -> bool:
    """Whether process ``pid`` has torch's library mapped (Linux: read from /proc)."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
