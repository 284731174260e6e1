"""The Environment protocol: every member declared, BaseEnvironment's defaults, and load refusing a class
whose instances lack members."""

from __future__ import annotations

import pytest

import environments
from environments import BaseEnvironment, Environment, EnvironmentConfigError, load
from environments import base as environments_base
from environments.base import PROTOCOL_MEMBERS
from service import manifests
from service.backends.transformers import models as transformers_models
from service.spec import DEFAULT_BASE_MODEL

OPTIONAL = ("warm_start_examples", "pretrained_warm_start_examples", "pretrained_job", "tools", "embedded_base_model",
            "recommended_base_model", "opening", "demonstrations")  # fmt: skip


class Minimal(BaseEnvironment):
    """Only what BaseEnvironment cannot supply."""

    name = "minimal"
    scorer_name = "none"

    def scenarios(self, split):
        return [{"id": f"{split}-0"}]

    def fingerprints(self):
        return {"train": "sha256:0", "val": "sha256:0", "test": "sha256:0"}

    async def rollout(self, model, scenario, sampling):
        raise NotImplementedError

    def is_correct(self, trajectory):
        return False


class HalfDone:
    """A plugin written against an older interface: no BaseEnvironment, none of the optional members."""

    name, version, scorer_name, scorer_version = "half", "1", "none", "1"

    def scenarios(self, split):
        return []

    def fingerprints(self):
        return {}

    async def rollout(self, model, scenario, sampling):
        raise NotImplementedError

    def is_correct(self, trajectory):
        return False


class EntryPoint:
    def __init__(self, cls):
        self.cls = cls

    def load(self):
        return self.cls


def test_the_protocol_declares_every_member_the_service_reads():
    required = ("name", "version", "scorer_name", "scorer_version", "scenarios", "fingerprints", "rollout", "is_correct")
    assert set(PROTOCOL_MEMBERS) == {*required, *OPTIONAL}


def test_base_environment_supplies_every_optional_member():
    env = Minimal()
    assert isinstance(env, Environment) and all(hasattr(env, member) for member in PROTOCOL_MEMBERS)
    assert (env.warm_start_examples, env.pretrained_warm_start_examples, tuple(env.tools)) == (0, 0, ())
    assert dict(env.pretrained_job) == {}
    assert env.embedded_base_model is None
    assert env.recommended_base_model == "SmolLM2-135M-Instruct" == transformers_models.DEFAULT_BASE_MODEL
    assert env.opening({"id": "x"}) is None and env.demonstrations(seed=0, count=5) == []
    # without openings a manifest's prompt hash is null; the embedded default architecture is recommended
    assert manifests.prompt_hash(env, list(env.scenarios("val"))) is None
    assert manifests.recommended_base_model(env, "embedded") == DEFAULT_BASE_MODEL


@pytest.mark.parametrize("name", ["math", "2048", "email"])
def test_the_built_ins_implement_the_whole_protocol(name):
    env = load(name)
    assert isinstance(env, Environment) and all(hasattr(env, member) for member in PROTOCOL_MEMBERS)
    assert env.recommended_base_model == "SmolLM2-135M-Instruct"
    assert manifests.prompt_hash(env, list(env.scenarios("val"))[:3]).startswith("sha256:")


def test_load_refuses_a_class_whose_instances_lack_members_and_names_them(monkeypatch):
    installed = {"half": EntryPoint(HalfDone), "ok": EntryPoint(Minimal)}
    monkeypatch.setattr(environments_base, "available", lambda: installed)
    with pytest.raises(EnvironmentConfigError) as refused:
        environments.load("half")
    message = str(refused.value)
    assert "environment 'half'" in message and "does not implement the Environment protocol" in message
    assert f"missing {', '.join(OPTIONAL)} (" in message
    assert "BaseEnvironment" in message
    assert isinstance(load("ok"), Minimal)
