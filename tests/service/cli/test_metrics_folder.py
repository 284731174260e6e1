"""serve's shared metrics folder: removed on exit, and left-overs of a killed serve removed by the next one."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from service.cli.metrics_folder import LOCK, metrics_folder, remove_orphans

HOLD_AND_WAIT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from service.cli.metrics_folder import metrics_folder
    with metrics_folder(Path(sys.argv[1])) as folder:
        (folder / "histogram_1.db").write_bytes(b"\\0" * 10)
        print(folder, flush=True)
        time.sleep(600)
""")


def serve_like(root):
    """A process holding a metrics folder in ``root`` as serve does, and the folder."""
    process = subprocess.Popen([sys.executable, "-c", HOLD_AND_WAIT, str(root)], stdout=subprocess.PIPE, text=True)
    return process, Path(process.stdout.readline().strip())


def test_the_folder_of_a_killed_serve_is_removed_and_a_live_one_s_is_not(tmp_path):
    killed, orphan = serve_like(tmp_path)
    live, held = serve_like(tmp_path)
    try:
        assert remove_orphans(tmp_path) == []  # both alive
        killed.kill()
        killed.wait()
        assert orphan.is_dir()  # kill -9: nothing of its own removed it
        assert remove_orphans(tmp_path) == [orphan]
        assert not orphan.exists() and (held / "histogram_1.db").is_file()
    finally:
        live.kill()
        live.wait()
        killed.stdout.close()
        live.stdout.close()


def test_only_this_user_s_real_folders_with_a_lock_file_are_taken(tmp_path):
    no_lock = tmp_path / "artsvc-metrics-nolock"  # not serve's, or one from before the lock
    no_lock.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / LOCK).write_text("")
    link = tmp_path / "artsvc-metrics-link"
    link.symlink_to(elsewhere)
    a_file = tmp_path / "artsvc-metrics-file"
    a_file.write_text("not a folder")
    other = tmp_path / "other-name"
    other.mkdir()
    (other / LOCK).write_text("")

    assert remove_orphans(tmp_path) == []
    assert no_lock.is_dir() and link.is_symlink() and (elsewhere / LOCK).is_file() and a_file.is_file() and other.is_dir()


def test_a_folder_is_held_while_in_use_and_goes_on_exit(tmp_path):
    with metrics_folder(tmp_path) as folder:
        assert folder.parent == tmp_path and folder.name.startswith("artsvc-metrics-") and (folder / LOCK).is_file()
        (folder / "histogram_7.db").write_bytes(b"\0")
        assert remove_orphans(tmp_path) == []  # a live serve's folder is never taken, even by its own process
    assert list(tmp_path.iterdir()) == []
