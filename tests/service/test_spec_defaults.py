"""The JobSpec names the embedded backend's default architecture without importing torch; the two must agree,
and the modules a client-side command or the API loads must stay free of torch and ART (seconds at start-up)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import environments
from service.backends.embedded.policy import DEFAULT_BASE_MODEL, PRESETS
from service.spec import DEFAULT_BASE_MODEL as SPEC_DEFAULT
from service.spec import JobSpec


def test_the_spec_default_base_model_is_the_policys_default():
    assert SPEC_DEFAULT == DEFAULT_BASE_MODEL in PRESETS
    assert JobSpec(environment="math").model.base_model is None  # resolved per environment when the job runs


def test_an_unset_base_model_is_the_environments_recommendation_or_the_default():
    from service.manifests import base_model_for

    email, math = environments.load("email"), environments.load("math")
    assert email.embedded_base_model in PRESETS
    assert base_model_for(JobSpec(environment="email"), email) == email.embedded_base_model
    assert base_model_for(JobSpec(environment="math"), math) == DEFAULT_BASE_MODEL
    chosen = JobSpec(environment="email", model={"base_model": "embedded/char-gpt-0.2m"})
    assert base_model_for(chosen, email) == "embedded/char-gpt-0.2m"


@pytest.mark.parametrize("module", ["service.cli", "service.spec", "service.api.app"])
def test_importing_the_cli_spec_or_api_loads_neither_torch_nor_art(module):
    probe = f"import sys, json, {module}; print(json.dumps([m for m in ('torch', 'art') if m in sys.modules]))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == []
