"""Bad input to ``artsvc train`` gets one clear line on stderr and exit code 2, never a traceback; what the API
refuses, ``artsvc train`` refuses too."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from sqlmodel import Session, select

from service.store import db as store_db
from service.store.tables import Job


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


@pytest.mark.parametrize(
    ("spec", "env", "message"),
    [
        ({"validation": {"baseline_model": "openai/gpt-4o-mini"}}, {},
         "validation.baseline_model: 'openai/gpt-4o-mini' is not a baseline model this server allows"),
        ({"training": {"max_steps": 51}}, {"ARTSVC_MAX_STEPS_PER_JOB": "50"},
         "training.max_steps: 51 is over this server's limit of 50 steps per job (ARTSVC_MAX_STEPS_PER_JOB)"),
    ],
    ids=["baseline", "per-job-limit"],
)  # fmt: skip
def test_train_refuses_what_the_api_refuses_before_queuing_anything(spec, env, message, tmp_path):
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({"environment": "math", **spec}))
    result = artsvc("train", "--spec", str(spec_file), tmp_path=tmp_path, **env)
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr
    engine = store_db.make_engine(f"sqlite:///{tmp_path / 'data' / 'artsvc.db'}")
    with Session(engine) as session:
        assert session.exec(select(Job)).all() == []
    engine.dispose()
