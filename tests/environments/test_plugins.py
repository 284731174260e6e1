"""Third-party environments are found the way built-ins are: through the entry-point group.

The test builds and installs the tiny plugin package in tests/plugins/artsvc-echo (it has its
own pyproject) into a folder on the path of fresh processes, then lists it and trains on it
with the real CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import environments

PLUGIN_SOURCE = Path(__file__).resolve().parents[1] / "plugins" / "artsvc-echo"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    """Where pip installed the plugin (built from a copy, so the build leaves the tree clean)."""
    work = tmp_path_factory.mktemp("plugin")
    shutil.copytree(PLUGIN_SOURCE, work / "src")
    target = work / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target), str(work / "src")],
        check=True,
        capture_output=True,
    )
    return target


def _artsvc(*args: str, plugin_path: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(plugin_path), "ARTSVC_DATA_DIR": str(tmp_path / "data")}
    return subprocess.run([sys.executable, "-m", "service", *args], capture_output=True, text=True, env=env, timeout=600)


def test_an_installed_plugin_is_listed_with_its_splits_and_arguments(plugin_path, tmp_path):
    assert "echo" not in environments.available()  # only the install makes it visible
    result = _artsvc("environments", "--json", plugin_path=plugin_path, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    listed = {row["name"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert {"math", "2048", "email", "echo"} <= set(listed)
    assert listed["echo"]["splits"] == {"train": 2000, "val": 40, "test": 40}
    assert listed["echo"]["arguments"] == {"prefix": "say: "}


def test_an_installed_plugin_trains_through_the_same_loop_and_store(plugin_path, tmp_path):
    result = _artsvc(
        "train", "--env", "echo", "--env-arg", "prefix=repeat: ", "--max-steps", "2", "--every-n-steps", "1",
        "--val-examples", "8", "--groups-per-step", "2", "--group-size", "4", "--json",
        "--base-model", "embedded/char-gpt-0.8m",  # the loop and store are what is tested: the fast fixture policy
        plugin_path=plugin_path, tmp_path=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.splitlines()[-1])
    assert summary["environment"] == "echo" and summary["status"] == "succeeded"
    assert summary["step"] == 2 and summary["stop_reason"] == "max_steps"
    assert summary["step0_val_accuracy"] is not None


def test_bad_plugin_arguments_are_refused_before_training(plugin_path, tmp_path):
    result = _artsvc("train", "--env", "echo", "--env-arg", "colour=red", plugin_path=plugin_path, tmp_path=tmp_path)
    assert result.returncode == 2
    assert "takes prefix; got unknown colour" in result.stderr
    result = _artsvc("train", "--env", "echo", "--env-arg", "prefix=" + "x" * 30, plugin_path=plugin_path, tmp_path=tmp_path)
    assert result.returncode == 2 and "prefix must be at most 20 characters" in result.stderr
