"""`artsvc worker` refuses what it cannot run, saying what to do."""

from __future__ import annotations

import os
import subprocess
import sys


def _worker(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ARTSVC_DATABASE_URL": f"sqlite:///{tmp_path / 'empty.db'}", "ARTSVC_DATA_DIR": str(tmp_path)}
    command = [sys.executable, "-m", "service", "worker", *args]
    return subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_an_unmigrated_database_is_refused_with_the_command_to_run(tmp_path):
    result = _worker(tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "run `artsvc db upgrade`" in " ".join(result.stderr.split())


def test_a_concurrency_below_one_is_refused(tmp_path):
    result = _worker(tmp_path, "--concurrency", "0")
    assert result.returncode == 2 and "--concurrency" in result.stderr and "Traceback" not in result.stderr
