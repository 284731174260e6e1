"""serve's shared metrics folder: removed on exit, and left-overs of a killed serve removed by the next one."""

from __future__ import annotations

import os
import subprocess
import sys

from service.cli.metrics_folder import metrics_folder, owner_pid, remove_orphans


def dead_pid() -> int:
    """The id of a process that has exited and been reaped."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_only_this_user_s_folders_of_dead_serves_are_removed(tmp_path):
    dead = dead_pid()
    orphan = tmp_path / f"artsvc-metrics-{dead}-x1y2"
    (orphan / "sub").mkdir(parents=True)
    (orphan / "histogram_1.db").write_bytes(b"\0" * 10)
    live = tmp_path / f"artsvc-metrics-{os.getpid()}-abcd"
    live.mkdir()
    unrelated = [tmp_path / "artsvc-metrics-abc", tmp_path / f"artsvc-metrics-{dead}", tmp_path / f"other-{dead}-x"]
    for folder in unrelated:
        folder.mkdir()
    a_file = tmp_path / f"artsvc-metrics-{dead}-file"
    a_file.write_text("not a folder")
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / f"artsvc-metrics-{dead}-link"
    link.symlink_to(target)

    assert remove_orphans(tmp_path) == [orphan]
    assert not orphan.exists()
    assert live.is_dir() and all(folder.is_dir() for folder in unrelated)
    assert a_file.is_file() and link.is_symlink() and target.is_dir()


def test_a_folder_is_named_for_its_serve_cleans_up_after_dead_ones_and_goes_on_exit(tmp_path):
    orphan = tmp_path / f"artsvc-metrics-{dead_pid()}-left"
    orphan.mkdir()
    with metrics_folder(tmp_path) as folder:
        assert folder.parent == tmp_path and owner_pid(folder.name) == os.getpid()
        assert not orphan.exists()
        (folder / "histogram_7.db").write_bytes(b"\0")
        assert remove_orphans(tmp_path) == []  # a live serve's folder is never taken
    assert list(tmp_path.iterdir()) == []


def test_owner_pid_reads_only_the_names_serve_gives():
    assert owner_pid("artsvc-metrics-123-abc") == 123
    assert owner_pid("artsvc-metrics-123-") == 123
    for name in ("artsvc-metrics-123", "artsvc-metrics--1-x", "artsvc-metrics-0-x", "artsvc-metrics-1e3-x",
                 "artsvc-metrics-99999999999999999999-x", "metrics-123-x", "artsvc-metrics-٣-x"):  # fmt: skip
        assert owner_pid(name) is None, name
