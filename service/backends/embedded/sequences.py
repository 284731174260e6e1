"""Turn ART trajectories into the token windows the embedded policy trains on.

Every assistant turn of a trajectory is trained (for RL, only the turns that are OpenAI
``Choice`` objects, the ones the policy actually sampled); the rest is context, except what the
policy never sees (system prompts and few-shot example turns, see the tokenizer). A conversation
longer than the context is cut into windows, each ending with the turns it trains and starting
as far left as the policy could see:

- a sampled turn gets exactly the context it was sampled with (the server reports how many
  prompt tokens it kept as ``context_tokens``), so the trainer's logprobs match the sampler's;
- a demonstration turn gets the context the server would keep (:func:`prompt_budget`), so it
  is learned at the positions where it will be sampled.

Consecutive turns share a window whenever they would have seen the same tokens, which for
short conversations means one window for the whole trajectory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from art.trajectories import get_messages
from openai.types.chat.chat_completion import Choice

from service.backends.embedded.tokenizer import EOT, PAD, encode_text, policy_sees, prompt_budget, render_message

NO_LOGPROB = math.nan  # a trainable token whose sampling logprob the server did not return


@dataclass
class TokenSequence:
    ids: list[int] = field(default_factory=list)
    trainable: list[bool] = field(default_factory=list)
    old_logprobs: list[float] = field(default_factory=list)  # per token; NaN where unknown
    advantage: float = 0.0

    def extend(self, ids: list[int], trainable: bool, logprobs: list[float] | None = None) -> None:
        self.ids.extend(ids)
        self.trainable.extend([trainable] * len(ids))
        self.old_logprobs.extend(logprobs if logprobs is not None else [NO_LOGPROB] * len(ids))

    def truncated(self, block_size: int) -> TokenSequence:
        """The last ``block_size + 1`` tokens (inputs and shifted targets fit the context)."""
        keep = block_size + 1
        return TokenSequence(self.ids[-keep:], self.trainable[-keep:], self.old_logprobs[-keep:], self.advantage)

    def trainable_tokens(self) -> int:
        return sum(self.trainable[1:])  # the first token is never a target


@dataclass(frozen=True)
class _Turn:
    """One trainable assistant turn: what the policy emitted, and what it saw before."""

    prefix_end: int  # end of the rendered conversation before the turn, generation prompt included
    context: int | None  # prompt tokens the sampler kept; None for a demonstration
    ids: list[int]
    logprobs: list[float]


def _choice_turn(choice: Choice) -> tuple[list[int], list[float]]:
    """The tokens the policy emitted in a sampled turn, read from its logprobs when present.

    The logprobs list every emitted character, tool-call text included; the message content
    alone loses what the server parsed into ``tool_calls``.
    """
    entries = choice.logprobs.content if choice.logprobs and choice.logprobs.content else []
    if entries:
        ids = encode_text("".join(e.token for e in entries))
        logprobs = [e.logprob for e in entries] if len(ids) == len(entries) else [NO_LOGPROB] * len(ids)
    else:
        ids = render_message(get_messages([choice])[0])[1:-1]
        logprobs = [NO_LOGPROB] * len(ids)
    # The policy chose to end its turn only when it stopped on <eot>, not on a stop string or the length cap.
    if choice.finish_reason in ("stop", "tool_calls") and getattr(choice, "stop_reason", None) is None:
        ids, logprobs = [*ids, EOT], [*logprobs, NO_LOGPROB]
    return ids, logprobs


def _context_of(choice: Choice) -> int | None:
    value = getattr(choice, "context_tokens", None)
    return value if isinstance(value, int) and value > 0 else None


def _render_with_turns(messages_and_choices: Sequence, train_on_messages: bool) -> tuple[list[int], list[_Turn]]:
    """The conversation as the server renders it for the next turn, and the trainable turns in it."""
    stream: list[int] = []
    turns: list[_Turn] = []
    for item in messages_and_choices:
        if isinstance(item, Choice):
            rendered = render_message(get_messages([item])[0])
            ids, logprobs = _choice_turn(item)
            turns.append(_Turn(len(stream) + 1, _context_of(item), ids, logprobs))
        elif isinstance(item, Mapping):
            if not policy_sees(item):  # system prompts and few-shot examples: neither context nor trained
                continue
            rendered = render_message(item)
            if item.get("role") == "assistant" and train_on_messages:
                turns.append(_Turn(len(stream) + 1, None, rendered[1:], [NO_LOGPROB] * (len(rendered) - 1)))
        else:
            continue
        stream.extend(rendered)
    return stream, turns


def trajectory_windows(messages_and_choices: Sequence, *, block_size: int, train_on_messages: bool) -> list[TokenSequence]:
    """Token windows of at most ``block_size + 1`` tokens that together train every turn once.

    ``train_on_messages`` also trains on assistant turns given as plain messages (supervised
    demonstrations); for RL only sampled ``Choice`` turns are trainable.
    """
    stream, turns = _render_with_turns(messages_and_choices, train_on_messages)
    limit = block_size + 1
    windows: list[TokenSequence] = []
    window: TokenSequence | None = None  # the open window, while it still reproduces the stream
    start = end = 0  # the stream span the open window reproduces
    for turn in turns:
        span = len(turn.ids)
        # A sampled turn saw what the server kept; a demonstration gets what the server would keep.
        context = turn.context if turn.context is not None else prompt_budget(block_size, span)
        turn_start = turn.prefix_end - min(context, turn.prefix_end)
        fits_open = window is not None and turn.prefix_end - start + span <= limit
        if not (fits_open and turn_start == start):
            window = TokenSequence()
            windows.append(window)
            start = end = turn_start
        assert window is not None
        window.extend(stream[end : turn.prefix_end], False)
        window.extend(turn.ids, True, turn.logprobs)
        end = turn.prefix_end + span
        if stream[turn.prefix_end : end] != turn.ids:  # rendered back differently: later turns saw other tokens
            window = None
    return windows


@dataclass
class Batch:
    inputs: torch.Tensor  # (B, T) token ids
    targets: torch.Tensor  # (B, T) next-token ids
    mask: torch.Tensor  # (B, T) 1.0 where the target is trainable
    old_logprobs: torch.Tensor  # (B, T) NaN where unknown
    advantages: torch.Tensor  # (B,)


def collate(sequences: list[TokenSequence], block_size: int) -> Batch:
    """Right-padded tensors for a list of sequences, each truncated to the context."""
    seqs = [s.truncated(block_size) for s in sequences]
    width = max(len(s.ids) for s in seqs) - 1
    inputs = torch.full((len(seqs), width), PAD, dtype=torch.long)
    targets = torch.full((len(seqs), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(seqs), width))
    old = torch.full((len(seqs), width), NO_LOGPROB)
    for row, s in enumerate(seqs):
        n = len(s.ids) - 1
        inputs[row, :n] = torch.tensor(s.ids[:-1])
        targets[row, :n] = torch.tensor(s.ids[1:])
        mask[row, :n] = torch.tensor(s.trainable[1:], dtype=torch.float)
        old[row, :n] = torch.tensor(s.old_logprobs[1:], dtype=torch.float)
    advantages = torch.tensor([s.advantage for s in seqs], dtype=torch.float)
    return Batch(inputs, targets, mask, old, advantages)
