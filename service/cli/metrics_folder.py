"""The folder ``serve --api-processes N`` shares with its children: prometheus_client's multiprocess files and the
supervisors' counts. serve removes it when it exits; one whose serve was killed (kill -9, a crash, the OOM killer)
is removed by the next serve that starts on the machine, so a box restarted by hand again and again does not fill
its temporary folder with them. The owning serve's process id is in the folder's name; a folder is removed only
when it is this user's and no process with that id is alive (a reused id keeps a folder a while longer: harmless)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)
PREFIX = "artsvc-metrics-"


@contextlib.contextmanager
def metrics_folder(root: Path | None = None) -> Iterator[Path]:
    """A new folder named for this process, removed on exit, after removing the folders of serves that died."""
    root = Path(root or tempfile.gettempdir())
    remove_orphans(root)
    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}{os.getpid()}-", dir=root) as folder:
        yield Path(folder)


def remove_orphans(root: Path) -> list[Path]:
    """Remove the metrics folders in ``root`` whose serve is no longer alive; return them."""
    removed = []
    for folder in sorted(root.glob(f"{PREFIX}*")):
        pid = owner_pid(folder.name)
        if pid is None or _alive(pid) or not folder.is_dir() or folder.is_symlink() or folder.stat().st_uid != os.getuid():
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    if removed:
        log.info("removed %d metrics folder(s) left by a serve that was killed", len(removed))
    return removed


def owner_pid(name: str) -> int | None:
    """The process id in a folder name ``artsvc-metrics-<pid>-<random>``; None for any other name."""
    pid, dash, _ = name.removeprefix(PREFIX).partition("-")
    return int(pid) if name.startswith(PREFIX) and dash and pid.isascii() and pid.isdigit() and 0 < int(pid) < 2**31 else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
