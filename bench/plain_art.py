"""The math training as a plain ART script: what a user would write without the service.

Warm start, then per step: gather trajectory groups, ``backend.train``, ``model.log``. It picks
the same scenarios and sampling seeds as the service (``service.runner.seeding``), so with the
same seed it trains the same policy; ``bench/service_overhead.py`` times it against the service.

    python bench/plain_art.py --data-dir DIR --steps 20 [--seed 0]   # prints one JSON line
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm

import art  # noqa: E402

import environments  # noqa: E402
from environments.base import Sampling  # noqa: E402
from service.backends.embedded import EmbeddedBackend  # noqa: E402
from service.training.schedule import cosine_schedule  # noqa: E402
from service.runner.seeding import batch_for_step, derive_seed  # noqa: E402


async def train(*, data_dir: Path, steps: int, seed: int, groups_per_step: int, group_size: int, learning_rate: float) -> dict:
    env = environments.load("math")
    backend = EmbeddedBackend(path=data_dir / "models", cache_dir=data_dir / "cache", seed=seed)
    model = art.TrainableModel(name="plain", project="bench", base_model="embedded/char-gpt-0.8m", base_path=str(data_dir / "art"))
    await model.register(backend)
    demos, count = env.demonstrations(seed=seed, count=51_200), 51_200
    config = art.TrainSFTConfig(learning_rate=cosine_schedule(1e-3, -(-count // 64)), batch_size=64)
    async for _ in backend._train_sft(model, demos, config, {}, False):
        pass
    step_ends, rewards = [], []
    started = time.monotonic()
    for step in range(1, steps + 1):
        scenarios = batch_for_step(env.scenarios("train"), seed=seed, step=step, size=groups_per_step)
        groups = await art.gather_trajectory_groups(
            (
                art.TrajectoryGroup(
                    env.rollout(model, s, Sampling(temperature=1.0, seed=derive_seed(seed, "train", step, s["id"], i)))
                    for i in range(group_size)
                )
                for s in scenarios
            ),
            pbar_desc=None,
        )
        result = await backend.train(model, groups, learning_rate=learning_rate)
        await model.log(groups, metrics=result.metrics, step=result.step, split="train")
        step_ends.append(time.monotonic() - started)
        trajectories = [t for g in groups for t in g.trajectories]
        rewards.append(sum(t.reward for t in trajectories) / len(trajectories))
    await backend.close()
    return {"step_ends_s": step_ends, "reward_means": rewards}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--groups-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    args = parser.parse_args()
    result = asyncio.run(
        train(data_dir=args.data_dir, steps=args.steps, seed=args.seed, groups_per_step=args.groups_per_step,
              group_size=args.group_size, learning_rate=args.learning_rate)
    )  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
