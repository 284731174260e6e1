"""Does a sample's logprob depend on what else was decoded in its batch? (Why two runs of one seed agree on every
sampled token and reward but not on the loss's last bits: see README, "What reproduces".)

Decodes one seeded request alone, alone again, and batched with another request, on SmolLM2-135M-Instruct (the
main job's model, no adapter), with the transformers backend's own sampler, and prints whether the tokens match and
how far the logprobs moved.

    python bench/batch_logprobs.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from service.backends.transformers.generation import Generator, SamplingRequest  # noqa: E402
from service.backends.transformers.models import DEFAULT_BASE_MODEL, resolve_base_model  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="batch-logprobs-") as cache:
        model_dir = resolve_base_model(DEFAULT_BASE_MODEL, Path(cache))
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    sampler = Generator(model, tokenizer, end_token_ids={tokenizer.eos_token_id})

    def prompt(text: str) -> tuple[int, ...]:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        return tuple(int(i) for i in (ids["input_ids"] if hasattr(ids, "keys") else ids))

    probe = SamplingRequest(prompt_ids=prompt("What is 23 + 41? End with Final: <int>."), n=4, max_tokens=24, seed=7)
    other = SamplingRequest(prompt_ids=prompt("Compute 512 + 137 and end with Final: <int>."), n=4, max_tokens=24, seed=9)
    alone, again, batched = sampler.generate([probe])[0], sampler.generate([probe])[0], sampler.generate([probe, other])[0]
    for index, (a, b, c) in enumerate(zip(alone, again, batched)):
        moved = max((abs(x - y) for x, y in zip(a.logprobs, c.logprobs)), default=0.0)
        print(f"sample {index}: alone twice identical: {a.token_ids == b.token_ids and a.logprobs == b.logprobs}; "
              f"batched: same tokens {a.token_ids == c.token_ids}, largest logprob change {moved:.2e}")


if __name__ == "__main__":
    main()
