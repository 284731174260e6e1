"""The two training objectives of the embedded policy: supervised warm start and GRPO.

GRPO here follows the usual recipe: rewards are normalised within each trajectory group
(groups whose rewards are all equal carry no signal and are skipped), and each sampled token is
updated with a PPO-style clipped importance ratio against the logprob the server returned when
it sampled it, plus an optional KL penalty to the warm-start reference (the k3 estimator). The KL a step reports is
the exact one, summed over the vocabulary (service/backends/rl_measures.py says why).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from service.backends.embedded.policy import CharGPT
from service.backends.embedded.sequences import Batch
from service.backends.rl_measures import exact_kl


def token_logprobs(policy: CharGPT, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of each target token (B, T) and the full distributions (B, T, V)."""
    logits, _ = policy(batch.inputs)
    logprobs = policy.output_logprobs(logits)
    chosen = logprobs.gather(-1, batch.targets[..., None]).squeeze(-1)
    return chosen.masked_fill(batch.mask == 0, 0.0), logprobs  # padding targets are -inf: zero them


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum()


def entropy(distributions: torch.Tensor) -> torch.Tensor:
    """Per-position entropy in nats of log-probability rows (-inf entries contribute 0)."""
    probs = distributions.exp()
    return -(probs * distributions.nan_to_num(neginf=0.0)).sum(-1)


def sft_loss(policy: CharGPT, batch: Batch, total_tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the mean negative log-likelihood over ``total_tokens`` trainable tokens.

    Losses of micro-batches divided by the whole batch's token count add up to the batch mean,
    so gradients accumulated over micro-batches equal one pass over the batch.
    """
    chosen, _ = token_logprobs(policy, batch)
    nll = -masked_sum(chosen, batch.mask)
    return nll / total_tokens, {"loss": float(nll.detach())}


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
    policy: CharGPT, reference: CharGPT | None, batch: Batch, config: GRPOConfig, total_tokens: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the clipped policy-gradient loss, with diagnostics as token sums.

    Like :func:`sft_loss`, the loss is divided by the trainable tokens of the whole batch; the
    diagnostics are sums over this micro-batch's trainable tokens, for the caller to average.
    """
    new, distributions = token_logprobs(policy, batch)
    old = torch.where(batch.old_logprobs.isnan(), new.detach(), batch.old_logprobs)
    ratio = (new - old).exp()
    advantages = batch.advantages[:, None]
    unclipped = ratio * advantages
    clipped = ratio.clamp(1 - config.epsilon, 1 + config.epsilon) * advantages
    policy_loss = -masked_sum(torch.minimum(unclipped, clipped), batch.mask)

    kl = exact = torch.zeros_like(new)
    if reference is not None:
        with torch.no_grad():
            ref, ref_distributions = token_logprobs(reference, batch)
        log_ratio = ref - new
        kl = log_ratio.exp() - log_ratio - 1  # k3: unbiased, non-negative estimate of KL(policy || ref)
        exact = exact_kl(distributions.detach(), ref_distributions)  # what the step reports (rl_measures)
    kl_sum = masked_sum(kl, batch.mask)
    loss = (policy_loss + config.kl_penalty_coef * kl_sum) / total_tokens

    with torch.no_grad():
        sums = {
            "loss": policy_loss + config.kl_penalty_coef * kl_sum,
            "policy_loss": policy_loss,
            "kl": masked_sum(exact, batch.mask),
            "entropy": masked_sum(entropy(distributions), batch.mask),
            "clip_fraction": masked_sum(((ratio - 1).abs() > config.epsilon).float(), batch.mask),
            "ratio_mean": masked_sum(ratio, batch.mask),
        }
    return loss, {key: float(value.detach()) for key, value in sums.items()}
