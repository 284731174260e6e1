"""Run manifests: what a training job or an evaluation measured with, so that two numbers can be
compared only when they were measured the same way (the Locked Room rule of seeds/001).

A manifest has a ``locked`` section, the fields two runs must share to be comparable (the split and
its fingerprint, the environment and its arguments, the scorer, the prompt, the sampling of the
measurement, the precision the service computed the policy in), and informational sections (the model,
the backend, the judge, the seed, the code, and the runtime the worker trained on).
``differences`` lists the locked fields that differ; ``GET /v1/compare`` rejects on any of them.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Callable
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from environments.base import Environment
from service import __version__
from service.spec import DEFAULT_BASE_MODEL, JobSpec

MANIFEST_VERSION = 1


def sha256_of(value: Any) -> str:
    """sha256 of a JSON-able value in canonical form (sorted keys), or of a string as it is."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=True, default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@cache
def code_version() -> str:
    """The package version, with the git commit (and ``-dirty``) when the code runs from a checkout."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=5, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                               text=True, timeout=5, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return __version__
    return f"{__version__}+g{commit}{'-dirty' if dirty else ''}"


def prompt_hash(env: Environment, rows: list[dict[str, Any]]) -> str | None:
    """Hash of the conversations the measured scenarios open with and the tools offered, so a changed prompt
    shows even where the data did not change; None for an environment that does not expose its openings."""
    openings = [env.opening(row) for row in rows]
    if any(opening is None for opening in openings):
        return None
    return sha256_of({"openings": openings, "tools": list(env.tools)})


@lru_cache(maxsize=256)
def _prompt_hash_of(cls: type, args_json: str, split: str, max_examples: int, fingerprint: str | None) -> str | None:
    """``prompt_hash`` of the first ``max_examples`` of ``split`` of ``cls(**args)``, once per process for each
    configuration: building a hundred prompts costs about a millisecond of the GIL, which every submission of the same
    job repeated while the API's event loop waited. Its data is in the key by fingerprint, so changed data misses."""
    env = cls(**json.loads(args_json))
    return prompt_hash(env, list(env.scenarios(split))[:max_examples])


def measurement(
    env: Environment, *, environment_args: dict[str, Any], split: str, max_examples: int, temperature: float,
    samples: int, metric: str,
) -> dict[str, Any]:  # fmt: skip
    """The locked section: how a number was measured, field by field; ``env`` is the environment built with
    ``environment_args``."""
    args_json, fingerprint = json.dumps(environment_args, sort_keys=True), env.fingerprints().get(split)
    return {
        "environment": env.name,
        "environment_version": env.version,
        "scorer": env.scorer_name,
        "scorer_version": env.scorer_version,
        "split": split,
        "split_fingerprint": None,  # filled by build(), with every split's fingerprint
        "examples": min(len(env.scenarios(split)), max_examples),
        "prompt_hash": _prompt_hash_of(type(env), args_json, split, max_examples, fingerprint),
        "temperature": temperature,
        "samples_per_example": samples,
        "metric": metric,
    }


def build(*, kind: str, env: Environment, environment_args: dict[str, Any], locked: dict[str, Any],
          model: dict[str, Any], seed: int, judge: dict[str, Any] | None = None,
          sampling: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """A whole manifest; ``locked`` comes from :func:`measurement`."""
    fingerprints = env.fingerprints()
    return {
        "manifest_version": MANIFEST_VERSION,
        "kind": kind,
        "locked": {**locked, "split_fingerprint": fingerprints.get(locked["split"]),
                   "environment_args": dict(sorted(environment_args.items()))},  # fmt: skip
        "fingerprints": fingerprints,
        "model": model,
        "judge": judge,
        "sampling": sampling or {},
        "seed": seed,
        "code_version": code_version(),
    }


def refreshed(stored: dict[str, Any] | None, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The manifest a job was submitted with, as the process that runs it keeps it. The same code computes the same
    manifest from the stored spec, so it is kept as stored; other code (a worker deployed apart from the API) may
    load other environments and scorers, and what runs is what counts: ``make()``, as for a job stored without one."""
    if stored is not None and stored.get("code_version") == code_version():
        return stored
    return make()


def runtime() -> dict[str, Any]:
    """What decides a run's exact numbers besides its spec and seed: the libraries, torch's intra-op thread count
    (it splits the sums of every matrix product) and the CPU instructions its kernels use. The same runtime gives
    the same numbers to the last bit; another rounds differently, and the curve drifts (README, Results)."""
    import os
    import platform

    import peft
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
    }


def judge_section(model: str | None, rubric: str | None, mode: str) -> dict[str, Any] | None:
    if model is None:
        return None
    return {"mode": mode, "model": model, "rubric_hash": None if rubric is None else sha256_of(rubric)}


def with_precision(manifest: dict[str, Any], precision: str | None) -> dict[str, Any]:
    """``manifest`` with the dtype its policy is computed in locked (``bfloat16``, ``float32``): the worker that samples
    the measured model knows it, not the API that built the manifest. None (a model this process does not compute)
    leaves it as it is."""
    if precision is None:
        return manifest
    return {**manifest, "locked": {**manifest.get("locked", {}), "precision": precision}}


def with_verdict_format(manifest: dict[str, Any], *, exact: bool) -> dict[str, Any]:
    """``manifest`` with its judge's verdict format, which the worker's settings decide (``judge_exact_verdicts``): a
    judge held to the exact schema of a usable verdict scores otherwise than one asked for RULER's generic JSON, so
    two such measurements are not compared. Recorded only where exact, so a generic-format manifest reads as those
    written before the format was recorded."""
    judge = manifest.get("judge")
    if not exact or not isinstance(judge, dict):
        return manifest
    return {**manifest, "judge": {**judge, "exact_verdicts": True}}


def _precision(manifest: dict[str, Any]) -> str | None:
    """The locked precision; for a transformers-backend manifest written before it was recorded, float32 (the CPU's
    only precision then; a CUDA run was bfloat16 and is refused against float32 ones, the safe side)."""
    locked = manifest.get("locked", {})
    if "precision" in locked:
        return locked["precision"]
    model = manifest.get("model") if isinstance(manifest.get("model"), dict) else {}
    return "float32" if model.get("backend") == "transformers" else None


def differences(baseline: dict[str, Any], candidate: dict[str, Any]) -> list[dict[str, Any]]:
    """Every locked field whose value differs, named ``locked.<field>``; a ruler-scored measurement also
    locks the judge (its number is the judge's opinion). The precision is compared where both sides were computed by
    this service (an API model, a baseline, has none to share)."""
    fields: list[tuple[str, Any, Any]] = []
    left, right = ({k: v for k, v in m.get("locked", {}).items() if k != "precision"} for m in (baseline, candidate))
    precisions = _precision(baseline), _precision(candidate)
    if None not in precisions:
        left["precision"], right["precision"] = precisions
    fields += [(f"locked.{key}", left.get(key), right.get(key)) for key in sorted(set(left) | set(right))]
    if "ruler_reward" in (left.get("metric"), right.get("metric")):
        fields.append(("judge", baseline.get("judge"), candidate.get("judge")))
    if baseline.get("manifest_version") != candidate.get("manifest_version"):
        fields.append(("manifest_version", baseline.get("manifest_version"), candidate.get("manifest_version")))
    return [{"field": name, "baseline": a, "candidate": b} for name, a, b in fields if a != b]


def base_model_for(spec: JobSpec, env: Environment) -> str:
    """The job's base model, or the embedded architecture the environment recommends."""
    if spec.model.base_model is not None:
        return spec.model.base_model
    recommended = recommended_base_model(env, spec.model.backend)
    assert recommended is not None, "JobSpec requires base_model for the local and serverless backends"
    return recommended


def recommended_base_model(env: Environment, backend: str) -> str | None:
    """The base model a job on ``env`` and ``backend`` gets when it names none: the embedded architecture whose
    context holds its conversations, or the pretrained LM it recommends; none for ART's GPU and serverless
    backends (the job must name one)."""
    if backend == "embedded":
        return env.embedded_base_model or DEFAULT_BASE_MODEL
    return env.recommended_base_model if backend == "transformers" else None


def recommended_spec(spec: JobSpec, env: Environment) -> JobSpec:
    """``spec`` with the environment's ``pretrained_job`` settings in each training and validation field the submitter
    left unset, for a job on the transformers backend (others train from scratch or on a GPU: the spec's defaults).
    ValueError where the environment recommends what JobSpec refuses."""
    recommended = env.pretrained_job if spec.model.backend == "transformers" else {}
    data, changed = spec.model_dump(exclude_unset=True), False
    for section in ("training", "validation"):
        given = getattr(spec, section).model_fields_set
        if unset := {name: value for name, value in recommended.get(section, {}).items() if name not in given}:
            data[section], changed = {**unset, **data.get(section, {})}, True
    return JobSpec.model_validate(data) if changed else spec


def warm_start_examples(spec: JobSpec, env: Environment) -> int:
    """Demonstrations the job's warm start uses: the job's number, else the environment's for a policy trained from
    scratch (the embedded backend) or for a pretrained model (the transformers backend); ART's GPU and serverless
    backends get none unless the job asks."""
    if spec.training.warm_start_examples is not None:
        return spec.training.warm_start_examples
    recommended = {"embedded": env.warm_start_examples, "transformers": env.pretrained_warm_start_examples}
    return recommended.get(spec.model.backend, 0)


def training_manifest(spec: JobSpec, env: Environment) -> dict[str, Any]:
    """A training job's manifest: its validation is the measurement (RULER's reward in ruler mode)."""
    v, t = spec.validation, spec.training
    metric = "ruler_reward" if spec.reward.mode == "ruler" else "accuracy"
    locked = measurement(env, environment_args=spec.environment_args, split="val", max_examples=v.max_examples,
                         temperature=v.temperature, samples=1, metric=metric)  # fmt: skip
    model = {"kind": "training", "name": spec.model.name, "backend": spec.model.backend, "base_model": base_model_for(spec, env)}
    sampling = {"train_temperature": t.temperature, "group_size": t.group_size, "groups_per_step": t.groups_per_step,
                "learning_rate": t.learning_rate, "kl_penalty_coef": t.kl_penalty_coef,
                "warm_start_examples": warm_start_examples(spec, env)}  # fmt: skip
    return build(kind="training", env=env, environment_args=spec.environment_args, locked=locked, model=model,
                 seed=spec.seed, judge=judge_section(spec.reward.judge_model, spec.reward.rubric, spec.reward.mode),
                 sampling=sampling)  # fmt: skip
