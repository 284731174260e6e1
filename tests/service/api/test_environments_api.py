"""GET /v1/environments: every installed environment with its versions, split sizes and fingerprints; a plugin
that fails to load is listed with its error, and each is loaded once a process."""

from __future__ import annotations

import pytest

import environments
from service.api.routes import environments as environments_route
from tests.databases import sqlite_only
from tests.service.api import seeding

pytestmark = sqlite_only  # the catalog of environments: nothing here depends on the database

BROKEN_PLUGIN = """
from pathlib import Path
with Path(__file__).with_name("imports.log").open("a") as log:
    log.write("imported\\n")
raise RuntimeError("needs a GPU this machine does not have")
"""


@pytest.fixture
def fresh_catalog():
    environments_route.catalog.cache_clear()
    environments.available.cache_clear()  # a plugin the test installs is seen, as after a restart
    yield
    environments_route.catalog.cache_clear()
    environments.available.cache_clear()


@pytest.fixture
def broken_plugin(tmp_path, monkeypatch, fresh_catalog):
    """A real installed distribution whose environment raises on import: a dist-info folder on sys.path."""
    dist_info = tmp_path / "broken_env-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-env\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[artsvc.environments]\nbroken = broken_env_plugin:Environment\n")
    (tmp_path / "broken_env_plugin.py").write_text(BROKEN_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "imports.log"


def test_the_math_environment_with_its_splits(client, engine, fresh_catalog):
    _, headers = seeding.principal(engine)
    response = client.get("/v1/environments", headers=headers)
    assert response.status_code == 200, response.text
    listed = {entry["name"]: entry for entry in response.json()}
    math = environments.load("math")
    expected_splits = {split: {"size": len(math.scenarios(split)), "fingerprint": fingerprint}
                       for split, fingerprint in math.fingerprints().items()}  # fmt: skip
    assert listed["math"] == {
        "name": "math", "version": math.version, "scorer_name": math.scorer_name, "scorer_version": math.scorer_version,
        "splits": expected_splits, "data_fingerprints": {}, "arguments": {"level": "carry_free"}, "tools": [], "warm_start_examples": math.warm_start_examples,
        "pretrained_warm_start_examples": 0, "error": None,
        "pretrained_job": {"training": {"learning_rate": 2e-4, "max_steps": 60}, "validation": {"target_accuracy": 0.6}},
    }  # fmt: skip
    assert listed["2048"]["pretrained_job"] == {section: dict(fields) for section, fields
                                                in environments.load("2048").pretrained_job.items()}  # fmt: skip
    assert listed["2048"]["pretrained_job"]["training"]["group_size"] == 8
    assert listed["email"]["pretrained_job"]["validation"] == {"max_examples": 50, "every_n_steps": 4, "greedy": False}
    assert listed["2048"]["arguments"] == {"target_tile": 16, "max_turns": None}
    assert listed["email"]["tools"] == ["search_inbox", "read_email", "return_final_answer"]
    assert listed["email"]["pretrained_warm_start_examples"] == 150
    assert listed["email"]["data_fingerprints"]["corpus"].startswith("sha256:")
    assert {"train", "val"} <= set(expected_splits) and all(split["size"] > 0 for split in expected_splits.values())
    assert client.get("/v1/environments").status_code == 401


def test_a_plugin_that_fails_to_load_is_listed_with_its_error_once(client, engine, broken_plugin):
    _, headers = seeding.principal(engine)
    for _ in range(2):
        response = client.get("/v1/environments", headers=headers)
        assert response.status_code == 200, response.text
        listed = {entry["name"]: entry for entry in response.json()}
        assert listed["broken"]["error"] == "failed to load: RuntimeError: needs a GPU this machine does not have"
        assert listed["broken"]["splits"] == {} and listed["broken"]["version"] is None
        assert listed["math"]["error"] is None and listed["math"]["splits"]
    assert broken_plugin.read_text() == "imported\n"  # loaded once a process, not once a request
