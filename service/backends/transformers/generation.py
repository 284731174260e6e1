"""Batched sampling from a causal LM with the logprob of every sampled token.

Every row of a batch may have its own prompt, temperature, ``top_p``, length, stop strings and seed. Prompts are
encoded once however many rows share them (a group's ``n`` samples, or eight rollouts of one scenario), and the
prefix every prompt shares (a system prompt and few-shot turns) once for the whole batch: on a CPU the prompt is
most of the cost. What an earlier batch encoded (an agent's last turn) is not encoded again (prefix_cache.py), and
samples that finished leave the batch. Returned logprobs are the model's own (temperature 1) log-probabilities of
the sampled tokens, the quantity ART's loss compares the trained policy against, as vLLM reports them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from service.backends.openai_server import Sample
from service.backends.transformers import batch_cache, shared_prefix
from service.backends.transformers.packed_weights import PackedWeights
from service.backends.transformers.precision import adapter_in_base_dtype
from service.backends.transformers.prefix_cache import KV, MAX_BYTES, PrefixCache, States
from service.backends.transformers.sampling_adapter import adapter_as_sampled
from service.backends.transformers.structured import Guide, Matcher


PREFILL_CHUNK = 512  # prompt tokens encoded per forward pass where sampling may be stopped
# Finished rows leave the batch once they are a quarter of it. Leaving copies every live row's cache (the rows kept,
# every layer): an email agent's 64 rows of 1,500 tokens are 2 GB in bf16, and rows that each left alone as they
# finished copied it up to 64 times a turn, a quarter of a validation's time. Until then a finished row is fed a
# hidden token, its share of a step's products.
COMPACT_WHEN_FINISHED = 4
# The logits of each row's last position only. As a tensor, transformers gathers that position into a contiguous
# [rows, 1, hidden]; ``logits_to_keep=1`` slices it as a strided view, and torch's matmul then multiplies it by a copy
# of the head's weight made for every row (32 prompts: a 1.8 GB copy and 1.9 s, where the product takes milliseconds).
LAST_POSITION = torch.tensor([-1])


@dataclass(frozen=True)
class _Opening:
    """The first ``length`` positions of every row of a batch, their states held once (``states``, as attention.py's
    ``shared_states`` reads them) instead of in each row's cache; length 0: none."""

    length: int = 0
    states: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None

    @classmethod
    def of(cls, states: States, length: int) -> _Opening:
        return cls(length, batch_cache.shared_states(states, length))

    @property
    def kwargs(self) -> dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]]:
        """The model call's keywords that hand the attention these states."""
        return {"shared_states": self.states} if self.states is not None else {}

    def before(self, own: KV, start: int) -> KV:
        """A row's states from position ``start`` on, given ``own`` (its cache's, from ``max(start, length)`` on)."""
        if start >= self.length or self.states is None:
            return own
        return [(torch.cat([self.states[layer][0][0, :, start:], keys], dim=1),
                 torch.cat([self.states[layer][1][0, :, start:], values], dim=1))
                for layer, (keys, values) in enumerate(own)]  # fmt: skip


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
    grammar: str | None = None  # llguidance's grammar the reply is held to (structured.py); None: free text


@dataclass
class _Row:
    request: SamplingRequest
    prompt: int  # index into the batch's distinct prompts
    generator: torch.Generator
    sample: Sample
    matcher: Matcher | None = None
    done: bool = False


def _common_prefix(prompts: list[tuple[int, ...]]) -> int:
    """Tokens every prompt starts with, leaving each at least one token of its own (its last logits)."""
    shortest = min(len(p) for p in prompts)
    length = 0
    while length < shortest - 1 and all(p[length] == prompts[0][length] for p in prompts):
        length += 1
    return length


def _nul_tokens(tokenizer: object) -> torch.Tensor:
    """Ids of the tokens whose text holds a NUL character (SmolLM2's byte token for 0x00), never drawn: the API refuses
    NUL in a body (PostgreSQL cannot store it), so an ART client posting such a reply back got a 422 for the service's
    own sample. Their logprobs are still reported from the unmasked distribution, as the trainer computes them."""
    vocabulary = tokenizer.get_vocab()  # type: ignore[attr-defined]
    ids = [i for i in vocabulary.values() if "\x00" in tokenizer.decode([i])]  # type: ignore[attr-defined]
    return torch.tensor(ids, dtype=torch.long)


def _choose(logits: torch.Tensor, rows: list[_Row]) -> list[int]:
    """Each row's next token: its argmax where its temperature is 0, else a draw from softmax(logits / temperature),
    nucleus-truncated where its ``top_p`` < 1, by inverse CDF with one uniform from the row's own generator.

    One batched pass over the vocabulary: ``torch.multinomial`` draws an exponential for every vocabulary entry of
    every row (49,152 a row for SmolLM2), which took a quarter of a sampling batch's time. The draw copies the drawn
    rows' logits only where some rows are greedy, and does not divide by a temperature of 1: each pass over 64 rows'
    vocabulary is a millisecond or more (bench/sampling_draw.py)."""
    drawn = [i for i, row in enumerate(rows) if row.request.temperature > 0]
    if len(drawn) < len(rows):  # greedy rows: an argmax over every row reads less than one over a copy of theirs
        chosen = logits.argmax(dim=-1)
    else:
        chosen = torch.zeros(len(rows), dtype=torch.long, device=logits.device)
    if drawn:
        values = _rows_of(logits, drawn)
        temperatures = torch.tensor([rows[i].request.temperature for i in drawn], device=logits.device)
        # shifted to a maximum of 0 and the temperature kept above 0 in float32: a temperature of 1e-45 or 1e-50
        # (a client may send any in (0, 2]) makes the best token certain instead of NaN probabilities
        shifted = values - values.amax(dim=-1, keepdim=True)
        if bool((temperatures != 1).any()):
            shifted = shifted / temperatures.clamp(min=torch.finfo(torch.float32).tiny).unsqueeze(1)
        probs = torch.softmax(shifted, dim=-1)
        top_p = torch.tensor([rows[i].request.top_p for i in drawn], device=logits.device)
        if bool((top_p < 1).any()):
            probs = _nucleus(probs, top_p)
        cdf = probs.cumsum(dim=-1)
        uniforms = torch.cat([torch.rand(1, generator=rows[i].generator, device=logits.device) for i in drawn])
        # right=True: the first token whose cumulative mass exceeds the draw, never one of probability 0
        picks = torch.searchsorted(cdf, (uniforms * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
        chosen[drawn] = picks.clamp(max=logits.shape[-1] - 1)
    return chosen.tolist()


def _rows_of(logits: torch.Tensor, which: list[int]) -> torch.Tensor:
    """``logits``' rows ``which`` (ascending, distinct): the tensor itself where that is all of them, else a copy."""
    return logits if len(which) == logits.shape[0] else logits[torch.tensor(which, device=logits.device)]


def _nucleus(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Each row's probabilities zeroed outside its smallest most-likely set of mass ``top_p`` (a row at 1 untouched)."""
    ordered, order = torch.sort(probs, dim=-1, descending=True)
    limit = torch.where(top_p < 1, top_p, torch.inf).unsqueeze(1)
    ordered = ordered.masked_fill(torch.cumsum(ordered, dim=-1) - ordered > limit, 0.0)
    return torch.zeros_like(probs).scatter_(1, order, ordered)


class Generator:
    """Samples completions from ``model`` (a causal LM, PEFT-wrapped or not) for token-id prompts."""

    def __init__(self, model: torch.nn.Module, tokenizer: object, *, end_token_ids: set[int],
                 prefix_cache_bytes: int = MAX_BYTES) -> None:  # fmt: skip
        self.model, self.tokenizer, self.end_token_ids = model, tokenizer, end_token_ids
        self._unwritable = _nul_tokens(tokenizer).to(self.device)
        self.prefix_cache = PrefixCache(prefix_cache_bytes)  # 0: every prompt is encoded from its first token
        self.packed = PackedWeights()  # the base weights laid out for decoding, until released before training
        self._guide: Guide | None = None  # built on the first structured request

    def _matcher(self, grammar: str | None) -> Matcher | None:
        if grammar is None:
            return None
        if self._guide is None:
            vocab_size = self.model.get_output_embeddings().weight.shape[0]  # type: ignore[operator]
            self._guide = Guide(self.tokenizer, vocab_size=vocab_size, end_token_ids=self.end_token_ids)
        return self._guide.matcher(grammar)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def generate(
        self, requests: list[SamplingRequest], *, should_stop: Callable[[], bool] | None = None,
        weights: Hashable = None,
    ) -> list[list[Sample]]:  # fmt: skip
        """One list of ``request.n`` samples per request, decoded together. ``should_stop`` (a client gone, a deadline
        passed) is asked before each decoding step and, the shared prompt then encoded ``PREFILL_CHUNK`` tokens at a
        time, before each chunk: once true, what was sampled is returned, the unfinished samples' finish_reason
        ``length``. Finished samples leave the batch once they are a quarter of it (COMPACT_WHEN_FINISHED).
        ``weights`` names the weights sampled from: states cached under other weights are never reused. The model
        computes under the trainer's rule (precision.adapter_in_base_dtype); its adapter's layers skip PEFT's
        per-call work (sampling_adapter.py) to the same values, and a bfloat16 base's products on a CPU read weights
        laid out for them once (packed_weights.py)."""
        with adapter_in_base_dtype(self.model), adapter_as_sampled(self.model, self.packed):
            return self._generate(requests, should_stop, weights)

    def _generate(
        self, requests: list[SamplingRequest], should_stop: Callable[[], bool] | None, weights: Hashable
    ) -> list[list[Sample]]:
        self.prefix_cache.use(weights)
        prompts = list(dict.fromkeys(r.prompt_ids for r in requests))
        rows = [
            _Row(
                request=r,
                prompt=prompts.index(r.prompt_ids),
                generator=torch.Generator(device=self.device).manual_seed((r.seed if r.seed is not None else secrets.randbits(62)) + i),
                sample=Sample(context_tokens=len(r.prompt_ids)),
                matcher=self._matcher(r.grammar),
            )
            for r in requests
            for i in range(r.n)
        ]
        order = [row.prompt for row in rows]
        in_order = order == list(range(len(prompts)))  # a row a prompt: the cache's rows are the batch's as they are
        try:
            room = max(r.max_tokens for r in requests) if in_order else 0  # a reorder copies the cache anyway
            cache, mask, logits, opening = self._prefill(prompts, len(rows), should_stop, room=room)
        except _Stopped:
            return self._samples(requests, rows)
        if not in_order:
            index = torch.tensor(order, device=self.device)
            cache.reorder_cache(index)
            mask, logits = mask[index], logits[index]
        live = rows  # the batch's rows, in the order of the cache's; finished ones stay until compacted
        for _ in range(max(r.max_tokens for r in requests)):
            if should_stop is not None and should_stop():
                break
            active = [i for i, row in enumerate(live) if not row.done]
            self._emit([live[i] for i in active], logits[active] if len(active) < len(live) else logits)
            if ended := [i for i in active if live[i].done]:
                self._remember(live, cache, mask, ended, opening)
            if all(row.done for row in live):
                break
            if sum(row.done for row in live) * COMPACT_WHEN_FINISHED >= len(live):
                keep = [i for i, row in enumerate(live) if not row.done]
                mask = batch_cache.select_rows(cache, mask, torch.tensor(keep, device=self.device))
                live = [live[i] for i in keep]
            # a finished row still in the batch is fed a token its mask hides: nothing reads its states any more
            fed = [(row.sample.token_ids[-1], 1) if not row.done else (0, 0) for row in live]
            tokens = torch.tensor([[token] for token, _ in fed], device=self.device)
            mask = torch.cat([mask, torch.tensor([[seen] for _, seen in fed], dtype=mask.dtype, device=self.device)], dim=1)
            positions = mask.sum(dim=1, keepdim=True) - 1 + opening.length
            out = self.model(input_ids=tokens, attention_mask=mask, position_ids=positions, past_key_values=cache,
                             use_cache=True, **opening.kwargs)  # fmt: skip
            logits = out.logits[:, -1, :].float()
        self._remember(live, cache, mask, [i for i, row in enumerate(live) if not row.done], opening)
        return self._samples(requests, rows)

    def _prefill(
        self, prompts: list[tuple[int, ...]], rows: int, should_stop: Callable[[], bool] | None, *, room: int = 0
    ) -> tuple[DynamicCache, torch.Tensor, torch.Tensor, _Opening]:
        """The cache after every distinct prompt (with ``room`` positions more to decode into), its attention mask,
        each prompt's next-token logits, and the opening the ``rows`` hold apart from the cache.

        Each prompt starts from the longest prefix of it whose states are cached; where the prefix every prompt shares
        is longer, it is encoded once (on top of the longest cached part of it) and copied to every prompt, in chunks
        where ``should_stop`` is given (_Stopped once it is true; a lone prompt is otherwise encoded in one pass). The
        rest is left-padded after it, the padding masked out and skipped by the positions. Where several rows share
        an opening of ``shared_prefix.MIN_SHARED`` tokens or more, its states are held once, outside the cache
        (attention.py's ``shared_states``): the cache and its mask start after it."""
        bases = [self.prefix_cache.longest(p, len(p) - 1) for p in prompts]
        shared = _common_prefix(prompts)
        if shared > min(length for length, _ in bases) and (len(prompts) > 1 or should_stop is not None):
            start, kv = max(((min(length, shared), kv) for length, kv in bases), key=lambda base: base[0])
            prefix = self._encode(prompts[0][:shared], (start, kv), should_stop)
            bases = [(length, kv) if length >= shared else (shared, prefix) for length, kv in bases]
        split = min(shared, *(length for length, _ in bases)) if rows > 1 and shared_prefix.applies(self.model) else 0
        opening = _Opening.of(bases[0][1], split) if split >= shared_prefix.MIN_SHARED else _Opening()
        rests = [p[length:] for p, (length, _) in zip(prompts, bases)]
        width = max(len(r) for r in rests)
        cache, mask = batch_cache.left_padded(bases, self.device, start=opening.length, room=width + room)
        tokens = torch.tensor([[0] * (width - len(r)) + list(r) for r in rests], device=self.device)
        rest_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rests], device=self.device)
        mask = torch.cat([mask, rest_mask], dim=1)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, -width:] + opening.length
        out = self.model(
            input_ids=tokens, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True,
            logits_to_keep=LAST_POSITION, **opening.kwargs,
        )
        return cache, mask, out.logits[:, -1, :].float(), opening

    def _encode(
        self, ids: tuple[int, ...], base: tuple[int, States | None], should_stop: Callable[[], bool] | None
    ) -> States:
        """The states of ``ids``, encoded after ``base`` (the states of its first tokens), ``PREFILL_CHUNK`` tokens
        at a time where ``should_stop`` is given."""
        start, held = base
        cache = batch_cache.growing_cache([(k[None], v[None]) for k, v in held.layers(start)] if start else None)
        chunk = PREFILL_CHUNK if should_stop is not None else len(ids)
        for begin in range(start, len(ids), chunk):
            if should_stop is not None and should_stop():
                raise _Stopped
            piece = torch.tensor([ids[begin : begin + chunk]], device=self.device)
            self.model(input_ids=piece, past_key_values=cache, use_cache=True, logits_to_keep=LAST_POSITION)
        return States.of([(layer.keys[0], layer.values[0]) for layer in cache.layers])

    def _remember(self, rows: list[_Row], cache: DynamicCache, mask: torch.Tensor, which: list[int],
                  opening: _Opening) -> None:  # fmt: skip
        """Keep the states of rows ``which`` (their prompt and the tokens fed after it) for prompts that extend them."""
        if not self.prefix_cache.enabled:
            return
        for i in which:
            prompt = rows[i].request.prompt_ids
            fed = int(mask[i].sum()) + opening.length - len(prompt)
            self.prefix_cache.put(prompt + tuple(rows[i].sample.token_ids[:fed]),
                                  lambda start, i=i: opening.before(batch_cache.row_states(
                                      cache, mask, i, start=max(0, start - opening.length)), start))  # fmt: skip

    def _emit(self, live: list[_Row], logits: torch.Tensor) -> list[int]:
        """Sample each live row's next token from its own generator and record it with its logprob; the rows that
        end (an end token, a stop string, ``max_tokens``) are marked done."""
        logprobs = torch.log_softmax(logits, dim=-1)
        logits.index_fill_(1, self._unwritable, -torch.inf)  # a column each, in place
        for i, row in enumerate(live):
            if row.matcher is not None:
                row.matcher.mask(logits[i])
        chosen = _choose(logits, live)
        picked = logprobs.gather(1, torch.tensor(chosen, device=logits.device).unsqueeze(1)).squeeze(1).tolist()
        for i, (row, token) in enumerate(zip(live, chosen)):
            sample, request = row.sample, row.request
            sample.token_ids.append(token)
            sample.logprobs.append(picked[i])
            if request.top_logprobs:
                values, ids = torch.topk(logprobs[i], request.top_logprobs)
                sample.top_logprobs.append(list(zip(ids.tolist(), values.tolist())))
            if row.matcher is not None:
                row.matcher.advance(token)
            if token in self.end_token_ids:
                sample.finish_reason, row.done = "stop", True
            elif row.matcher is not None and row.matcher.failed:
                row.done = True
            elif request.stop and (hit := self._stop_string(row)) is not None:
                text = self._text(sample)
                sample.text = text[: text.index(hit)]
                sample.finish_reason, sample.stop_reason, row.done = "stop", hit, True
            if len(sample.token_ids) >= request.max_tokens:
                row.done = True
        return chosen

    def _stop_string(self, row: _Row) -> str | None:
        """The first of the row's stop strings in its text, decoding only the tail the newest token can have completed
        a stop string in (a character takes at most 4 byte tokens; the slack covers one re-decoded on the boundary)."""
        stops = row.request.stop
        window = 4 * (max(len(s) for s in stops) + 4)
        tail = self.tokenizer.decode(row.sample.token_ids[-window:], skip_special_tokens=False)
        if not any(s and s in tail for s in stops):
            return None
        text = self._text(row.sample)
        return next((s for s in stops if s and s in text), None)

    def _text(self, sample: Sample) -> str:
        ids = [t for t in sample.token_ids if t not in self.end_token_ids]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _samples(self, requests: list[SamplingRequest], rows: list[_Row]) -> list[list[Sample]]:
        """Each request's samples, their text decoded once (a stop string's cut was set when it was found)."""
        for row in rows:
            if row.sample.stop_reason is None:
                row.sample.text = self._text(row.sample)
        return [[row.sample for row in rows if row.request is r] for r in requests]
