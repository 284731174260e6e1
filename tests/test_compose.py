"""docker-compose.yml stays valid Compose (checked offline by Debian's docker-compose, when installed)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="apt-get install -y docker-compose to check the file")
def test_compose_file_validates():
    result = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config", "--services"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert set(result.stdout.split()) == {"postgres", "migrate", "trainer"}
