"""The math environment: one question, one reply, scored by the strict verifier."""

from __future__ import annotations

from collections.abc import Iterator
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from environments.base import BaseEnvironment, Sampling, new_trajectory
from environments.math.demonstrations import demonstrations
from environments.math.scenarios import DEFAULT_LEVEL, SCENARIO_DIR, level_named
from environments.math.scorer import SCORER_NAME, SCORER_VERSION, score
from environments.prompts import few_shot, system

if TYPE_CHECKING:  # annotations only: ART is imported at the first trajectory (environments.base.new_trajectory)
    import art

MAX_TOKENS = 24  # room for the longest sloppy reply, so slips are scored, not cut off

# The strict scorer's contract (environments/math/scorer.py), in words.
SYSTEM_PROMPT = (
    "Answer the math problem. Your whole reply must be one line: Final: N\n"
    "N is the integer answer in digits: a leading - if negative, no leading zeros, no other text."
)
# Two worked examples per level, none of them a val or test problem of its level (a test checks).
FEW_SHOT = {
    "carry_free": (("What is 23 + 14?", "Final: 37"), ("How many cards in all? Mia has 52, Raj has 6.", "Final: 58")),
    "carries": (("What is 47 + 38?", "Final: 85"), ("How many coins in all? Ben has 65, Ana has 57.", "Final: 122")),
    "subtraction": (("What is 53 - 17?", "Final: 36"), ("Compute 18 - 63.", "Final: -45")),
    "multiplication": (
        ("What is 15 * 6?", "Final: 90"),
        ("Kim has 9 bags of 12 shells. How many shells in all?", "Final: 108"),
    ),
    "word_problems": (
        ("Ana has 12 apples, buys 5 more and gives away 3. How many apples does Ana have now?", "Final: 14"),
        ("Lou has 9 cards. Mia has 4 more. How many cards do they have together?", "Final: 22"),
    ),
}


def messages_for(scenario: dict[str, Any], level: str = DEFAULT_LEVEL) -> list[dict[str, str]]:
    """The conversation a policy sees: the contract, two worked examples of ``level``, the question.

    The embedded character policy skips the system prompt and the example turns (its tokenizer
    drops them): it learns the format from the warm-start demonstrations and the reward.
    """
    return [system(SYSTEM_PROMPT), *few_shot(FEW_SHOT[level]), {"role": "user", "content": scenario["prompt"]}]


class MathEnvironment(BaseEnvironment):
    """Integer problems of one difficulty ``level`` (see :data:`~environments.math.scenarios.LEVELS`),
    answered ``Final: <int>``. Each level has its own splits; their fingerprints are read from the files
    (the committed ``fingerprints.json`` is what a test checks they still are), so the level and any
    changed answer show in run manifests. An unknown level is a ValueError naming the levels."""

    name = "math"
    version = "1.1.0"
    scorer_name = SCORER_NAME
    scorer_version = SCORER_VERSION
    scenario_dir = SCENARIO_DIR  # every level's splits are in its folder under this one
    warm_start_examples = 51_200
    # A pretrained model's job (the main job): at 1e-4 SmolLM2 still rose at 60 steps, past the plateau rule's reach
    # on 100 problems; at 2e-4 it passed 0.6 in 24-32 steps over 4 seeds, and a job stops there, not at a step cap
    # (README Results, issue 31). The plateau rule and 60 steps bound a level it cannot reach 0.6 on.
    pretrained_job = MappingProxyType({
        "training": MappingProxyType({"learning_rate": 2e-4, "max_steps": 60}),
        "validation": MappingProxyType({"target_accuracy": 0.6}),
    })  # fmt: skip
    tools = ()

    def __init__(self, *, level: str = DEFAULT_LEVEL) -> None:
        self.level = level_named(level).name
        self.scenario_dir = type(self).scenario_dir / level_named(level).folder

    def opening(self, scenario: dict[str, Any]) -> list[dict[str, str]]:
        return messages_for(scenario, self.level)

    async def rollout(self, model: art.Model, scenario: dict[str, Any], sampling: Sampling) -> art.Trajectory:
        messages = self.opening(scenario)
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
        return new_trajectory(
            messages_and_choices=[*messages, choice],
            reward=result["reward"],
            metrics={"correct": outcome == "correct", "completion_length": len(completion)},
            metadata={"scenario_id": scenario["id"], "outcome": outcome, "level": self.level,
                      "scorer_version": SCORER_VERSION},  # fmt: skip
        )

    def is_correct(self, trajectory: art.Trajectory) -> bool:
        return trajectory.metadata.get("outcome") == "correct"

    def demonstrations(self, *, seed: int, count: int) -> Iterator[art.Trajectory]:
        return (
            new_trajectory(messages_and_choices=[*self.opening(row), {"role": "assistant", "content": reply}])
            for row, reply in demonstrations(list(self.scenarios("train")), seed=seed, count=count)
        )
