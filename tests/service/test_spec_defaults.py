"""The JobSpec names the backends' default base models without importing torch; they must agree with the backends,
and the modules a client-side command or the API loads must stay free of torch and ART (seconds at start-up)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import environments
from service.backends.embedded.policy import DEFAULT_BASE_MODEL, PRESETS
from service.backends.transformers import models
from service.spec import DEFAULT_BASE_MODEL as SPEC_DEFAULT
from service.spec import DEFAULT_PRETRAINED_MODEL, JobSpec


def test_the_spec_default_base_models_are_the_backends_defaults():
    assert SPEC_DEFAULT == DEFAULT_BASE_MODEL in PRESETS
    assert DEFAULT_PRETRAINED_MODEL == models.DEFAULT_BASE_MODEL
    spec = JobSpec(environment="math")
    assert spec.model.base_model is None and spec.model.backend == "transformers"  # resolved when the job runs


def test_an_unset_base_model_is_the_environments_recommendation_for_the_backend():
    from service.manifests import base_model_for

    email, math = environments.load("email"), environments.load("math")
    assert email.embedded_base_model in PRESETS
    assert base_model_for(JobSpec(environment="email"), email) == DEFAULT_PRETRAINED_MODEL == math.recommended_base_model
    embedded = {"backend": "embedded"}
    assert base_model_for(JobSpec(environment="email", model=embedded), email) == email.embedded_base_model
    assert base_model_for(JobSpec(environment="math", model=embedded), math) == DEFAULT_BASE_MODEL
    chosen = JobSpec(environment="email", model={"base_model": "embedded/char-gpt-0.2m"})
    assert chosen.model.backend == "embedded"  # an embedded architecture named alone trains on the embedded backend
    assert base_model_for(chosen, email) == "embedded/char-gpt-0.2m"


@pytest.mark.parametrize(
    "model",
    [{"backend": "transformers", "base_model": "embedded/char-gpt-0.2m"}, {"backend": "embedded", "base_model": "SmolLM2-135M-Instruct"}],
)
def test_a_base_model_of_the_other_backend_is_refused(model):
    with pytest.raises(ValueError, match="embedded architecture"):
        JobSpec(environment="math", model=model)


@pytest.mark.parametrize("module", ["service.cli", "service.spec", "service.app"])
def test_importing_the_cli_spec_or_api_loads_neither_torch_nor_art(module):
    probe = f"import sys, json, {module}; print(json.dumps([m for m in ('torch', 'art') if m in sys.modules]))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == []
