"""The folder ``serve --api-processes N`` shares with its children: prometheus_client's multiprocess files and the
supervisors' counts. serve removes it when it exits; one whose serve was killed (kill -9, a crash, the OOM killer)
is removed by the next serve that starts on the machine, so a box restarted by hand again and again does not fill
its temporary folder with them.

A serve holds an exclusive ``flock`` on a file in its folder for as long as it runs, and the kernel lets go of it
when the process ends, however it ends: a folder whose lock can be taken belongs to no live serve. (A process id in
the name would do on one host, but not across containers sharing a temporary folder, nor after the id is reused.)
The folder is made and locked under a hidden name and only then renamed into view, so another serve never sees it
unlocked."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)
PREFIX = "artsvc-metrics-"
LOCK = ".serve-lock"


@contextlib.contextmanager
def metrics_folder(root: Path | None = None) -> Iterator[Path]:
    """A new folder, held for as long as this process runs and removed on exit, after removing the folders of serves
    that died."""
    root = Path(root or tempfile.gettempdir())
    remove_orphans(root)
    hidden = Path(tempfile.mkdtemp(prefix=f".{PREFIX}", dir=root))
    lock = os.open(hidden / LOCK, os.O_CREAT | os.O_WRONLY, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    folder = root / hidden.name.removeprefix(".")
    try:
        hidden.rename(folder)
        yield folder
    finally:
        shutil.rmtree(folder if folder.exists() else hidden, ignore_errors=True)
        os.close(lock)


def remove_orphans(root: Path) -> list[Path]:
    """Remove the metrics folders in ``root`` no live serve holds; return them."""
    removed = [folder for folder in sorted(root.glob(f"{PREFIX}*")) if _remove_if_orphaned(folder)]
    if removed:
        log.info("removed %d metrics folder(s) left by a serve that was killed", len(removed))
    return removed


def _remove_if_orphaned(folder: Path) -> bool:
    """Remove ``folder`` if it is this user's real folder (not a link) with an unheld lock; a folder with no lock
    file is not serve's (or not yet), and one that another serve removes meanwhile is simply gone."""
    try:
        status = os.lstat(folder)
        if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.getuid():
            return False
        lock = os.open(folder / LOCK, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # its serve is alive
    else:
        shutil.rmtree(folder, ignore_errors=True)
        return True
    finally:
        os.close(lock)
