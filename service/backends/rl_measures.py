"""What an RL step measures besides its loss: how far the policy is from its reference (the KL the step's record and
the ``kl_spike`` alert read) and how well the sampler's probabilities match the trainer's (ART's ``probs_corr``).

Both are instruments, so both are computed exactly rather than estimated from a few tokens:

- The KL is summed over the vocabulary at each trained position, from the two distributions the step computes anyway.
  It was estimated from the sampled tokens alone (k3, ``exp(r) - r - 1`` with ``r`` the reference's log-probability
  minus the policy's, as much GRPO code does and the embedded backend's penalty still does; ART's loss, with its
  penalty on, takes the mean of ``-r``). Such an estimate is unbiased only over tokens drawn from the policy itself,
  and k3's tail is heavy: one reply token the policy finds 10 nats less likely than the reference does (a rare draw,
  or a token a tool-call grammar forced) adds e^10 to the sum. An email job's KL so read 0.002 nats at step 7 and
  21.07 at step 8, and fired ``kl_spike``, while the step's ``probs_corr`` (0.9988) and mean reward were in line with
  the steps before it.
- ``probs_corr`` is one correlation over all of a step's sampled tokens. ART's loss computes it a micro-batch at a time;
  a mean of those must skip the micro-batches where it is undefined (fewer than two sampled tokens, or one side
  constant), and a step without any sampled logprob read 0.0.
"""

from __future__ import annotations

import math

import torch
from art.loss import shift_tensor


def exact_kl(log_probs: torch.Tensor, reference_log_probs: torch.Tensor) -> torch.Tensor:
    """KL(policy ‖ reference) of each position's next-token distribution (log-softmaxes over the vocabulary in, the
    last dimension summed out), over the whole vocabulary; a token the policy cannot emit (-inf) adds 0."""
    probs = log_probs.exp()
    return torch.where(probs > 0, probs * (log_probs - reference_log_probs), 0.0).sum(-1)


def mean_over_trained(values: torch.Tensor, assistant_mask: torch.Tensor) -> float:
    """The mean of ``values`` (one per position) at the positions that predict a trained token, as ART's loss aligns
    them; 0.0 where none does."""
    predicting = shift_tensor(assistant_mask, False).bool()
    return float(values[predicting].mean()) if predicting.any() else 0.0


def sampled_probs(inputs: dict[str, torch.Tensor], new: torch.Tensor) -> torch.Tensor:
    """The sampler's and the trainer's probabilities (2 × tokens) of a micro-batch's tokens that carry a sampled
    logprob, aligned as ART's loss aligns them."""
    old = shift_tensor(inputs["logprobs"], float("nan"))
    at = ~torch.isnan(old)
    return torch.stack([old[at].double().exp(), new[at].double().exp()])


def probs_corr(sampled: list[torch.Tensor]) -> float | None:
    """The correlation of the two sides' probabilities over all of a step's sampled tokens (``sampled_probs`` of each
    micro-batch); None where it is undefined."""
    probs = torch.cat(sampled, dim=1) if sampled else torch.empty(2, 0, dtype=torch.float64)
    if probs.shape[1] < 2:
        return None
    corr = torch.corrcoef(probs)[0, 1].item()
    return None if math.isnan(corr) else corr
