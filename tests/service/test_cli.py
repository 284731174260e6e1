"""Bad input to ``artsvc train`` gets one clear line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def artsvc(*args: str, tmp_path, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ARTSVC_")}
    environment.update(ARTSVC_DATA_DIR=str(tmp_path / "data"), **env)
    return subprocess.run(
        [sys.executable, "-m", "service", *args], env=environment, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "chess"], "unknown environment 'chess'"),
        (["--env", "math", "--group-size", "0"], "training.group_size"),
        (["--env", "math", "--group-size", "-3"], "training.group_size"),
        (["--env", "math", "--patience", "0"], "validation.patience"),
        (["--env", "math", "--max-steps", "0"], "training.max_steps"),
        ([], "say which environment"),
    ],
)
def test_bad_arguments_are_explained(args, message, tmp_path):
    result = artsvc("train", *args, tmp_path=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_an_unwritable_database_path_is_explained(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where a folder should be")
    url = f"sqlite:///{blocker / 'store.db'}"
    result = artsvc("train", "--env", "math", tmp_path=tmp_path, ARTSVC_DATABASE_URL=url)
    assert result.returncode == 2
    assert "cannot create the database folder" in result.stderr
    assert "Traceback" not in result.stderr


def test_db_upgrade_migrates_and_is_idempotent(tmp_path):
    for _ in range(2):
        result = artsvc("db", "upgrade", tmp_path=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "up to date" in result.stderr
    assert (tmp_path / "data" / "artsvc.db").exists()


def test_resuming_an_unknown_job_is_explained(tmp_path):
    result = artsvc("train", "--resume", "no-such-job", tmp_path=tmp_path)
    assert result.returncode == 2 and "no job 'no-such-job'" in result.stderr
