"""Training rows that open alike, their opening computed once. An agent's RL rows are its episodes, one a row, and
every episode of a step opens with the same system prompt and tools (email: 801 of an episode's 1,200-1,570
tokens; a group's episodes share their question too). Under a causal mask a position's states depend only on the
positions before it, so where rows agree on their first P tokens (tokens, positions and the mask among them) those
P positions' states are the same in every row. They are computed once, in one row, keeping each layer's keys and
values; the rows' own positions are then computed against them (``sdpa_grouped`` attention lays the kept keys and
values before each row's own). Gradients from every row flow back into the one opening, so the forward, the
backward and the gradients are those of the rows computed whole (tested to 1e-5 in float32), at P fewer positions a
row after the first.

Gradient checkpointing recomputes a layer's forward from its arguments; the kept keys and values reach the attention
as arguments (transformers passes a model's extra keywords down to it), so a recompute sees them again.
"""

from __future__ import annotations

from typing import Any

import torch

from service.backends.transformers import attention

MIN_SHARED = 128  # positions: below this, the bookkeeping costs more than the positions it saves


def shared_length(tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> int:
    """P, the positions every row holds alike (tokens, positions, and the mask among them), at most all but the last;
    0 for one row or where P < MIN_SHARED."""
    length = alike_length(tokens, positions)
    if length < MIN_SHARED or not bool((mask[:, :length, :length] == mask[:1, :length, :length]).all()):
        return 0
    return length


def alike_length(tokens: torch.Tensor, positions: torch.Tensor) -> int:
    """The positions every row holds alike by token and position, at most all but the last; 0 for one row."""
    if tokens.shape[0] < 2:
        return 0
    alike = ((tokens == tokens[:1]) & (positions == positions[:1])).all(dim=0)
    return min(int(alike.int().cumprod(dim=0).sum()), tokens.shape[1] - 1)


def computed_positions(tokens: torch.Tensor, positions: torch.Tensor) -> int:
    """The positions a pass over these rows computes: an opening of at least MIN_SHARED alike in every row, once."""
    rows, width = tokens.shape
    shared = alike_length(tokens, positions)
    return shared + rows * (width - shared) if shared >= MIN_SHARED else rows * width


def applies(model: torch.nn.Module) -> bool:
    """Whether the model's attention is the one that reads kept keys and values (the CPU's ``sdpa_grouped``)."""
    return getattr(model.config, "_attn_implementation", None) == attention.NAME


def hidden_states(
    backbone: torch.nn.Module, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, length: int
) -> torch.Tensor:
    """The backbone's last hidden states of every row, as one call over the rows would give them, the first
    ``length`` positions (alike in every row: ``shared_length``) computed once."""
    kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    opening = run(backbone, tokens[:1, :length], mask[:1, :length, :length], positions[:1, :length], keep_prefix=kept)
    rest = run(backbone, tokens[:, length:], mask[:, length:, :], positions[:, length:], shared_prefix=kept)
    return torch.cat([opening.expand(tokens.shape[0], -1, -1), rest], dim=1)


def run(backbone: torch.nn.Module, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
        **prefix: Any) -> torch.Tensor:  # fmt: skip
    """The backbone's last hidden states of ``tokens`` under ``mask`` ([rows, positions, keys]), which the attention
    reads as converted once before the pass (``attention.converted_mask``)."""
    mask = mask.unsqueeze(1)
    return backbone(input_ids=tokens.clamp(min=0), attention_mask=mask, position_ids=positions, use_cache=False,
                    sdpa_reads=attention.converted_mask(backbone, mask), **prefix).last_hidden_state  # fmt: skip
