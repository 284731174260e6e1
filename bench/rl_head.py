"""Benchmark: a GRPO step's training pass on an agent's rows, two ways, on SmolLM2-135M-Instruct. ``--ab head`` (the
default): the vocabulary head at every position (before) against the head at the positions ART's loss reads
(``training.read_positions``, now). ``--ab shared_prefix``: every row computed whole (before) against the opening the
rows hold alike computed once a pass (``shared_prefix.py``, now).

An agent's RL row is its whole episode: a 2048 game is an opening of 223 tokens, then a board and a move a turn, and
the loss reads only the moves (about 1 position in 8). The rows are the teacher's games (``--env 2048``, the default
game) or email demonstrations, each its own packed row as the RL step packs a group's episodes, run through
``training.grpo_step`` (policy forward and backward, reference forward, optimizer step at learning rate 0).

    python bench/rl_head.py [--env 2048] [--episodes 8] [--rounds 3] [--ab head|shared_prefix]

Prints the machine, then the median seconds of each side over the rounds (alternated, after one untimed); writes
``bench/results/rl_head_<env>.json`` (``rl_shared_prefix_<env>.json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm

import torch  # noqa: E402
from art import dev  # noqa: E402

from environments import load  # noqa: E402
from roofline import cpu  # noqa: E402
from service.backends.transformers import shared_prefix, training  # noqa: E402
from service.backends.transformers.engine import PolicyEngine  # noqa: E402
from service.backends.transformers.models import resolve_base_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="2048")
    parser.add_argument("--episodes", type=int, default=8, help="episodes in the step (2048's default: 16)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ab", choices=("head", "shared_prefix"), default="head")
    args = parser.parse_args()
    machine = cpu()
    print(json.dumps(machine))
    sides = {"head": ("full_head", "read_positions"), "shared_prefix": ("whole_rows", "shared_prefix")}[args.ab]

    with tempfile.TemporaryDirectory() as tmp:
        engine = PolicyEngine(Path(tmp) / "model", resolve_base_model("SmolLM2-135M-Instruct", Path(tmp) / "cache"))
        episodes = list(load(args.env, {}).demonstrations(seed=0, count=args.episodes))
        rows = training.sft_rows(engine.tokenizer, episodes)
        packed = training.pack(rows, seq_len=0)  # one episode a row, as long as the longest
        read = sum(int(training.read_positions({k: packed[k][i : i + 1] for k in ("assistant_mask", "logprobs")}).sum())
                   for i in range(packed["tokens"].shape[0]))  # fmt: skip
        seconds: dict[str, list[float]] = {side: [] for side in sides}
        step = {"learning_rate": 0.0, "config": dev.TrainConfig(), "max_grad_norm": 1.0}
        training.grpo_step(engine.model, engine.optimizer, packed, **step)  # untimed: the first pass's allocations
        for _ in range(args.rounds):
            for before in (True, False):
                with _as_before(args.ab, before):
                    started = time.perf_counter()
                    training.grpo_step(engine.model, engine.optimizer, packed, **step)
                seconds[sides[not before]].append(time.perf_counter() - started)
    positions = int((packed["group_ids"] != -1).sum())
    result = {"machine": machine, "precision": str(engine.dtype), "env": args.env, "episodes": args.episodes,
              "rows": int(packed["tokens"].shape[0]), "row_length": int(packed["tokens"].shape[1]),
              "positions": positions, "read_positions": read, "seconds": seconds,
              "median_s": {k: statistics.median(v) for k, v in seconds.items()}}  # fmt: skip
    result["speedup"] = result["median_s"][sides[0]] / result["median_s"][sides[1]]
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}))
    name = "rl_head" if args.ab == "head" else "rl_shared_prefix"
    (ROOT / "bench" / "results" / f"{name}_{args.env}.json").write_text(json.dumps(result, indent=1) + "\n")


@contextmanager
def _as_before(ab: str, before: bool) -> Iterator[None]:
    """The step as it was, for the duration, where ``before``: the head at every position, or every row whole."""
    read, minimum = training.read_positions, shared_prefix.MIN_SHARED
    if before and ab == "head":
        training.read_positions = lambda inputs: torch.ones_like(inputs["assistant_mask"], dtype=torch.bool)
    if before and ab == "shared_prefix":
        shared_prefix.MIN_SHARED = sys.maxsize
    try:
        yield
    finally:
        training.read_positions, shared_prefix.MIN_SHARED = read, minimum


if __name__ == "__main__":
    main()
