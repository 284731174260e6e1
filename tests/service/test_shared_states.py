"""A batch's rows that open alike hold the opening's states once while sampling (generation.py's ``_Opening``,
attention.py's ``shared_states``): on the tiny Llama with the CPU's grouped attention, in float32, every row samples
the tokens and logprobs it samples with the opening in its own cache, and what the prefix cache keeps from such a
batch serves the next turn as states computed whole would."""

from __future__ import annotations

import pytest
import torch

from service.backends.transformers import attention, chat, shared_prefix
from service.backends.transformers.generation import Generator, SamplingRequest


@pytest.fixture(scope="module")
def lm(tiny_lm):
    from transformers import AutoModelForCausalLM

    from service.backends.transformers.models import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_lm), attn_implementation=attention.NAME).eval()
    assert shared_prefix.applies(model)
    return model, load_tokenizer(tiny_lm)


def _requests(tokenizer, opening: tuple[int, ...]) -> list[SamplingRequest]:
    tails = ["Which email holds the seat?", "Find the invoice total, please.", "Who wrote about the Krakow flight?"]
    prompts = [opening + tuple(tokenizer.encode(f"<|im_start|>user\n{tail}<|im_end|>\n")) for tail in tails]
    return [
        SamplingRequest(prompt_ids=prompts[0], n=2, max_tokens=12, seed=1, top_logprobs=2),
        SamplingRequest(prompt_ids=prompts[1], max_tokens=7, temperature=0),
        SamplingRequest(prompt_ids=prompts[2], max_tokens=16, seed=5, temperature=0.8, top_p=0.9),
    ]


def _opening(tokenizer) -> tuple[int, ...]:
    text = "<|im_start|>system\nAnswer the user's question about their inbox with the tools. " * 12
    opening = tuple(tokenizer.encode(text))
    assert len(opening) >= shared_prefix.MIN_SHARED
    return opening


def _held(model: torch.nn.Module) -> tuple[list[int | None], object]:
    """Per forward pass: the opening's length handed to the attention apart from the cache (None: no opening)."""
    lengths: list[int | None] = []

    def hook(_module, _args, kwargs, _out):
        states = kwargs.get("shared_states")
        lengths.append(None if states is None else states[0][0].shape[2])

    return lengths, model.register_forward_hook(hook, with_kwargs=True)


def test_rows_sampled_with_their_opening_held_once_sample_what_they_do_with_it_in_each_row(lm, monkeypatch):
    model, tokenizer = lm
    opening = _opening(tokenizer)
    requests = _requests(tokenizer, opening)
    lengths, hook = _held(model)
    try:
        held_once = Generator(model, tokenizer, end_token_ids=chat.end_token_ids(tokenizer)).generate(requests)
    finally:
        hook.remove()
    # the opening encoded once, then the prefill of each prompt's rest and every decoding step with it held apart
    assert lengths[0] is None and len(set(lengths[1:])) == 1 and lengths[1] >= len(opening)
    monkeypatch.setattr(shared_prefix, "MIN_SHARED", 10**9)
    in_each_row = Generator(model, tokenizer, end_token_ids=chat.end_token_ids(tokenizer)).generate(requests)
    for ours, theirs in zip(held_once, in_each_row):
        for a, b in zip(ours, theirs, strict=True):
            assert a.token_ids == b.token_ids and a.text == b.text
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
            assert [[t for t, _ in top] for top in a.top_logprobs] == [[t for t, _ in top] for top in b.top_logprobs]


def test_the_next_turn_after_a_batch_that_held_its_opening_once_reads_the_states_it_kept(lm):
    """The prefix cache keeps each row whole (the opening and its own positions), so its next turn encodes only its
    new tokens and samples as a generator that computes every prompt from its first token."""
    model, tokenizer = lm
    opening = _opening(tokenizer)
    ends = chat.end_token_ids(tokenizer)
    cached, fresh = Generator(model, tokenizer, end_token_ids=ends), Generator(model, tokenizer, end_token_ids=ends,
                                                                               prefix_cache_bytes=0)  # fmt: skip
    first = _requests(tokenizer, opening)
    replies = [tuple(samples[0].token_ids) for samples in cached.generate(first)]
    tool = tuple(tokenizer.encode("<|im_start|>user\nsearch_inbox: no results<|im_end|>\n"))
    second = [SamplingRequest(prompt_ids=r.prompt_ids + reply + tool, max_tokens=6, seed=9)
              for r, reply in zip(first, replies)]  # fmt: skip
    fed: list[int] = []
    hook = model.register_forward_hook(lambda _, a, kw, o: fed.append(kw["input_ids"].shape[1]), with_kwargs=True)
    try:
        again = cached.generate(second)
    finally:
        hook.remove()
    assert fed[0] == 1 + len(tool)  # the reply's last token (never fed) and the tool's answer, for every row
    for ours, theirs in zip(again, fresh.generate(second)):
        assert ours[0].token_ids == theirs[0].token_ids
        assert ours[0].logprobs == pytest.approx(theirs[0].logprobs, abs=1e-5)
