"""The math environment: one question, one reply, scored by the strict verifier."""

from __future__ import annotations

from typing import Any

import art

from environments.base import BaseEnvironment, Sampling
from environments.math import scenarios as scenario_files
from environments.math.demonstrations import demonstrations
from environments.math.scorer import SCORER_NAME, SCORER_VERSION, score

MAX_TOKENS = 24  # room for the longest sloppy reply, so slips are scored, not cut off


def messages_for(scenario: dict[str, Any]) -> list[dict[str, str]]:
    """The conversation a policy sees: the question alone.

    The strict format is taught by the warm-start demonstrations and enforced by the reward; a
    system prompt would triple the context the small embedded policy pays for on every token.
    """
    return [{"role": "user", "content": scenario["prompt"]}]


class MathEnvironment(BaseEnvironment):
    """Splits and their fingerprints are read from the files in ``scenario_dir`` (the committed
    ``fingerprints.json`` is what a test checks they still are), so a changed answer changes the manifest."""

    name = "math"
    version = "1.0.0"
    scorer_name = SCORER_NAME
    scorer_version = SCORER_VERSION
    scenario_dir = scenario_files.SCENARIO_DIR
    warm_start_examples = 51_200
    tools = ()

    def opening(self, scenario: dict[str, Any]) -> list[dict[str, str]]:
        return messages_for(scenario)

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
