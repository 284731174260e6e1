"""docker-compose.yml stays valid Compose (checked offline by Debian's docker-compose, when installed)
and every container runs an ``artsvc`` verb that exists."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
SERVICES = {"postgres", "migrate", "api", "worker"}


def compose_config(*args: str, **env: str) -> subprocess.CompletedProcess:
    """``docker-compose config`` with only ``env`` of the variables the file reads."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("ARTSVC_", "POSTGRES_", "PIP_"))}
    return subprocess.run(
        ["docker-compose", "-f", str(COMPOSE_FILE), "config", *args],
        capture_output=True, text=True, timeout=60, env={**inherited, **env},
    )  # fmt: skip


def artsvc_commands() -> dict[str, list[str]]:
    services = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    return {name: service["command"] for name, service in services.items() if name != "postgres"}


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="apt-get install -y docker-compose")
def test_compose_file_validates_with_postgres_api_and_scalable_workers():
    services = compose_config("--services")
    assert services.returncode == 0, services.stderr
    assert set(services.stdout.split()) == SERVICES

    resolved = yaml.safe_load(compose_config(ARTSVC_WORKERS="5").stdout)["services"]
    assert resolved["worker"]["deploy"]["replicas"] == 5
    assert resolved["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert resolved["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert {"target": 8000, "published": 8000} in [
        {key: port[key] for key in ("target", "published")} for port in resolved["api"]["ports"]
    ]
    for name in ("migrate", "api", "worker"):  # one database and one data folder, so workers can take over jobs
        assert resolved[name]["environment"]["ARTSVC_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert resolved[name]["environment"]["ARTSVC_DATA_DIR"] == "/data"
        assert "artsvc-data:/data:rw" in resolved[name]["volumes"]


def test_compose_runs_the_api_without_its_in_process_worker():
    commands = artsvc_commands()
    assert set(commands) == SERVICES - {"postgres"}
    assert commands["api"][:2] == ["artsvc", "serve"] and "--no-worker" in commands["api"]
    assert commands["worker"] == ["artsvc", "worker"]
    assert commands["migrate"] == ["artsvc", "db", "upgrade"]


@pytest.mark.parametrize("service", sorted(SERVICES - {"postgres"}))
def test_each_container_command_is_an_artsvc_verb(service):
    program, *args = artsvc_commands()[service]
    assert program == "artsvc"
    verb = args[:2] if args[0] == "db" else args[:1]
    argv = [sys.executable, "-m", "service", *verb, "--help"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for option in (arg.split("=")[0] for arg in args if arg.startswith("--")):
        assert option in result.stdout, f"`artsvc {' '.join(verb)}` has no option {option}"
