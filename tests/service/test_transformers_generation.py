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


def test_a_batch_of_games_sharing_an_opening_encodes_only_each_games_new_tokens_at_its_next_turn(lm):
    """A cache bound that holds the batch's turns only when their shared opening is stored once (as a batch of 2048
    games or email episodes needs) still serves every game's next turn from its states."""
    model, tokenizer = lm
    opening = _turns(tokenizer)[0] * 6  # a long shared prefix, as a system prompt and few-shot turns are
    boards = [tuple(tokenizer.encode(f"<|im_start|>user\nboard {game}<|im_end|>\n")) for game in range(8)]
    key_proj = model.model.layers[0].self_attn.k_proj
    per_token = 2 * sum(p.numel() for p in key_proj.parameters()) // model.config.hidden_size
    bound = (len(opening) + 8 * 40) * per_token * 4 * model.config.num_hidden_layers  # float32 keys and values
    assert bound < 8 * len(opening) * per_token * 4 * model.config.num_hidden_layers  # not 8 whole openings
    generator = Generator(model, tokenizer, end_token_ids=chat.end_token_ids(tokenizer), prefix_cache_bytes=bound)
    first = [SamplingRequest(prompt_ids=opening + board, max_tokens=4, seed=i) for i, board in enumerate(boards)]
    replies = [tuple(samples[0].token_ids) for samples in generator.generate(first)]
    second = [SamplingRequest(prompt_ids=r.prompt_ids + reply + boards[0], max_tokens=1, seed=1)
              for r, reply in zip(first, replies)]  # fmt: skip
    with _fed(model) as shapes:
        generator.generate(second)
    assert shapes[0] == (8, 1 + len(boards[0]))  # the reply's last token (never fed) and the new board, every game


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


def _states(ids: tuple[int, ...]):
    """What ``PrefixCache.put`` asks for: the states of ``ids`` from a position on, 2 layers x (keys, values) x 1 head x
    4 dims of float32 (32 bytes a token, 64 with the values), each state holding its token."""

    def states_from(start: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        tokens = torch.tensor(ids[start:], dtype=torch.float32)[None, :, None].expand(1, -1, 4)
        return [(tokens.clone(), torch.zeros(1, len(ids) - start, 4)) for _ in range(2)]

    return states_from


def _held_tokens(cache, ids: tuple[int, ...]) -> list[int]:
    """The tokens the states ``cache`` holds for ``ids`` (its longest prefix) were made of, read from the keys."""
    length, states = cache.longest(ids, len(ids))
    return [] if states is None else [int(t) for t in states.layers(length)[1][0][0, :, 0]]


def test_the_prefix_cache_keeps_the_longest_entries_within_its_bound():
    from service.backends.transformers.prefix_cache import PrefixCache

    cache = PrefixCache(max_bytes=64 * 10)  # 10 tokens
    cache.put((1, 2, 3), _states((1, 2, 3)))
    cache.put((1, 2, 3, 4, 5), _states((1, 2, 3, 4, 5)))  # extends the first: replaces it, sharing its states
    assert len(cache) == 1 and cache.nbytes == 64 * 5
    length, states = cache.longest((1, 2, 3, 9), limit=3)
    assert length == 3 and states.length == 5  # the longer entry, only its first 3 states are the prompt's
    assert _held_tokens(cache, (1, 2, 3, 4, 5, 6)) == [1, 2, 3, 4, 5]
    cache.put((7, 8, 9), _states((7, 8, 9)))
    assert cache.longest((1, 2), limit=9)[0] == 2  # a limit past the prompt is the prompt's length
    cache.longest((1, 2), limit=1)  # (1, 2, 3, 4, 5) used last: (7, 8, 9) goes first
    cache.put((5, 6, 7), _states((5, 6, 7)))
    assert len(cache) == 2 and cache.longest((7, 8, 9, 1), limit=3) == (0, None) and cache.nbytes == 64 * 8
    cache.put(tuple(range(100, 111)), _states(tuple(range(100, 111))))  # more than the whole bound: not kept
    assert len(cache) == 2 and cache.longest((5, 6, 7), limit=2)[0] == 2
    cache.use("other weights")
    assert len(cache) == 0 and cache.nbytes == 0


def test_entries_that_share_an_opening_hold_its_states_once_and_each_turn_adds_only_its_own():
    """100 games' openings filled a bound that holds their turns: a batch of agents evicted one another and every game
    was encoded from its first token at every turn."""
    from service.backends.transformers.prefix_cache import PrefixCache

    opening = tuple(range(1, 21))  # 20 tokens, shared by every game
    cache = PrefixCache(max_bytes=64 * 60)
    games = [opening + (100 + game, 200 + game) for game in range(10)]
    for ids in games:
        cache.put(ids, _states(ids))
    assert len(cache) == 10 and cache.nbytes == 64 * (20 + 10 * 2)  # stored whole, 10 x 22 tokens: past the bound
    turn = games[3] + (300, 301, 302)  # the game's next turn extends its entry: only the new tokens are stored
    cache.put(turn, _states(turn))
    assert len(cache) == 10 and cache.nbytes == 64 * (20 + 10 * 2 + 3)
    assert _held_tokens(cache, turn + (9,)) == list(turn) and _held_tokens(cache, games[7]) == list(games[7])
    other = opening + (999,) * 20
    cache.put(other, _states(other))  # 20 new tokens: 63 held, so the two least recently used games go (2 each)
    assert len(cache) == 9 and cache.nbytes == 64 * 59 and _held_tokens(cache, other) == list(other)
    assert _held_tokens(cache, turn) == list(turn)  # the opening stays while any entry holds it


def test_the_prefix_cache_keeps_at_most_max_entries_however_small():
    from service.backends.transformers import prefix_cache

    cache = prefix_cache.PrefixCache(max_bytes=1 << 30)
    for first in range(prefix_cache.MAX_ENTRIES + 10):  # one-token entries: far under the byte bound
        cache.put((first,), _states((first,)))
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


def test_a_token_whose_text_holds_a_nul_is_never_drawn_even_when_the_model_wants_it(lm):
    """The API refuses NUL in a body, so a reply holding one could not be posted back by an ART client."""
    model, tokenizer = lm
    [nul] = [i for i in tokenizer.get_vocab().values() if "\x00" in tokenizer.decode([i])]
    head = model.get_output_embeddings()
    hook = head.register_forward_hook(lambda _, args, out: out.index_fill(-1, torch.tensor([nul]), 100.0))
    try:
        prompt = tuple(tokenizer.encode("Say one word."))
        requests = [SamplingRequest(prompt_ids=prompt, n=4, max_tokens=6, seed=1),
                    SamplingRequest(prompt_ids=prompt, max_tokens=6, temperature=0)]
        samples = [s for batch in _generator(lm).generate(requests) for s in batch]
    finally:
        hook.remove()
    assert samples and all(nul not in s.token_ids and "\x00" not in s.text for s in samples)
