"""The math environment: one question, one reply, scored by the strict verifier."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import art

from environments.base import Sampling
from environments.math import scenarios as scenario_files
from environments.math.demonstrations import demonstrations
from environments.math.scorer import SCORER_NAME, SCORER_VERSION, score

MAX_TOKENS = 24  # room for the longest sloppy reply, so slips are scored, not cut off


@cache
def _load_split(split: str) -> tuple[dict[str, Any], ...]:
    path = scenario_files.SCENARIO_DIR / f"{split}.jsonl"
    if not path.exists():
        raise ValueError(f"math has no split {split!r} (expected {path})")
    return tuple(json.loads(line) for line in path.read_text().splitlines())


def messages_for(scenario: dict[str, Any]) -> list[dict[str, str]]:
    """The conversation a policy sees: the question alone.

    The strict format is taught by the warm-start demonstrations and enforced by the reward; a
    system prompt would triple the context the small embedded policy pays for on every token.
    """
    return [{"role": "user", "content": scenario["prompt"]}]


class MathEnvironment:
    name = "math"
    version = "1.0.0"
    scorer_name = SCORER_NAME
    scorer_version = SCORER_VERSION
    warm_start_examples = 51_200
    tools = ()

    def scenarios(self, split: str) -> tuple[dict[str, Any], ...]:
        return _load_split(split)

    def fingerprints(self) -> dict[str, str]:
        return json.loads((scenario_files.SCENARIO_DIR / "fingerprints.json").read_text())

    async def rollout(self, model: art.Model, scenario: dict[str, Any], sampling: Sampling) -> art.Trajectory:
        messages = messages_for(scenario)
        response = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(),
            messages=messages,
            max_tokens=sampling.max_tokens or MAX_TOKENS,
            temperature=sampling.temperature,
            seed=sampling.seed,
            logprobs=True,
        )
        choice = response.choices[0]
        completion = choice.message.content or ""
        result = score(scenario, completion)
        outcome = result["details"]["outcome"]
        return art.Trajectory(
            messages_and_choices=[*messages, choice],
            reward=result["reward"],
            metrics={"correct": outcome == "correct", "completion_length": len(completion)},
            metadata={"scenario_id": scenario["id"], "outcome": outcome, "scorer_version": SCORER_VERSION},
        )

    def is_correct(self, trajectory: art.Trajectory) -> bool:
        return trajectory.metadata.get("outcome") == "correct"

    def demonstrations(self, *, seed: int, count: int) -> list[art.Trajectory]:
        return [
            art.Trajectory(messages_and_choices=[*messages_for(row), {"role": "assistant", "content": reply}])
            for row, reply in demonstrations(list(self.scenarios("train")), seed=seed, count=count)
        ]
