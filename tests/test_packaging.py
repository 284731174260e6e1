"""A regular install, not an editable one, carries every file the code reads beside its modules: each
environment's splits, the Alembic migrations and the judges' prompts (package data in pyproject.toml).

The project is installed into a folder and run from outside the checkout by a Python that sees only that folder
and the dependencies (``-S``: not the editable install's path hook)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from service.store import db as store_db

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "service", "environments", "judges")

# Run by the installed code: every split of every environment (each math level's too) and every prompt.
LOAD = """
import sys
from pathlib import Path

import environments, judges, service
from environments.math.scenarios import LEVELS

site = Path(sys.argv[1])
for package in (environments, judges, service):
    assert Path(package.__file__).is_relative_to(site), f"{package.__name__} is imported from {package.__file__}"
loaded = [environments.load("math", {"level": level}) for level in LEVELS]
loaded += [environments.load("2048"), environments.load("email")]
for env in loaded:
    for split in environments.SPLITS:
        assert len(env.scenarios(split)) > 0, (env.name, split)
    assert all(value.startswith("sha256:") for value in env.fingerprints().values())
import judges.graders.score_model  # the prompts are read when their modules are imported
import judges.ruler
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The folder pip installed the project into (built from a copy, so the build leaves the tree clean)."""
    work = tmp_path_factory.mktemp("install")
    (work / "src").mkdir()
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, work / "src" / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, work / "src" / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-compile",
         "--target", str(work / "site"), str(work / "src")],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return work / "site"


def installed(site: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -S *args`` from an empty folder, with only the install and the dependencies on the path."""
    dependencies = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    env = {name: value for name, value in os.environ.items() if not name.startswith(("ARTSVC_", "PYTHON"))}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *sorted(dependencies)])
    env["ARTSVC_DATA_DIR"] = str(tmp_path / "data")
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    return subprocess.run([sys.executable, "-S", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_an_installed_copy_loads_every_split_and_prompt(site, tmp_path):
    result = installed(site, tmp_path, "-c", LOAD, str(site))
    assert result.returncode == 0, result.stderr[-3000:]


def test_an_installed_copy_migrates_a_fresh_database(site, tmp_path):
    result = installed(site, tmp_path, "-m", "service", "db", "upgrade")
    assert result.returncode == 0, result.stderr[-3000:]
    engine = store_db.make_engine(f"sqlite:///{tmp_path / 'data' / 'artsvc.db'}")
    try:
        store_db.check_migrated(engine)  # at the checkout's newest revision
    finally:
        engine.dispose()
