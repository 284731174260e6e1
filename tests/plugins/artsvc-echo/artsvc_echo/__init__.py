"""Echo: the policy must repeat a short word. The smallest complete artsvc environment."""

from __future__ import annotations

import hashlib
import json
import random
import string
from functools import cache
from typing import TYPE_CHECKING

from environments import BaseEnvironment, Sampling, new_trajectory
from environments.chat import complete
from environments.prompts import few_shot, system

if TYPE_CHECKING:  # annotations only: ART is imported at the first trajectory
    import art

SPLIT_SIZES = {"train": 2000, "val": 40, "test": 40}
SCORER_VERSION = "1.0.0"
SYSTEM_PROMPT = "Repeat the word at the end of the message exactly, and write nothing else."


@cache
def _splits() -> dict[str, list[dict]]:
    """Distinct random words, dealt into disjoint splits; the same on every machine."""
    rng = random.Random(7)
    words = sorted({"".join(rng.choices(string.ascii_lowercase, k=3)) for _ in range(4000)})
    rng.shuffle(words)
    splits, start = {}, 0
    for split, size in SPLIT_SIZES.items():
        chosen = words[start : start + size]
        splits[split] = [{"id": f"echo-{split}-{i}", "word": w} for i, w in enumerate(chosen)]
        start += size
    return splits


def score(scenario: dict, reply: object) -> tuple[float, str]:
    """1.0 for exactly the word, 0.5 for the word with stray spaces, else 0. Never raises."""
    if not isinstance(reply, str):
        return 0.0, "no_reply"
    if reply == scenario["word"]:
        return 1.0, "correct"
    return (0.5, "whitespace") if reply.strip() == scenario["word"] else (0.0, "wrong")


class EchoEnvironment(BaseEnvironment):
    name = "echo"
    version = "1.0.0"
    scorer_name = "echo-exact"
    scorer_version = SCORER_VERSION
    warm_start_examples = 256

    def __init__(self, *, prefix: str = "say: ") -> None:
        if len(prefix) > 20:
            raise ValueError("prefix must be at most 20 characters")
        self.prefix = prefix

    def scenarios(self, split: str) -> list[dict]:
        if split not in SPLIT_SIZES:
            raise ValueError(f"echo has no split {split!r}")
        return _splits()[split]

    def fingerprints(self) -> dict[str, str]:
        return {s: "sha256:" + hashlib.sha256(json.dumps(rows).encode()).hexdigest() for s, rows in _splits().items()}

    def opening(self, scenario: dict) -> list[dict]:
        """The contract, one example turn (for a pretrained LLM; the embedded policy skips both), the task."""
        example = few_shot([(self.prefix + "blue", "blue")])  # four letters: never a scenario's word
        return [system(SYSTEM_PROMPT), *example, {"role": "user", "content": self.prefix + scenario["word"]}]

    async def rollout(self, model: art.Model, scenario: dict, sampling: Sampling) -> art.Trajectory:
        messages = self.opening(scenario)
        choice = await complete(model, messages, sampling, max_tokens=8)
        reward, outcome = score(scenario, choice.message.content)
        return new_trajectory(
            messages_and_choices=[*messages, choice],
            reward=reward,
            metrics={"correct": outcome == "correct"},
            metadata={"scenario_id": scenario["id"], "outcome": outcome, "scorer_version": SCORER_VERSION},
        )

    def is_correct(self, trajectory: art.Trajectory) -> bool:
        return trajectory.metadata.get("outcome") == "correct"

    def demonstrations(self, *, seed: int, count: int) -> list[art.Trajectory]:
        rng = random.Random(seed)
        rows = [rng.choice(self.scenarios("train")) for _ in range(count)]
        return [
            new_trajectory(messages_and_choices=[*self.opening(row), {"role": "assistant", "content": row["word"]}])
            for row in rows
        ]
