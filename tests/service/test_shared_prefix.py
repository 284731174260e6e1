"""Rows that open alike, their opening computed once (shared_prefix.py), on the tiny Llama with LoRA and gradient
checkpointing as the trainer runs it: logprobs, entropies and every LoRA gradient equal those of the rows computed
whole, in float32 to 1e-5; rows that differ early, one row, or a short opening are computed whole."""

from __future__ import annotations

import pytest
import torch

from service.backends.transformers import shared_prefix, training
from service.backends.transformers.engine import PolicyEngine
from tests.tiny_lm import engine_with_adapter

OPENING, ROWS, WIDTH = 150, 4, 230


@pytest.fixture(scope="module")
def engine(tiny_lm, tmp_path_factory) -> PolicyEngine:
    return engine_with_adapter(tmp_path_factory.mktemp("model"), tiny_lm, torch.float32)  # gradients via the opening too


def _rows(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ROWS rows of one opening then their own tokens, the last row ending in padding, packed as ART packs them."""
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (ROWS, WIDTH), generator=generator)
    tokens[:, :OPENING] = tokens[0, :OPENING]
    group_ids = torch.zeros(ROWS, WIDTH, dtype=torch.long)
    group_ids[-1, -20:] = -1  # padding
    tokens[-1, -20:] = -100
    mask = training.packed_attention_mask(group_ids, torch.full_like(group_ids, -2))
    return tokens, mask, torch.arange(WIDTH).expand(ROWS, WIDTH)


def _logprobs_and_gradients(model, tokens, mask, positions):
    model.zero_grad(set_to_none=True)
    model.train()
    new, entropies = training.token_logprobs(model, tokens, mask, positions, entropy=True)
    (new * torch.linspace(-1, 1, WIDTH)).sum().backward()  # every position's logprob weighs in the loss
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.eval()
    return new.detach(), entropies, grads


def test_an_opening_computed_once_gives_the_logprobs_and_gradients_of_the_rows_computed_whole(engine, monkeypatch):
    model = engine.model
    assert shared_prefix.applies(model)
    tokens, mask, positions = _rows(model.config.vocab_size)
    assert shared_prefix.shared_length(tokens, positions, mask) == OPENING
    shared = _logprobs_and_gradients(model, tokens, mask, positions)
    monkeypatch.setattr(shared_prefix, "applies", lambda _: False)
    whole = _logprobs_and_gradients(model, tokens, mask, positions)
    torch.testing.assert_close(shared[0], whole[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared[1], whole[1], atol=1e-4, rtol=1e-4)
    assert shared[2].keys() == whole[2].keys() and any("lora_A" in name for name in whole[2])
    for name, grad in whole[2].items():
        torch.testing.assert_close(shared[2][name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_rows_that_differ_early_one_row_or_a_short_opening_are_computed_whole(engine):
    tokens, mask, positions = _rows(engine.model.config.vocab_size)
    assert shared_prefix.shared_length(tokens[:1], positions[:1], mask[:1]) == 0
    early = tokens.clone()
    early[1, shared_prefix.MIN_SHARED - 1] += 1
    assert shared_prefix.shared_length(early, positions, mask) == 0
    same = tokens[:1].expand(3, -1)
    assert shared_prefix.shared_length(same, positions[:3], mask[:3]) == WIDTH - 1  # a position left to each row
    other_mask = mask.clone()
    other_mask[2, 10, 3] = False  # alike tokens, but a row that reads its opening otherwise
    assert shared_prefix.shared_length(tokens, positions, other_mask) == 0


def test_rows_that_open_alike_go_through_in_runs_that_count_their_opening_once():
    """Twelve email-like rows (an opening of 830 positions, 1,400 in all) run five at a time, where rows computed whole
    run one at a time; rows of a math step (no long opening alike) keep TRAIN_BATCH_TOKENS."""
    tokens = torch.randint(0, 1000, (12, 1400), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(1400).expand(12, 1400)
    whole = training.micro_batches(tokens, positions)
    tokens[:, :830] = tokens[0, :830]
    alike = training.micro_batches(tokens, positions)
    assert len(whole) == 12 and [s.stop - s.start for s in alike] == [5, 5, 2]
    assert (training.SHARED_BATCH_TOKENS - 830) // (1400 - 830) == 5
    math_rows = torch.randint(0, 1000, (4, 512), generator=torch.Generator().manual_seed(1))
    math_rows[:, :100] = math_rows[0, :100]  # a system prompt alike, shorter than MIN_SHARED
    assert len(training.micro_batches(math_rows, torch.arange(512).expand(4, 512))) == 2
