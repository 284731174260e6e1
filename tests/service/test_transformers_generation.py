"""The transformers backend's batched sampler on the tiny Llama: a row decodes in a batch as it would alone, and a
finished row is no longer fed through the model."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from service.backends.transformers import chat
from service.backends.transformers.generation import Generator, SamplingRequest


@pytest.fixture(scope="module")
def lm(tiny_lm):
    from transformers import AutoModelForCausalLM

    from service.backends.transformers.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_lm)
    return AutoModelForCausalLM.from_pretrained(str(tiny_lm)).eval(), tokenizer


def _generator(lm) -> Generator:
    model, tokenizer = lm
    return Generator(model, tokenizer, end_token_ids=chat.end_token_ids(tokenizer))


@contextmanager
def _fed(model: torch.nn.Module) -> Iterator[list[tuple[int, int]]]:
    """(rows, tokens) of every forward pass of ``model`` inside the block."""
    shapes: list[tuple[int, int]] = []
    hook = model.register_forward_hook(lambda _, args, kwargs, out: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        yield shapes
    finally:
        hook.remove()


def _ragged(tokenizer) -> list[SamplingRequest]:
    short = tuple(tokenizer.encode("Say one word."))
    long = tuple(tokenizer.encode("Tell me a long story about a dragon, a knight and a very old castle by the sea."))
    return [
        SamplingRequest(prompt_ids=short, max_tokens=2, seed=3),
        SamplingRequest(prompt_ids=long, n=2, max_tokens=40, seed=7, top_logprobs=2),
        SamplingRequest(prompt_ids=short, max_tokens=9, seed=11, temperature=0.7, top_p=0.9, stop=("e",)),
        SamplingRequest(prompt_ids=long[:4], max_tokens=25, temperature=0),
    ]


def test_each_row_of_a_batch_with_very_different_lengths_samples_what_it_would_alone(lm):
    requests = _ragged(lm[1])
    together = _generator(lm).generate(requests)
    assert {2, 40} <= {len(s.token_ids) for samples in together for s in samples}
    for request, samples in zip(requests, together):
        [alone] = _generator(lm).generate([request])
        for batched, single in zip(samples, alone):
            assert batched.token_ids == single.token_ids and batched.text == single.text
            assert (batched.finish_reason, batched.stop_reason) == (single.finish_reason, single.stop_reason)
            assert batched.logprobs == pytest.approx(single.logprobs, abs=1e-5)
            assert [[t for t, _ in top] for top in batched.top_logprobs] == [[t for t, _ in top] for top in single.top_logprobs]


def test_a_finished_row_is_no_longer_fed_through_the_model(lm):
    model, tokenizer = lm
    with _fed(model) as shapes:
        samples = [s for group in _generator(lm).generate(_ragged(tokenizer)) for s in group]
    shared, prefill, *steps = shapes
    assert shared == (1, 1) and prefill[0] == 3  # the token every prompt starts with once, then the 3 prompts' rest
    assert {tokens for _, tokens in steps} == {1}
    rows = [rows for rows, _ in steps]
    assert sum(rows) == sum(len(s.token_ids) - 1 for s in samples)  # each sampled token but a row's last fed once
    assert rows == sorted(rows, reverse=True) and rows[0] == 5 and rows[-1] == 2  # shrinks to the two 40-token rows
