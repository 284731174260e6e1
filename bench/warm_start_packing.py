"""Benchmark: one warm-start batch of the email agent's demonstrations on SmolLM2-135M-Instruct, three ways: each
demonstration a row and a pass of its own (``alone``, the warm start before packing); the rows packed with their
common opening once a 2,048-wide packed row (``packed``, what ``pack_sft`` did); and packed rows as wide as the
longest demonstration, every one opening alike, the opening computed once a pass (``shared``, ``training.pack_sft``
now, with ``shared_prefix.py``). Tokens through the model and seconds of forward + backward, the vocabulary head run
at the trained positions only (``training.trained_logprobs``), as the warm start runs it; ``packed`` and ``shared``
go through ``training.micro_batches``, as ``sft_step`` does.

    python bench/warm_start_packing.py [--demos 14] [--rounds 3]

Prints the machine, then the median over rounds of each; writes ``bench/results/warm_start_packing_shared.json``
(``warm_start_packing.json`` holds the run of two sides before ``shared``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm

import torch  # noqa: E402

from environments.email.env import EmailEnvironment  # noqa: E402
from roofline import cpu  # noqa: E402
from service.backends.transformers import training  # noqa: E402
from service.backends.transformers.engine import PolicyEngine  # noqa: E402
from service.backends.transformers.models import resolve_base_model  # noqa: E402


def forward_backward(engine: PolicyEngine, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                     trained: torch.Tensor) -> None:  # fmt: skip
    (-training.trained_logprobs(engine.model, tokens, mask, positions, trained).sum()).backward()


def alone(engine: PolicyEngine, rows: list) -> int:
    for row in rows:
        n = len(row.token_ids)
        causal = torch.tril(torch.ones(n, n, dtype=torch.bool)).unsqueeze(0)
        trained = torch.nn.functional.pad(torch.tensor([row.assistant_mask[1:]], dtype=torch.bool), (0, 1))
        forward_backward(engine, torch.tensor([row.token_ids]), causal, torch.arange(n)[None], trained)
    return sum(len(row.token_ids) for row in rows)


def packed(engine: PolicyEngine, rows: list) -> int:
    return _in_passes(engine, training.pack(rows, seq_len=2048))  # rows marked by pack_sft, packed 2,048 wide


def shared(engine: PolicyEngine, rows: list) -> int:
    return _in_passes(engine, training.pack_sft(rows))  # rows as wide as the longest demonstration


def _in_passes(engine: PolicyEngine, tensors: dict) -> int:
    """``sft_step``'s forward and backward over packed ``tensors``: passes of ``micro_batches``."""
    trained = torch.nn.functional.pad(tensors["assistant_mask"][:, 1:], (0, 1))
    for batch in training.micro_batches(tensors["tokens"], tensors["input_pos"]):
        inputs = {k: v[batch] for k, v in tensors.items() if isinstance(v, torch.Tensor)}
        mask = training.packed_attention_mask(inputs["group_ids"], inputs["parent_ids"])
        forward_backward(engine, inputs["tokens"], mask, inputs["input_pos"], trained[batch])
    return int((tensors["group_ids"] != -1).sum())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--demos", type=int, default=14, help="demonstrations in the batch (the warm start's ~14)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    machine = cpu()
    print(json.dumps(machine))
    with tempfile.TemporaryDirectory() as tmp:
        engine = PolicyEngine(Path(tmp) / "model", resolve_base_model("SmolLM2-135M-Instruct", Path(tmp) / "cache"))
        engine.model.train()
        demos = list(EmailEnvironment().demonstrations(seed=0, count=args.demos))
        rows = training.sft_rows(engine.tokenizer, demos)
        training.pack_sft(rows)  # marks the rows' common opening, as the warm start does (both packed sides read it)
        seconds: dict[str, list[float]] = {"alone": [], "packed": [], "shared": []}
        tokens: dict[str, int] = {}
        for _ in range(args.rounds):
            for name, run in (("alone", alone), ("packed", packed), ("shared", shared)):
                started = time.perf_counter()
                tokens[name] = run(engine, rows)
                seconds[name].append(time.perf_counter() - started)
                engine.model.zero_grad(set_to_none=True)
    result = {"machine": machine, "precision": str(engine.dtype), "demos": args.demos, "tokens": tokens,
              "seconds": seconds, "median_s": {k: statistics.median(v) for k, v in seconds.items()}}  # fmt: skip
    result["speedup"] = {k: result["median_s"]["alone"] / v for k, v in result["median_s"].items() if k != "alone"}
    print(json.dumps({k: result[k] for k in ("precision", "demos", "tokens", "median_s", "speedup")}))
    out = ROOT / "bench" / "results" / "warm_start_packing_shared.json"
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
