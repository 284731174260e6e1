"""The transformers backend's batched sampler on the tiny Llama: a row decodes in a batch as it would alone, and
finished rows leave the batch."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from service.backends.transformers import chat
from service.backends.transformers.generation import COMPACT_WHEN_FINISHED, Generator, SamplingRequest


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
    hook = model.register_forward_hook(lambda _, a, kw, o: shapes.append(kw["input_ids"].shape), with_kwargs=True)
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
            assert [[t for t, _ in top] for top in batched.top_logprobs] == [
                [t for t, _ in top] for top in single.top_logprobs
            ]


def _rows_fed(lengths: list[int]) -> list[int]:
    """The batch's rows at each decoding step, for samples of ``lengths``: a row that finished stays until the
    finished ones are a quarter of the batch (COMPACT_WHEN_FINISHED), then they all leave."""
    live, fed = list(lengths), []
    for k in range(1, max(lengths)):
        if sum(length <= k for length in live) * COMPACT_WHEN_FINISHED >= len(live):
            live = [length for length in live if length > k]
        fed.append(len(live))
    return fed


def test_finished_rows_leave_the_batch_once_they_are_a_quarter_of_it(lm):
    model, tokenizer = lm
    with _fed(model) as shapes:
        samples = [s for group in _generator(lm).generate(_ragged(tokenizer)) for s in group]
    shared, prefill, *steps = shapes
    assert shared == (1, 1) and prefill[0] == 3  # the token every prompt starts with once, then the 3 prompts' rest
    assert {tokens for _, tokens in steps} == {1}
    rows = [rows for rows, _ in steps]
    assert rows == _rows_fed([len(s.token_ids) for s in samples])
    assert rows[0] == 5 and rows[-1] == 2 and [len(s.token_ids) for s in samples[1:3]] == [40, 40]  # the two longest


def _turns(tokenizer) -> list[tuple[int, ...]]:
    """Three turns' new tokens: a question, then two tool answers."""
    return [tuple(tokenizer.encode(text)) for text in (
        "<|im_start|>user\nFind the email about the budget meeting.<|im_end|>\n<|im_start|>assistant\n",
        "<|im_end|>\n<|im_start|>tool\n3 results: budget.eml, q3.eml, lunch.eml<|im_end|>\n<|im_start|>assistant\n",
        "<|im_end|>\n<|im_start|>tool\nFrom: Ann. The meeting moved to Friday.<|im_end|>\n<|im_start|>assistant\n",
    )]  # fmt: skip


def test_a_turn_that_extends_the_last_gives_the_same_sample_encoding_only_its_new_tokens(lm):
    model, tokenizer = lm
    cached = _generator(lm)
    fresh = Generator(model, tokenizer, end_token_ids=chat.end_token_ids(tokenizer), prefix_cache_bytes=0)
    prompt: tuple[int, ...] = ()
    for turn, new in enumerate(_turns(tokenizer)):
        prompt += new
        request = SamplingRequest(prompt_ids=prompt, n=2, max_tokens=6 + 3 * turn, seed=turn)
        with _fed(model) as shapes:
            with_cache = cached.generate([request])[0]
        without = fresh.generate([request])[0]
        for a, b in zip(with_cache, without):
            assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        known = 0 if turn == 0 else len(prompt) - len(new) - 1  # the last turn's reply but its last token, never fed
        decoded = sum(len(s.token_ids) - 1 for s in with_cache)
        assert sum(rows * tokens for rows, tokens in shapes) == len(prompt) - known + decoded
        prompt += tuple(with_cache[0].token_ids)


def test_states_computed_with_other_weights_are_never_reused(lm):
    model, tokenizer = lm
    generator = _generator(lm)
    first = _turns(tokenizer)[0]
    [[reply]] = generator.generate([SamplingRequest(prompt_ids=first, max_tokens=4, seed=1)], weights="step-1")
    follow_up = first + tuple(reply.token_ids) + _turns(tokenizer)[1]
    assert generator.prefix_cache.longest(follow_up, len(follow_up))[0] == len(first) + 3
    with _fed(model) as shapes:
        generator.generate([SamplingRequest(prompt_ids=follow_up, max_tokens=1)], weights="step-2")
    assert sum(tokens for _, tokens in shapes) == len(follow_up)


def test_the_engine_reuses_a_conversations_states_until_a_training_step_changes_the_weights(tiny_lm, tmp_path):
    import art

    from service.backends.transformers.engine import LoraSettings, PolicyEngine

    engine = PolicyEngine(tmp_path / "model", tiny_lm, lora=LoraSettings(rank=8))
    turns = _turns(engine.tokenizer)
    [[reply]] = engine.generate([SamplingRequest(prompt_ids=turns[0], max_tokens=4, seed=1)])
    follow_up = turns[0] + tuple(reply.token_ids) + turns[1]
    with _fed(engine.model) as reused:
        engine.generate([SamplingRequest(prompt_ids=follow_up, max_tokens=1)])
    assert sum(tokens for _, tokens in reused) == len(turns[1]) + 1
    messages = [{"role": "user", "content": "Find the budget email."}, {"role": "assistant", "content": "budget.eml"}]
    engine.sft_step([art.Trajectory(messages_and_choices=messages, reward=0.0)], learning_rate=1e-3)
    with _fed(engine.model) as after_training:
        engine.generate([SamplingRequest(prompt_ids=follow_up + (42,), max_tokens=1)])
    assert sum(tokens for _, tokens in after_training) == len(follow_up) + 1


def test_the_prefix_cache_keeps_the_longest_entries_within_its_bound():
    from service.backends.transformers.prefix_cache import PrefixCache

    def states(length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:  # 2 layers x 2 x 1 head x 4 dims x 4 bytes
        return [(torch.full((1, length, 4), float(length)), torch.zeros(1, length, 4)) for _ in range(2)]

    cache = PrefixCache(max_bytes=64 * 10)  # 10 tokens
    cache.put((1, 2, 3), states(3))
    cache.put((1, 2, 3, 4, 5), states(5))  # extends the first: replaces it
    assert len(cache) == 1 and cache.nbytes == 64 * 5
    length, kv = cache.longest((1, 2, 3, 9), limit=3)
    assert length == 3 and kv[0][0].shape == (1, 5, 4)  # the longer entry, only its first 3 states are the prompt's
    cache.put((7, 8, 9), states(3))
    cache.longest((1, 2), limit=1)  # (1, 2, 3, 4, 5) used last: (7, 8, 9) goes first
    cache.put((5, 6, 7), states(3))
    assert len(cache) == 2 and cache.longest((7, 8, 9, 1), limit=3) == (0, None) and cache.nbytes == 64 * 8
    cache.put(tuple(range(100, 111)), states(11))  # more than the whole bound: not kept, nothing evicted
    assert len(cache) == 2 and cache.longest((5, 6, 7), limit=2)[0] == 2
    cache.use("other weights")
    assert len(cache) == 0 and cache.nbytes == 0


def test_the_prefix_cache_keeps_at_most_max_entries_however_small():
    from service.backends.transformers import prefix_cache

    cache = prefix_cache.PrefixCache(max_bytes=1 << 30)
    for first in range(prefix_cache.MAX_ENTRIES + 10):  # one-token entries: far under the byte bound
        cache.put((first,), [(torch.zeros(1, 1, 4), torch.zeros(1, 1, 4))])
    assert len(cache) == prefix_cache.MAX_ENTRIES and cache.longest((0, 5), limit=1) == (0, None)  # the oldest went


def _rows(count: int, *, temperature: float = 1.0, top_p: float = 1.0) -> list:
    from service.backends.openai_server import Sample
    from service.backends.transformers.generation import _Row

    request = SamplingRequest(prompt_ids=(1,), temperature=temperature, top_p=top_p)
    return [_Row(request, 0, torch.Generator().manual_seed(seed), Sample()) for seed in range(count)]


def test_tokens_are_drawn_in_proportion_to_their_probabilities():
    """Inverse-CDF draws, one uniform a row: over 4,000 rows each token's share is its softmax probability (within
    5 standard errors), and a token of probability 0 is never drawn, at either end of the vocabulary."""
    from service.backends.transformers.generation import _choose

    probs = torch.tensor([0.0, 0.1, 0.0, 0.6, 0.3, 0.0])
    logits = probs.log().expand(4000, -1).clone()
    counts = torch.bincount(torch.tensor(_choose(logits, _rows(4000))), minlength=6).float() / 4000
    assert counts[[0, 2, 5]].sum() == 0
    assert torch.all((counts - probs).abs() <= 5 * (probs * (1 - probs) / 4000).sqrt() + 1e-9), counts


def test_temperature_top_p_and_greedy_rows_are_chosen_side_by_side():
    from service.backends.transformers.generation import _choose

    logits = torch.tensor([2.0, 1.0, 0.5, 0.0]).expand(3000, -1).clone()
    nucleus = _choose(logits, _rows(3000, top_p=0.7))  # p = 0.61, 0.22, 0.14, 0.03: the top two hold 0.83
    assert set(nucleus) == {0, 1}
    greedy = _choose(logits[:5], _rows(5, temperature=0))
    assert greedy == [0] * 5
    hot, cold = (torch.bincount(torch.tensor(_choose(logits, _rows(3000, temperature=t))), minlength=4)
                 for t in (3.0, 0.3))
    assert hot[0] < 1500 < cold[0]  # p(0) is 0.42 at temperature 3, 0.96 at 0.3
    tiny = _choose(logits[:3], _rows(1, temperature=1e-45) + _rows(1, temperature=1e-50) + _rows(1, temperature=1e-8))
    assert tiny == [0, 0, 0]  # a temperature too small for float32 is greedy, not NaN probabilities
    mixed = _rows(2, temperature=0) + _rows(2)
    assert _choose(logits[:4], mixed)[:2] == [0, 0]


def test_a_rows_draw_depends_only_on_its_own_generator():
    from service.backends.transformers.generation import _choose

    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(3))
    alone = [_choose(logits[i : i + 1], _rows(8)[i : i + 1])[0] for i in range(8)]
    assert _choose(logits, _rows(8)) == alone


def test_the_head_multiplies_only_each_rows_last_state_laid_out_contiguously(lm):
    """A strided [rows, 1, hidden] slice sends torch's matmul down a path that copies the head's weight for every row
    (1.8 GB and 1.9 s for 32 prompts of SmolLM2): the prefill hands the head a contiguous last position."""
    model, tokenizer = lm
    seen: list[tuple[tuple[int, ...], bool]] = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda _, args, out: seen.append((tuple(args[0].shape), args[0].is_contiguous()))
    )
    try:
        _generator(lm).generate(_ragged(tokenizer))
    finally:
        hook.remove()
    assert all(contiguous and shape[1] == 1 for shape, contiguous in seen), seen


def test_a_growing_cache_holds_what_transformers_cache_holds_and_writes_decoded_states_in_place():
    from transformers import DynamicCache

    from service.backends.transformers.batch_cache import growing_cache

    torch.manual_seed(0)

    def states(length: int, rows: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.randn(rows, 2, length, 4), torch.randn(rows, 2, length, 4)) for _ in range(2)]

    def both_take(new) -> None:
        for layer, (keys, values) in enumerate(new):
            grown, plain = growing.update(keys, values, layer), reference.update(keys, values, layer)
            assert all(torch.equal(a, b) for a, b in zip(grown, plain))

    first = states(5)
    growing, reference = growing_cache(first), DynamicCache(first)
    places = []
    for _ in range(4):  # decoding: one position a step
        both_take(states(1))
        places.append(growing.layers[0].keys.data_ptr())
    assert len(set(places)) == 1  # written where the states already were, not copied anew
    index = torch.tensor([2, 0])  # rows finished and left
    growing.batch_select_indices(index)
    reference.batch_select_indices(index)
    both_take(states(1, rows=2))
    both_take(states(300, rows=2))  # past the buffer's room: made again, larger
    assert growing.get_seq_length() == reference.get_seq_length() == 5 + 4 + 1 + 300
