"""Batched sampling from a causal LM with the logprob of every sampled token.

Every row of a batch may have its own prompt, temperature, ``top_p``, length, stop strings and seed. Prompts are
encoded once however many rows share them (a group's ``n`` samples, or eight rollouts of one scenario), and the
prefix every prompt shares (a system prompt and few-shot turns) once for the whole batch: on a CPU the prompt is
most of the cost. Returned logprobs are the model's own (temperature 1) log-probabilities of the sampled tokens,
the quantity ART's loss compares the trained policy against, as vLLM reports them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from service.backends.openai_server import Sample


PREFILL_CHUNK = 512  # prompt tokens encoded per forward pass where sampling may be stopped


class _Stopped(Exception):
    """``should_stop`` turned true while the prompt was being encoded."""


@dataclass(frozen=True)
class SamplingRequest:
    prompt_ids: tuple[int, ...]
    n: int = 1
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0


@dataclass
class _Row:
    request: SamplingRequest
    prompt: int  # index into the batch's distinct prompts
    generator: torch.Generator
    sample: Sample
    done: bool = False


def _common_prefix(prompts: list[tuple[int, ...]]) -> int:
    """Tokens every prompt starts with, leaving each at least one token of its own (its last logits)."""
    shortest = min(len(p) for p in prompts)
    length = 0
    while length < shortest - 1 and all(p[length] == prompts[0][length] for p in prompts):
        length += 1
    return length


def _samples(requests: list[SamplingRequest], rows: list[_Row]) -> list[list[Sample]]:
    return [[row.sample for row in rows if row.request is r] for r in requests]


def _choose(logits: torch.Tensor, row: _Row) -> int:
    request = row.request
    if request.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / request.temperature, dim=-1)
    if request.top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        outside = torch.cumsum(ordered, dim=-1) - ordered > request.top_p
        ordered[outside] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, ordered)
    return int(torch.multinomial(probs, 1, generator=row.generator))


class Generator:
    """Samples completions from ``model`` (a causal LM, PEFT-wrapped or not) for token-id prompts."""

    def __init__(self, model: torch.nn.Module, tokenizer: object, *, end_token_ids: set[int]) -> None:
        self.model, self.tokenizer, self.end_token_ids = model, tokenizer, end_token_ids

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def generate(
        self, requests: list[SamplingRequest], *, should_stop: Callable[[], bool] | None = None
    ) -> list[list[Sample]]:
        """One list of ``request.n`` samples per request, decoded together. ``should_stop`` (a client gone, a deadline
        passed) is asked before each decoding step and, the shared prompt then encoded ``PREFILL_CHUNK`` tokens at a
        time, before each chunk: once true, what was sampled is returned, the unfinished samples' finish_reason
        ``length``."""
        prompts = list(dict.fromkeys(r.prompt_ids for r in requests))
        rows = [
            _Row(
                request=r,
                prompt=prompts.index(r.prompt_ids),
                generator=torch.Generator(device=self.device).manual_seed((r.seed if r.seed is not None else secrets.randbits(62)) + i),
                sample=Sample(context_tokens=len(r.prompt_ids)),
            )
            for r in requests
            for i in range(r.n)
        ]
        try:
            cache, mask, logits = self._prefill(prompts, should_stop)
        except _Stopped:
            return _samples(requests, rows)
        index = torch.tensor([row.prompt for row in rows], device=self.device)
        cache.reorder_cache(index)
        mask, logits = mask[index], logits[index]
        steps = max(r.max_tokens for r in requests)
        for _ in range(steps):
            if should_stop is not None and should_stop():
                break
            chosen = [self._emit(row, logits[i]) for i, row in enumerate(rows)]
            if all(row.done for row in rows):
                break
            tokens = torch.tensor(chosen, device=self.device).unsqueeze(1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            positions = mask.sum(dim=1, keepdim=True) - 1
            out = self.model(input_ids=tokens, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
            logits = out.logits[:, -1, :].float()
        return _samples(requests, rows)

    def _prefill(
        self, prompts: list[tuple[int, ...]], should_stop: Callable[[], bool] | None
    ) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
        """The cache after every distinct prompt, its attention mask, and each prompt's next-token logits.

        The shared prefix is encoded once and copied to every prompt, in chunks where ``should_stop`` is given (_Stopped
        once it is true); the rest is left-padded after it, the padding masked out and skipped by the positions."""
        device = self.device
        cache = DynamicCache()
        shared = _common_prefix(prompts)
        if shared:
            chunk = PREFILL_CHUNK if should_stop is not None else shared
            for start in range(0, shared, chunk):
                if should_stop is not None and should_stop():
                    raise _Stopped
                prefix = torch.tensor([prompts[0][start : min(start + chunk, shared)]], device=device)
                self.model(input_ids=prefix, past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache.reorder_cache(torch.zeros(len(prompts), dtype=torch.long, device=device))
        rests = [p[shared:] for p in prompts]
        width = max(len(r) for r in rests)
        tokens = torch.tensor([[0] * (width - len(r)) + list(r) for r in rests], device=device)
        rest_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rests], device=device)
        mask = torch.cat([torch.ones(len(prompts), shared, dtype=torch.long, device=device), rest_mask], dim=1)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, shared:]
        out = self.model(
            input_ids=tokens, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True, logits_to_keep=1
        )
        return cache, mask, out.logits[:, -1, :].float()

    def _emit(self, row: _Row, logits: torch.Tensor) -> int:
        """Sample the row's next token and record it; a finished row keeps decoding an ignored token."""
        if row.done:
            return next(iter(self.end_token_ids))
        token = _choose(logits, row)
        logprobs = torch.log_softmax(logits, dim=-1)
        sample, request = row.sample, row.request
        sample.token_ids.append(token)
        sample.logprobs.append(float(logprobs[token]))
        if request.top_logprobs:
            values, ids = torch.topk(logprobs, request.top_logprobs)
            sample.top_logprobs.append([(int(i), float(v)) for i, v in zip(ids, values)])
        if token in self.end_token_ids:
            sample.finish_reason, row.done = "stop", True
        else:
            sample.text = self.tokenizer.decode(
                [t for t in sample.token_ids if t not in self.end_token_ids], skip_special_tokens=False
            )
            hit = next((s for s in request.stop if s and s in sample.text), None)
            if hit is not None:
                sample.text = sample.text[: sample.text.index(hit)]
                sample.finish_reason, sample.stop_reason, row.done = "stop", hit, True
        if len(sample.token_ids) >= request.max_tokens and not row.done:
            row.done = True
        return token
