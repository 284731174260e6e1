"""The two training objectives of the embedded policy: supervised warm start and GRPO.

GRPO here follows the usual recipe: rewards are normalised within each trajectory group
(groups whose rewards are all equal carry no signal and are skipped), and each sampled token is
updated with a PPO-style clipped importance ratio against the logprob the server returned when
it sampled it, plus an optional KL penalty to the warm-start reference (the k3 estimator).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from service.backends.embedded.policy import CharGPT
from service.backends.embedded.sequences import Batch


def token_logprobs(policy: CharGPT, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of each target token (B, T) and the full distributions (B, T, V)."""
    logits, _ = policy(batch.inputs)
    logprobs = policy.output_logprobs(logits)
    chosen = logprobs.gather(-1, batch.targets[..., None]).squeeze(-1)
    return chosen.masked_fill(batch.mask == 0, 0.0), logprobs  # padding targets are -inf: zero them


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def entropy(distributions: torch.Tensor) -> torch.Tensor:
    """Per-position entropy in nats of log-probability rows (-inf entries contribute 0)."""
    probs = distributions.exp()
    return -(probs * distributions.nan_to_num(neginf=0.0)).sum(-1)


def sft_loss(policy: CharGPT, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean negative log-likelihood of the trainable tokens."""
    chosen, _ = token_logprobs(policy, batch)
    loss = -masked_mean(chosen, batch.mask)
    return loss, {"loss": float(loss.detach()), "trainable_tokens": float(batch.mask.sum())}


def group_advantages(rewards: Iterable[float], *, scale: bool = True) -> list[float] | None:
    """Group-normalised advantages, or None for a group with no reward variance."""
    values = torch.tensor(list(rewards), dtype=torch.float64)
    if len(values) < 2 or bool((values == values[0]).all()):
        return None
    centred = values - values.mean()
    if scale:
        centred = centred / (values.std(unbiased=False) + 1e-6)
    return centred.tolist()


@dataclass(frozen=True)
class GRPOConfig:
    epsilon: float = 0.2  # clip range of the importance ratio
    kl_penalty_coef: float = 0.0  # weight of the KL-to-reference penalty in the loss


def grpo_loss(
    policy: CharGPT, reference: CharGPT | None, batch: Batch, config: GRPOConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped policy-gradient loss over the trainable tokens of ``batch``, with diagnostics."""
    new, distributions = token_logprobs(policy, batch)
    old = torch.where(batch.old_logprobs.isnan(), new.detach(), batch.old_logprobs)
    ratio = (new - old).exp()
    advantages = batch.advantages[:, None]
    unclipped = ratio * advantages
    clipped = ratio.clamp(1 - config.epsilon, 1 + config.epsilon) * advantages
    policy_loss = -masked_mean(torch.minimum(unclipped, clipped), batch.mask)

    kl = torch.zeros_like(new)
    if reference is not None:
        with torch.no_grad():
            ref, _ = token_logprobs(reference, batch)
        log_ratio = ref - new
        kl = log_ratio.exp() - log_ratio - 1  # k3: unbiased, non-negative estimate of KL(policy || ref)
    kl_mean = masked_mean(kl, batch.mask)
    loss = policy_loss + config.kl_penalty_coef * kl_mean

    with torch.no_grad():
        clip_fraction = masked_mean(((ratio - 1).abs() > config.epsilon).float(), batch.mask)
        metrics = {
            "loss": float(loss.detach()),
            "policy_loss": float(policy_loss.detach()),
            "kl": float(kl_mean.detach()),
            "entropy": float(masked_mean(entropy(distributions), batch.mask)),
            "clip_fraction": float(clip_fraction),
            "ratio_mean": float(masked_mean(ratio, batch.mask)),
            "trainable_tokens": float(batch.mask.sum()),
        }
    return loss, metrics
