"""Benchmark: the embedded policy's warm-start step with each batch padded as one (before) against its windows grouped
by length (``engine.micro_batches``, now).

A math demonstration's window is about 29 or about 60 tokens (the reply, and the question the sampler would keep), so a
batch padded to its longest window computes about twice the tokens it trains. The same batches of the math warm start
(``embedded/char-gpt-0.8m``, the slow test's model) go through ``PolicyEngine.sft_step`` both ways, alternated, on one
torch thread (as a test process runs it).

    python bench/embedded_padding.py [--batches 40] [--rounds 3]

Prints the machine, then the median seconds of each side over the rounds (after one untimed); writes
``bench/results/embedded_padding.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm

import torch  # noqa: E402

from environments.math import MathEnvironment  # noqa: E402
from roofline import cpu  # noqa: E402
from service.backends.embedded import engine as embedded_engine  # noqa: E402
from service.backends.embedded.policy import PRESETS  # noqa: E402
from service.backends.embedded.sequences import trajectory_windows  # noqa: E402
from service.training.warm_start import WARM_START_TURNS_PER_BATCH  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    machine = cpu()
    print(json.dumps(machine))
    config = PRESETS["embedded/char-gpt-0.8m"]
    demos = MathEnvironment().demonstrations(seed=0, count=WARM_START_TURNS_PER_BATCH * args.batches)
    windows = [w for d in demos for w in trajectory_windows(d.messages_and_choices, block_size=config.block_size,
                                                            train_on_messages=True)]  # fmt: skip
    batches = [windows[i : i + WARM_START_TURNS_PER_BATCH] for i in range(0, len(windows), WARM_START_TURNS_PER_BATCH)]

    with tempfile.TemporaryDirectory() as tmp:
        engine = embedded_engine.PolicyEngine(Path(tmp), config, seed=0)
        engine.begin_sft()

        def warm_start_steps(padding_ratio: float) -> float:
            with mock.patch.object(embedded_engine, "MAX_PADDING_RATIO", padding_ratio):
                started = time.perf_counter()
                for batch in batches:
                    engine.sft_step(batch, 1e-3)
                return time.perf_counter() - started

        sides = {"padded_as_one": math.inf, "grouped_by_length": embedded_engine.MAX_PADDING_RATIO}
        for ratio in sides.values():
            warm_start_steps(ratio)  # untimed
        times: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.rounds):
            for name, ratio in sides.items():
                times[name].append(warm_start_steps(ratio))
    medians = {name: statistics.median(values) for name, values in times.items()}
    result = {
        "machine": machine,
        "batches": len(batches),
        "windows": len(windows),
        "seconds": times,
        "median_s": medians,
        "speedup": medians["padded_as_one"] / medians["grouped_by_length"],
    }
    print(json.dumps({k: result[k] for k in ("batches", "median_s", "speedup")}))
    out = ROOT / "bench" / "results" / "embedded_padding.json"
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
