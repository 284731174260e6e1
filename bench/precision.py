"""Benchmark: the transformers backend's base model in float32 against bfloat16 on this CPU (issue 31, item 2).

Prints the CPU's bfloat16 flags and what ``ARTSVC_PRECISION=auto`` picks here, then for each precision, on
SmolLM2-135M-Instruct with the backend's LoRA (rank 16, all linear layers, gradient checkpointing): one forward and
backward over ``--rows`` x ``--row-tokens`` tokens (a step's packed rows are 8 x ~390), one sampling of ``--samples``
completions of ``--sample-tokens`` tokens from one prompt (a step's rollouts are 64 x ~30), and the correlation of the
sampled tokens' probabilities with the trainer's recomputed ones (ART's ``probs_corr``: 1.0 when the sampler and the
trainer compute the same policy). One timed run each, after a short warm-up. The default sizes are small because an
AVX2 CPU has no bfloat16 arithmetic (a product runs many times slower than in float32): they finish in about two
minutes on 2 shared AVX2 cores; pass the step's sizes on a CPU with AMX or AVX512-BF16.

    python bench/precision.py [--cache /tmp/bf16cache] [--rows 8 --row-tokens 390 --samples 64 --sample-tokens 30]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the service's workers wait (service/cpu.py): asleep
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's service, not an installed one

import torch  # noqa: E402

from service.backends.transformers import chat, training  # noqa: E402
from service.backends.transformers.engine import PolicyEngine  # noqa: E402
from service.backends.transformers.generation import SamplingRequest  # noqa: E402
from service.backends.transformers.models import resolve_base_model  # noqa: E402
from service.backends.transformers.precision import NATIVE_BF16_FLAGS, dtype_name, resolve  # noqa: E402

RECOMPUTED = 16  # samples, at most, whose logprobs the trainer recomputes
QUESTION = [{"role": "user", "content": "What is 17 * 23? Reply with `Final: <int>`."}]


def _causal(batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.tril(torch.ones(length, length, dtype=torch.bool)).expand(batch, length, length)
    return mask, torch.arange(length).expand(batch, length)


def forward_backward_s(engine: PolicyEngine, rows: int, row_tokens: int) -> float:
    """Seconds of one forward and backward of the LoRA policy over ``rows`` x ``row_tokens`` tokens, as the trainer
    runs them."""
    tokens = torch.randint(0, len(engine.tokenizer), (rows, row_tokens), generator=torch.Generator().manual_seed(0))
    mask, positions = _causal(rows, row_tokens)
    engine.model.train()
    started = time.perf_counter()
    logprobs, _ = training.token_logprobs(engine.model, tokens, mask, positions)
    (-logprobs.mean()).backward()
    elapsed = time.perf_counter() - started
    engine.model.zero_grad(set_to_none=True)
    engine.model.eval()
    return elapsed


def sampling(engine: PolicyEngine, samples: int, sample_tokens: int) -> tuple[float, float]:
    """Seconds to sample ``samples`` x ``sample_tokens``, and the correlation of (at most RECOMPUTED) samples' token
    probabilities with the trainer's."""
    prompt = tuple(chat.render_prompt(engine.tokenizer, QUESTION, None))
    request = SamplingRequest(prompt_ids=prompt, n=samples, max_tokens=sample_tokens, seed=0)
    started = time.perf_counter()
    [replies] = engine.generate([request])
    elapsed = time.perf_counter() - started
    replies = replies[:RECOMPUTED]
    length = len(prompt) + max(len(r.token_ids) for r in replies)
    tokens = torch.tensor([[*prompt, *r.token_ids] + [0] * (length - len(prompt) - len(r.token_ids)) for r in replies])
    mask, positions = _causal(len(replies), length)  # padding only after a reply: causally unseen
    with torch.no_grad():
        recomputed, _ = training.token_logprobs(engine.model, tokens, mask, positions)
    sampled = torch.tensor([lp for r in replies for lp in r.logprobs])
    start = len(prompt) - 1  # position t holds log p(token t+1)
    trained = torch.cat([recomputed[i, start : start + len(r.logprobs)] for i, r in enumerate(replies)])
    return elapsed, float(torch.corrcoef(torch.stack([sampled.exp(), trained.exp()]))[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "bf16cache")
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--row-tokens", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--sample-tokens", type=int, default=8)
    args = parser.parse_args()
    capabilities = torch.cpu.get_capabilities()
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"torch {torch.__version__} on {torch.get_num_threads()} threads, kernels for {capability}")
    print("flags:", {flag: bool(capabilities.get(flag)) for flag in (*NATIVE_BF16_FLAGS, "avx512_f", "avx2")})
    print("auto picks:", dtype_name(resolve("auto", torch.device("cpu"))))
    base = resolve_base_model("SmolLM2-135M-Instruct", args.cache)
    for dtype in (torch.float32, torch.bfloat16):
        with tempfile.TemporaryDirectory() as folder:
            engine = PolicyEngine(Path(folder) / "model", base, device=torch.device("cpu"), dtype=dtype)
            torch.manual_seed(0)
            with torch.no_grad():  # a trained adapter, not the zero one: the sampler and the trainer both apply it
                for name, param in engine.model.named_parameters():
                    if "lora_B" in name:
                        param.normal_(0, 0.01)
            engine.generate([SamplingRequest(prompt_ids=(1, 2, 3), max_tokens=2, seed=0)])  # warm-up
            backward = forward_backward_s(engine, args.rows, args.row_tokens)
            sample_s, corr = sampling(engine, args.samples, args.sample_tokens)
            print(f"{dtype_name(dtype):>8}: forward+backward {args.rows}x{args.row_tokens} {backward:6.2f} s, "
                  f"sampling {args.samples}x{args.sample_tokens} {sample_s:6.2f} s, probs_corr {corr:.6f}")  # fmt: skip


if __name__ == "__main__":
    main()
