"""Benchmark and check: the transformers backend's sampler on a CUDA GPU (issue 31: "the CUDA path stays bf16").

The service samples and trains on CUDA when there is one, but its sampler (``generation.Generator``: the prefix
cache, finished rows leaving the batch, per-row seeded draws) and its grouped-query attention were written and
measured on CPUs. This runs them on a GPU with a randomly initialised model of SmolLM2-135M's shape and its real
tokenizer (a GPU machine here has no model weights and no network), and reports:

- correctness in float32: the sampler's greedy replies against transformers' own ``generate``, a seeded row alone
  and inside a batch, a conversation's next turn with the prefix cache and without, and the grouped attention's
  logits against ``sdpa``'s on a padded batch (bf16 too);
- speed in bf16 (the CUDA default): a step's worth of rollouts (64 rows, 8 prompts of about 150 tokens, 64 new
  tokens) with ``sdpa`` (what CUDA loads today) and with the grouped attention, medians of 3 rounds, and peak memory.

Nothing here needs ART, so it runs beside a bare PyTorch:

    python bench/cuda_sampler.py TOKENIZER_DIR [--out results.json]

TOKENIZER_DIR holds SmolLM2's ``config.json`` and tokenizer files (those of the converted base model in
``.artsvc/cache/base-models/``, without the weights).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.backends.transformers import attention  # noqa: E402  (registers the grouped attention)
from service.backends.transformers.generation import Generator, SamplingRequest  # noqa: E402

ROWS, PROMPTS, PROMPT_TOKENS, NEW_TOKENS = 64, 8, 150, 64


DEVICE = torch.device("cuda")


def random_model(folder: Path, *, implementation: str, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(folder)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=implementation)
    assert model.config._attn_implementation == implementation, model.config._attn_implementation
    return model.to(DEVICE).eval()


def synchronize() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def generator(model: torch.nn.Module, tokenizer, *, cache_bytes: int | None = None) -> Generator:
    ends = {tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id}
    kwargs = {} if cache_bytes is None else {"prefix_cache_bytes": cache_bytes}
    return Generator(model, tokenizer, end_token_ids=ends, **kwargs)


def prompts(tokenizer, count: int, length: int) -> list[tuple[int, ...]]:
    words = "the agent searched the inbox for the flight to Oslo and read two messages before answering".split()
    out = []
    for i in range(count):
        text = " ".join(words[(i + j) % len(words)] for j in range(length))
        out.append(tuple(tokenizer.encode(text, add_special_tokens=False)[: length - i * 3]))
    return out


def correctness(folder: Path, tokenizer) -> dict:
    model = random_model(folder, implementation="sdpa", dtype=torch.float32)
    sampler = generator(model, tokenizer)
    checks: dict[str, object] = {}
    asked = prompts(tokenizer, 6, 40)
    ours = [s[0].token_ids for s in sampler.generate([SamplingRequest(p, temperature=0, max_tokens=24) for p in asked])]
    theirs = []
    for p in asked:
        out = model.generate(torch.tensor([p], device=DEVICE), max_new_tokens=24, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=list(sampler.end_token_ids))  # fmt: skip
        theirs.append(out[0, len(p):].tolist())
    checks["greedy_equal_to_generate"] = f"{sum(a == b for a, b in zip(ours, theirs))}/{len(asked)}"
    request = SamplingRequest(asked[0], temperature=1.0, max_tokens=24, seed=7)
    alone = sampler.generate([request])[0][0].token_ids
    crowd = [SamplingRequest(p, temperature=1.0, max_tokens=24, seed=100 + i) for i, p in enumerate(asked[1:])]
    inside = sampler.generate([*crowd, request])[-1][0].token_ids
    checks["seeded_row_alone_equals_in_batch"] = alone == inside
    turn1 = sampler.generate([SamplingRequest(asked[1], temperature=0, max_tokens=16)])[0][0].token_ids
    turn2 = SamplingRequest((*asked[1], *turn1, *asked[2][:20]), temperature=0, max_tokens=16)
    cached = sampler.generate([turn2])[0][0].token_ids
    fresh = generator(model, tokenizer, cache_bytes=0).generate([turn2])[0][0].token_ids
    checks["next_turn_with_prefix_cache_equals_without"] = cached == fresh
    for dtype in (torch.float32, torch.bfloat16):
        sdpa = random_model(folder, implementation="sdpa", dtype=dtype)
        grouped = random_model(folder, implementation=attention.NAME, dtype=dtype)
        ids = torch.tensor([asked[0][:32], (0,) * 8 + asked[1][:24]], device=DEVICE)
        mask = torch.tensor([[1] * 32, [0] * 8 + [1] * 24], device=DEVICE)
        with torch.no_grad():
            a, b = (m(input_ids=ids, attention_mask=mask).logits.float() for m in (sdpa, grouped))
        checks[f"grouped_vs_sdpa_max_logit_diff_{str(dtype).split('.')[-1]}"] = float((a - b)[mask.bool()].abs().max())
    return checks


def speed(folder: Path, tokenizer, implementation: str) -> dict:
    model = random_model(folder, implementation=implementation, dtype=torch.bfloat16)
    sampler = generator(model, tokenizer, cache_bytes=0)  # every round encodes its prompts
    asked = prompts(tokenizer, PROMPTS, PROMPT_TOKENS)
    requests = [SamplingRequest(asked[i % PROMPTS], temperature=1.0, max_tokens=NEW_TOKENS, seed=i) for i in range(ROWS)]
    sampler.generate(requests[:8])  # warm-up: kernels chosen, allocator primed
    synchronize()
    if DEVICE.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    seconds, tokens = [], []
    for _ in range(3):
        started = time.perf_counter()
        out = sampler.generate(requests)
        synchronize()
        seconds.append(time.perf_counter() - started)
        tokens.append(sum(len(s[0].token_ids) for s in out))
    median = statistics.median(seconds)
    return {"implementation": model.config._attn_implementation, "rounds_s": [round(s, 3) for s in seconds], "median_s": round(median, 3),
            "tokens": tokens, "tokens_per_s": round(statistics.median(tokens) / median, 1),
            "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if DEVICE.type == "cuda" else None}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tokenizer_dir", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--device", default="cuda", help="cpu: the same script, to try it where there is no GPU")
    args = parser.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_dir)
    result = {
        "device": torch.cuda.get_device_name() if DEVICE.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "shape": f"SmolLM2-135M ({ROWS} rows, {PROMPTS} prompts of about {PROMPT_TOKENS} tokens, {NEW_TOKENS} new)",
        "checks_float32": correctness(args.tokenizer_dir, tokenizer),
        "speed_bf16": [speed(args.tokenizer_dir, tokenizer, name) for name in ("sdpa", attention.NAME)],
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
