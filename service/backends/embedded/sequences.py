"""Turn ART trajectories into token sequences the embedded policy trains on.

Every assistant turn of a trajectory is trainable (for RL, only the turns that are OpenAI
``Choice`` objects, the ones the policy actually sampled); the rest is context. Sequences
longer than the context are truncated from the left, so the latest turn is always kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from openai.types.chat.chat_completion import Choice

from service.backends.embedded.tokenizer import ASSISTANT, EOT, PAD, encode_text, render_message

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


def _choice_tokens(choice: Choice) -> tuple[list[int], list[float]]:
    content = choice.message.content or ""
    ids = encode_text(content)
    entries = choice.logprobs.content if choice.logprobs and choice.logprobs.content else []
    logprobs = [e.logprob for e in entries] if len(entries) == len(ids) else [NO_LOGPROB] * len(ids)
    # The policy chose to end its turn only when it stopped on <eot>, not on a stop string or the length cap.
    if choice.finish_reason == "stop" and getattr(choice, "stop_reason", None) is None:
        ids, logprobs = [*ids, EOT], [*logprobs, NO_LOGPROB]
    return ids, logprobs


def tokenize_trajectory(messages_and_choices: list, *, train_on_messages: bool) -> TokenSequence:
    """Tokens of a conversation with its trainable mask.

    ``train_on_messages`` also trains on assistant turns given as plain messages (supervised
    demonstrations); for RL only sampled ``Choice`` turns are trainable.
    """
    seq = TokenSequence()
    for item in messages_and_choices:
        if isinstance(item, Choice):
            ids, logprobs = _choice_tokens(item)
            seq.extend([ASSISTANT], False)
            seq.extend(ids, True, logprobs)
        elif isinstance(item, Mapping) and item.get("role") == "assistant" and train_on_messages:
            tokens = render_message(item)
            seq.extend(tokens[:1], False)
            seq.extend(tokens[1:], True)
        elif isinstance(item, Mapping):
            seq.extend(render_message(item), False)
    return seq


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
