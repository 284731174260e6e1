"""Token-by-token sampling from the embedded policy, with the logprob of every emitted token.

Each request is decoded on its own (its ``n`` samples batched together) with a generator seeded
from the request, so a seeded request gives the same text whatever else the server is doing.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch

from service.backends.embedded.policy import CharGPT
from service.backends.embedded.tokenizer import EMITTABLE_IDS, EOT, decode_token, prompt_budget
from service.backends.openai_server import Sample


@dataclass(frozen=True)
class SamplingRequest:
    prompt_ids: list[int]
    n: int = 1
    temperature: float = 1.0  # 0 means greedy
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0


def _stop_hit(text: str, stop: tuple[str, ...]) -> str | None:
    return next((s for s in stop if s and s in text), None)


@torch.inference_mode()
def sample(policy: CharGPT, request: SamplingRequest) -> list[Sample]:
    """Generate ``request.n`` continuations of the prompt.

    The prompt is truncated from the left to :func:`prompt_budget`, so prompt plus reply fits the context.
    Returned logprobs are the policy's own (temperature 1) log-probabilities of each token, the
    quantity the GRPO trainer uses as the behaviour policy.
    """
    block = policy.config.block_size
    max_tokens = max(1, min(request.max_tokens, block - 1))
    prompt = request.prompt_ids[-prompt_budget(block, max_tokens) :]
    seed = request.seed if request.seed is not None else secrets.randbits(63)
    generator = torch.Generator().manual_seed(seed)
    samples = [Sample(context_tokens=len(prompt)) for _ in range(request.n)]
    active = list(range(request.n))

    idx = torch.tensor([prompt] * request.n, dtype=torch.long)
    logits, cache = policy(idx)
    position = len(prompt)
    for _ in range(max_tokens):
        logprobs = policy.output_logprobs(logits[:, -1, :])
        if request.temperature <= 0:
            next_ids = logprobs.argmax(dim=-1)
        else:
            probs = torch.softmax(logprobs / request.temperature, dim=-1)
            next_ids = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        chosen = logprobs.gather(1, next_ids[:, None]).squeeze(1)
        if request.top_logprobs:
            top_values, top_ids = logprobs.topk(min(request.top_logprobs, len(EMITTABLE_IDS)), dim=-1)
        still_active = []
        for row, sample_index in enumerate(active):
            token = int(next_ids[row])
            s = samples[sample_index]
            if token == EOT:
                s.finish_reason = "stop"
                continue
            s.token_ids.append(token)
            s.logprobs.append(float(chosen[row]))
            if request.top_logprobs:
                s.top_logprobs.append(list(zip(top_ids[row].tolist(), top_values[row].tolist())))
            s.text += decode_token(token)
            if (hit := _stop_hit(s.text, request.stop)) is not None:
                s.text = s.text[: s.text.index(hit)]  # one token per character: trim to match
                del s.token_ids[len(s.text) :], s.logprobs[len(s.text) :], s.top_logprobs[len(s.text) :]
                s.finish_reason, s.stop_reason = "stop", hit
                continue
            still_active.append(row)
        if not still_active or position + 1 >= block:
            break
        if len(still_active) < len(active):  # drop finished rows from the batch and its cache
            keep = torch.tensor(still_active, dtype=torch.long)
            active = [active[row] for row in still_active]
            cache = [(k[keep], v[keep]) for k, v in cache]
            next_ids = next_ids[keep]
        logits, cache = policy(next_ids[:, None], cache=cache, start_pos=position)
        position += 1
    return samples
