"""A manifest's prompt hash is built once per configuration in a process (every submission asks for it), and still
tells apart the arguments and the data it was measured on; the precision a policy was computed in is locked."""

from __future__ import annotations

import hashlib
from typing import ClassVar

import pytest

from environments import BaseEnvironment, load
from environments.math import MathEnvironment
from service import manifests
from service.spec import JobSpec


class Counted(BaseEnvironment):
    """Openings counted, scenarios from a list the test may change (its fingerprint follows them)."""

    name = "counted"
    scorer_name = "none"
    rows: ClassVar[list[dict[str, str]]] = [{"id": "a", "q": "one"}, {"id": "b", "q": "two"}]
    openings = 0

    def __init__(self, style: str = "plain") -> None:
        self.style = style

    def scenarios(self, split):
        return list(type(self).rows)

    def fingerprints(self):
        digest = hashlib.sha256(repr(type(self).rows).encode()).hexdigest()
        return {split: f"sha256:{digest}" for split in ("train", "val", "test")}

    def opening(self, scenario):
        type(self).openings += 1
        return [{"role": "user", "content": f"{self.style}: {scenario['q']}"}]


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    manifests._prompt_hash_of.cache_clear()
    monkeypatch.setattr(Counted, "openings", 0)
    monkeypatch.setattr(Counted, "rows", list(Counted.rows))


def locked(env: BaseEnvironment, args: dict) -> dict:
    return manifests.measurement(env, environment_args=args, split="val", max_examples=10, temperature=1.0, samples=1,
                                 metric="accuracy")  # fmt: skip


def test_the_openings_are_built_once_per_configuration():
    first = locked(Counted(), {})
    assert Counted.openings == 2
    assert locked(Counted(), {}) == first and Counted.openings == 2  # the second submission reuses the hash
    assert first["prompt_hash"] == manifests.prompt_hash(Counted(), Counted.rows)
    assert first["examples"] == 2


def test_other_arguments_give_their_own_prompt_hash():
    plain, terse = locked(Counted(), {}), locked(Counted(style="terse"), {"style": "terse"})
    assert plain["prompt_hash"] != terse["prompt_hash"]
    assert terse["prompt_hash"] == manifests.prompt_hash(Counted(style="terse"), Counted.rows)


def test_changed_data_is_hashed_again():
    before = locked(Counted(), {})
    Counted.rows.append({"id": "c", "q": "three"})
    after = locked(Counted(), {})
    assert after["prompt_hash"] != before["prompt_hash"] and after["examples"] == 3
    assert after["prompt_hash"] == manifests.prompt_hash(Counted(), Counted.rows)


def test_a_math_level_hashes_its_own_prompts():
    for level in ("carries", "subtraction"):
        spec = JobSpec(environment="math", environment_args={"level": level})
        manifest = manifests.training_manifest(spec, load("math", spec.environment_args))
        env = MathEnvironment(level=level)
        expected = manifests.prompt_hash(env, list(env.scenarios("val"))[: spec.validation.max_examples])
        assert manifest["locked"]["prompt_hash"] == expected


def _trained(precision: str | None, backend: str = "transformers") -> dict:
    """A training job's manifest as the worker records it (an old one, before precisions were: ``None``)."""
    spec = JobSpec(environment="math", model={"backend": backend, "base_model": "SmolLM2-135M-Instruct"})
    return manifests.with_precision(manifests.training_manifest(spec, load("math", {})), precision)


def test_runs_computed_in_other_precisions_are_not_comparable_and_old_ones_read_as_float32():
    bf16, f32, old = _trained("bfloat16"), _trained("float32"), _trained(None)
    assert "precision" not in old["locked"] and bf16["locked"]["precision"] == "bfloat16"
    differs = [{"field": "locked.precision", "baseline": "float32", "candidate": "bfloat16"}]
    assert manifests.differences(f32, bf16) == differs
    assert manifests.differences(old, f32) == []  # written before the field: the CPU's float32 then
    assert manifests.differences(old, bf16) == differs


def test_a_model_the_service_does_not_compute_shares_no_precision():
    baseline = {**_trained(None), "model": {"kind": "litellm", "model": "openai/gpt-4o-mini"}}  # an evaluation's
    assert manifests.differences(baseline, _trained("bfloat16")) == []
    assert manifests.differences(_trained(None, "local"), _trained("float32")) == []
    assert manifests.with_precision(baseline, None) == baseline


def test_a_job_that_names_no_warm_start_gets_the_recommendation_for_its_kind_of_model():
    class Taught(MathEnvironment):
        warm_start_examples, pretrained_warm_start_examples = 5_000, 60

    env = Taught()
    for backend, expected in [("embedded", 5_000), ("transformers", 60), ("local", 0)]:
        named = {"base_model": "Qwen/Qwen2.5-0.5B-Instruct"} if backend == "local" else {}  # required there
        spec = JobSpec(environment="math", model={"backend": backend, **named})
        assert manifests.warm_start_examples(spec, env) == expected, backend
        asked = spec.model_copy(update={"training": spec.training.model_copy(update={"warm_start_examples": 7})})
        assert manifests.warm_start_examples(asked, env) == 7


def test_a_pretrained_models_job_gets_the_environments_settings_where_it_sets_none_and_keeps_its_own():
    class Agentic(MathEnvironment):
        pretrained_job = {"training": {"groups_per_step": 2, "group_size": 4, "learning_rate": 2e-4},
                          "validation": {"max_examples": 50, "every_n_steps": 2, "greedy": False}}  # fmt: skip

    env = Agentic()
    spec = JobSpec.model_validate({"environment": "math", "training": {"group_size": 6}, "validation": {"patience": 5}})
    recommended = manifests.recommended_spec(spec, env)
    assert (recommended.training.groups_per_step, recommended.training.group_size) == (2, 6)  # the job's own kept
    assert recommended.training.learning_rate == 2e-4 and recommended.training.max_steps == spec.training.max_steps
    assert (recommended.validation.max_examples, recommended.validation.every_n_steps) == (50, 2)
    assert recommended.validation.patience == 5 and recommended.seed == spec.seed
    assert recommended.validation.greedy is False and spec.validation.greedy is True
    asked = JobSpec.model_validate({"environment": "math", "validation": {"greedy": True}})
    assert manifests.recommended_spec(asked, env).validation.greedy is True  # asked for, even where it is the default
    embedded = JobSpec.model_validate({"environment": "math", "model": {"backend": "embedded"}})
    assert manifests.recommended_spec(embedded, env) is embedded  # trained from scratch: the spec's defaults

    class Unadvised(MathEnvironment):
        pretrained_job = {}

    assert manifests.recommended_spec(spec, Unadvised()) is spec  # no recommendation: unchanged

    class Wrong(MathEnvironment):
        pretrained_job = {"training": {"group_size": 1}}

    with pytest.raises(ValueError, match="group_size"):
        manifests.recommended_spec(spec.model_copy(update={"training": type(spec.training)()}), Wrong())


def _judged(exact: bool | None) -> dict:
    """A RULER-measured job's manifest as the worker records it with the judge held to exact verdicts or not (an old
    one, before the format was recorded: ``None``)."""
    spec = JobSpec(environment="math", reward={"mode": "ruler", "judge_model": "openai/gpt-4o-mini"})
    manifest = manifests.training_manifest(spec, load("math", {}))
    return manifest if exact is None else manifests.with_verdict_format(manifest, exact=exact)


def test_a_judge_held_to_exact_verdicts_is_another_measurement_and_the_generic_one_reads_as_before():
    exact, generic, old = _judged(True), _judged(False), _judged(None)
    assert exact["judge"]["exact_verdicts"] is True and "exact_verdicts" not in generic["judge"]
    assert [d["field"] for d in manifests.differences(generic, exact)] == ["judge"]
    assert manifests.differences(old, generic) == []
    verifier = manifests.training_manifest(JobSpec(environment="math"), load("math", {}))
    assert manifests.with_verdict_format(verifier, exact=True) == verifier  # no judge: nothing to record
