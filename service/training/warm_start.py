"""The supervised warm start a job's policy gets once, on its environment's demonstrations, before any RL step."""

from __future__ import annotations

import time
from collections.abc import Sequence

import art
from openai.types.chat.chat_completion import Choice

from environments.prompts import is_example
from service import manifests
from service.training.run import Run
from service.training.schedule import cosine_schedule

WARM_START_STATE_KEY = "artsvc_warm_start"
WARM_START_TURNS_PER_BATCH = 64


def warm_start_batch_size(demos: Sequence[art.Trajectory]) -> int:
    """Demonstrations per optimizer step, so that each step sees about WARM_START_TURNS_PER_BATCH replies.

    A math demonstration is one reply and a 2048 game about fifty: batching whole trajectories
    by a fixed count would give a game-playing warm start fifty times fewer optimizer steps.
    Few-shot example turns of the opening are not replies.
    """
    turns = sum(
        isinstance(item, Choice) or (isinstance(item, dict) and item.get("role") == "assistant")
        for demo in demos
        for item in demo.messages_and_choices
        if not (isinstance(item, dict) and is_example(item))
    )
    return max(1, round(WARM_START_TURNS_PER_BATCH * len(demos) / max(1, turns)))


async def warm_start(run: Run) -> None:
    """Supervised warm start on the environment's demonstrations, once per model (its state remembers it)."""
    count = manifests.warm_start_examples(run.spec, run.env)
    if (run.model.read_state() or {}).get(WARM_START_STATE_KEY) or count == 0:
        return
    demos = run.env.demonstrations(seed=run.spec.seed, count=count)
    if not demos:
        return
    batch_size = warm_start_batch_size(demos)
    batches = -(-len(demos) // batch_size)
    config = art.TrainSFTConfig(
        learning_rate=cosine_schedule(run.spec.training.warm_start_learning_rate, batches), batch_size=batch_size
    )
    started = time.monotonic()
    done = 0
    async for metrics in run.backend._train_sft(run.model, demos, config, {}, False):
        done = batches if metrics.get("cache_hit") else done + 1
        run.on_event("warm_start", {"batch": done, "batches": batches, "loss": metrics.get("loss")})
    run.model.merge_state({WARM_START_STATE_KEY: {"examples": len(demos), "seconds": time.monotonic() - started}})
