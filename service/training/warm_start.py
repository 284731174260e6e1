"""The supervised warm start a job's policy gets once, on its environment's demonstrations, before any RL step.

The demonstrations are a stream: generated as the backend trains on them, a batch at a time, so a warm start's memory
does not grow with its size (service/settings.py ``max_warm_start_examples`` bounds its time).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from itertools import islice

import art
from openai.types.chat.chat_completion import Choice

from environments.base import Environment
from environments.prompts import is_example
from service import manifests
from service.training.run import Run
from service.training.schedule import cosine_schedule

WARM_START_STATE_KEY = "artsvc_warm_start"
WARM_START_TURNS_PER_BATCH = 64  # a policy trained from scratch (the embedded backend)
# A pretrained model warm-starts on a few dozen demonstrations, not thousands: it needs optimizer steps more than
# replies per step. 60 email demonstrations at 64 replies a step (5 steps) left SmolLM2-135M writing prose; at 8
# (30 steps, the same 8 minutes) it called a tool in 52 of its 57 validation turns (README Results, issue 32).
PRETRAINED_TURNS_PER_BATCH = 8
SIZING_SAMPLE = 256  # demonstrations read first to size the batches


@dataclass(frozen=True)
class Demonstrations:
    """The environment's ``count`` demonstrations for ``seed``, generated anew (the same ones, in the same order) each
    time they are iterated, so a backend may read them twice (the embedded one fingerprints them first) and none
    is kept."""

    env: Environment
    seed: int
    count: int

    def __iter__(self) -> Iterator[art.Trajectory]:
        return iter(self.env.demonstrations(seed=self.seed, count=self.count))


def warm_start_batch_size(demos: Sequence[art.Trajectory], turns_per_batch: int = WARM_START_TURNS_PER_BATCH) -> int:
    """Demonstrations per optimizer step, so that each step sees about ``turns_per_batch`` replies.

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
    return max(1, round(turns_per_batch * len(demos) / max(1, turns)))


async def warm_start(run: Run) -> None:
    """Supervised warm start on the environment's demonstrations, once per model (its state remembers it), sized on
    its first SIZING_SAMPLE demonstrations. A cancel, a shutdown or a lost lease (``run.check_stop``) stops it within
    about a second, JobCancelled or JobInterrupted raised, the policy's saved weights untouched."""
    if (count := pending_examples(run)) == 0:
        return
    demos = Demonstrations(run.env, run.spec.seed, count)
    turns_per_batch = WARM_START_TURNS_PER_BATCH if run.spec.model.backend == "embedded" else PRETRAINED_TURNS_PER_BATCH
    if (batch_size := _sized_on_a_sample(demos, turns_per_batch)) is None:
        return
    started = time.monotonic()
    await run.check_stop.guard(_train(run, demos, batch_size=batch_size, batches=-(-count // batch_size)))
    run.model.merge_state({WARM_START_STATE_KEY: {"examples": count, "seconds": time.monotonic() - started}})


def pending_examples(run: Run) -> int:
    """The demonstrations the warm start will train on: 0 when it has none, or this model already had it."""
    if (run.model.read_state() or {}).get(WARM_START_STATE_KEY):
        return 0
    return manifests.warm_start_examples(run.spec, run.env)


def _sized_on_a_sample(demos: Demonstrations, turns_per_batch: int) -> int | None:
    """The batch size ``warm_start_batch_size`` gives the first SIZING_SAMPLE demonstrations (none kept); None when
    the environment has none."""
    sample = list(islice(demos, SIZING_SAMPLE))
    return warm_start_batch_size(sample, turns_per_batch) if sample else None


async def _train(run: Run, demos: Demonstrations, *, batch_size: int, batches: int) -> None:
    config = art.TrainSFTConfig(
        learning_rate=cosine_schedule(run.spec.training.warm_start_learning_rate, batches), batch_size=batch_size
    )
    done = 0
    async with aclosing(run.backend._train_sft(run.model, demos, config, {}, False)) as trained:
        async for metrics in trained:
            done = batches if metrics.get("cache_hit") else done + 1
            run.on_event("warm_start", {"batch": done, "batches": batches, "loss": metrics.get("loss")})
