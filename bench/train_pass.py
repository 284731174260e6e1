"""Benchmark: a math step's training pass (``training.grpo_step``) with its two switches, on SmolLM2-135M-Instruct in
the backend's precision (bf16 on AMX or AVX512-BF16 CPUs).

- rows: one packed row per forward and backward (before), or up to ``TRAIN_BATCH_TOKENS`` per pass (now);
- adapter: PEFT's float32 adapter products, each adapted layer's input cast to float32 and the sum cast back (before),
  or the adapter's products in the base's bf16 under autocast, its weights float32 (now; ``adapter_in_base_dtype``).

The rows are shaped as the main job packs a step: ``--rows`` rows of 512 tokens, each a few prompts of 120 tokens
followed by 8 replies of 40 with sampled logprobs and advantages. The four sides run in turn, ``--rounds`` times (the
first round untimed); these machines' speed drifts by tens of percent within minutes, so only sides run in the same
round are compared: the report gives each side's median seconds and its median ratio to the "before" side.

    python bench/train_pass.py [--rows 2] [--rounds 6]

Writes ``bench/results/train_pass.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import torch  # noqa: E402
from art import dev  # noqa: E402

from env_rl import machine  # noqa: E402
from service.backends.transformers import training  # noqa: E402
from service.backends.transformers.engine import PolicyEngine  # noqa: E402
from service.backends.transformers.models import resolve_base_model  # noqa: E402

ROW_TOKENS, PROMPT, REPLY, GROUP = 512, 120, 40, 8
SIDES = {  # name: (rows per pass as TRAIN_BATCH_TOKENS, the adapter's rule)
    "before (a row a pass, float32 adapter)": (1, False),
    "rows batched, float32 adapter": (training.TRAIN_BATCH_TOKENS, False),
    "a row a pass, bf16 adapter": (1, True),
    "now (rows batched, bf16 adapter)": (training.TRAIN_BATCH_TOKENS, True),
}


def packed_step(rows: int, vocab: int) -> dict:
    """``rows`` packed rows as ART packs a math step: groups of a prompt and its 8 replies, then padding."""
    generator = torch.Generator().manual_seed(0)
    columns: dict[str, list[list]] = {k: [] for k in ("tokens", "group_ids", "parent_ids", "input_pos",
                                                      "assistant_mask", "logprobs", "advantages", "weights")}  # fmt: skip
    for _ in range(rows):
        row: dict[str, list] = {k: [] for k in columns}
        group = 0
        while len(row["tokens"]) + PROMPT + REPLY <= ROW_TOKENS:
            prompt, group = group, group + 1
            spans = [(prompt, 0, PROMPT, False)]
            for reply in range(GROUP):
                if len(row["tokens"]) + PROMPT + (reply + 1) * REPLY > ROW_TOKENS:
                    break
                spans.append((group, PROMPT, REPLY, reply % 2 == 0))
                group += 1
            for group_id, start, length, good in spans:
                trained = start > 0
                row["tokens"] += torch.randint(0, vocab, (length,), generator=generator).tolist()
                row["group_ids"] += [group_id] * length
                row["parent_ids"] += [prompt] * length
                row["input_pos"] += list(range(start, start + length))
                row["assistant_mask"] += [trained] * length
                row["logprobs"] += [-0.5 if trained else float("nan")] * length
                row["advantages"] += [(1.0 if good else -1.0) if trained else 0.0] * length
                row["weights"] += [1.0 / length if trained else 0.0] * length
        pad = ROW_TOKENS - len(row["tokens"])
        for key, value in (("tokens", -100), ("group_ids", -1), ("parent_ids", -1), ("input_pos", 0),
                           ("assistant_mask", False), ("logprobs", float("nan")), ("advantages", 0.0), ("weights", 0.0)):  # fmt: skip
            columns[key].append(row[key] + [value] * pad)
    floats = ("logprobs", "advantages", "weights")
    packed = {k: torch.tensor(v, dtype=torch.float32 if k in floats else torch.bool if k == "assistant_mask" else torch.long)
              for k, v in columns.items()}  # fmt: skip
    return {**packed, "pixel_values": [None] * rows, "image_grid_thw": [None] * rows}


def timed_step(engine: PolicyEngine, packed: dict, budget: int, bf16_adapter: bool) -> float:
    """Seconds of one ``grpo_step`` (learning rate 0: the adapter stays as it is) under the side's switches."""
    real_rule, real_budget = training.adapter_in_base_dtype, training.TRAIN_BATCH_TOKENS
    training.TRAIN_BATCH_TOKENS = budget
    if not bf16_adapter:
        training.adapter_in_base_dtype = lambda model: contextlib.nullcontext()
    try:
        started = time.perf_counter()
        training.grpo_step(engine.model, engine.optimizer, packed, learning_rate=0.0, config=dev.TrainConfig(),  # type: ignore[arg-type]
                           max_grad_norm=1.0)  # fmt: skip
        return time.perf_counter() - started
    finally:
        training.adapter_in_base_dtype, training.TRAIN_BATCH_TOKENS = real_rule, real_budget


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "bf16cache")
    args = parser.parse_args()
    base = resolve_base_model("SmolLM2-135M-Instruct", args.cache)
    with tempfile.TemporaryDirectory() as folder:
        engine = PolicyEngine(Path(folder) / "model", base, device=torch.device("cpu"))
        with torch.no_grad():  # a trained-looking adapter: both of its products carry values
            for name, param in engine.model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.002)
        packed = packed_step(args.rows, engine.model.config.vocab_size)
        seconds: dict[str, list[float]] = {side: [] for side in SIDES}
        for round_ in range(args.rounds):
            for side, (budget, bf16_adapter) in SIDES.items():
                seconds[side].append(timed_step(engine, packed, budget, bf16_adapter))
            print(f"round {round_}: " + ", ".join(f"{s[-1]:.2f} s" for s in seconds.values()), flush=True)
    before = seconds[next(iter(SIDES))][1:]
    report = {"date": date.today().isoformat(), "machine": machine(), "dtype": str(engine.dtype), "rows": args.rows,
              "row_tokens": ROW_TOKENS, "rounds_timed": args.rounds - 1, "seconds": seconds,
              "median_s": {side: statistics.median(s[1:]) for side, s in seconds.items()},
              "median_ratio_to_before": {side: statistics.median(a / b for a, b in zip(s[1:], before))
                                         for side, s in seconds.items()}}  # fmt: skip
    for side in SIDES:
        print(f"{side:>40}: median {report['median_s'][side]:.2f} s, {report['median_ratio_to_before'][side]:.2f}x before")
    (ROOT / "bench" / "results" / "train_pass.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
