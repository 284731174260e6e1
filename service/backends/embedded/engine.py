"""The synchronous torch side of one embedded model: sample, fine-tune, take GRPO steps.

The backend runs every method here on a single worker thread, so sampling never sees a
half-applied update and results do not depend on request timing.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from service.backends.embedded.checkpoints import CheckpointStore
from service.backends.embedded.objectives import GRPOConfig, grpo_loss, sft_loss
from service.backends.embedded.policy import CharGPT, PolicyConfig
from service.backends.embedded.sampler import SamplingRequest, sample
from service.backends.embedded.sequences import TokenSequence, collate
from service.backends.openai_server import Sample

MAX_GRAD_NORM = 1.0
MICRO_BATCH_TOKENS = 16_384  # padded tokens per forward pass; bounds memory for long trajectories
# A micro-batch is padded to its longest window, so windows go together only while the longest is at most this many
# times the shortest: a math warm start's batch holds windows of about 29 and 60 tokens, and padded as one it cost
# 1.4-1.6x the time of forward and backward passes over the two lengths apart (AVX2 EPYC, one thread).
MAX_PADDING_RATIO = 1.25


def micro_batches(sequences: Sequence[TokenSequence], block_size: int) -> list[list[TokenSequence]]:
    """The windows ordered by length and cut into runs of like length whose padded size stays within
    MICRO_BATCH_TOKENS. Gradients are summed over micro-batches, so their order and grouping change nothing but
    the floating-point order of the sums (and the order is a stable sort: the same windows give the same runs)."""

    def padded_width(seq: TokenSequence) -> int:
        return min(len(seq.ids), block_size + 1)

    batches: list[list[TokenSequence]] = []
    current: list[TokenSequence] = []
    shortest = 0
    for seq in sorted(sequences, key=padded_width):  # ascending: each window is the widest of its run so far
        seq_width = padded_width(seq)
        if current and ((len(current) + 1) * seq_width > MICRO_BATCH_TOKENS or seq_width > MAX_PADDING_RATIO * shortest):
            batches.append(current)
            current = []
        if not current:
            shortest = seq_width
        current.append(seq)
    if current:
        batches.append(current)
    return batches


class PolicyEngine:
    """Live policy, optimizer and KL reference of one model, backed by its checkpoints."""

    def __init__(self, model_dir: Path, config: PolicyConfig, *, seed: int) -> None:
        self.checkpoints = CheckpointStore(model_dir)
        self.config = config
        latest = self.checkpoints.latest_step()
        if latest is None:  # a fresh model: seeded random init, saved as step 0
            self.policy = CharGPT(config, seed=seed)
            self.step = 0
            self.optimizer: torch.optim.Optimizer | None = None
            self.checkpoints.save(0, self.policy, None)
        else:
            self._restore(latest)
        self.reference = self.checkpoints.load_reference()
        if self.reference is None and 0 in self.checkpoints.steps():  # no warm start: anchor KL at step 0
            self.reference = self.checkpoints.load_policy(0)
        self._snapshots: dict[int, CharGPT] = {}

    def _restore(self, step: int) -> None:
        state = self.checkpoints.load(step)
        saved = PolicyConfig(**state["config"])
        if saved != self.config:
            raise ValueError(f"checkpoint at step {step} has architecture {saved}, not {self.config}")
        self.policy = CharGPT(saved)
        self.policy.load_state_dict(state["policy"])
        self.step = step
        self.optimizer = None
        if state["optimizer"] is not None:
            self.optimizer = self._new_optimizer(1e-3, rl=True)  # only RL steps save optimizer state
            self.optimizer.load_state_dict(state["optimizer"])

    def _new_optimizer(self, learning_rate: float, *, rl: bool) -> torch.optim.Optimizer:
        params = self.policy.rl_parameters() if rl else self.policy.parameters()
        return torch.optim.AdamW(params, lr=learning_rate, betas=(0.9, 0.99), weight_decay=0.0)

    def keep_only(self, steps_to_keep: Sequence[int]) -> None:
        """Delete other checkpoints; if the live step was deleted, go back to the newest kept."""
        self.checkpoints.delete_except(list(steps_to_keep))
        self._snapshots.clear()
        latest = self.checkpoints.latest_step()
        if latest is None:
            raise ValueError("refusing to delete every checkpoint of a model")
        if latest != self.step:
            self._restore(latest)

    # -- inference --------------------------------------------------------------------------

    def policy_at(self, step: int | None) -> CharGPT:
        if step is None or step == self.step:
            return self.policy
        if step not in self._snapshots:
            self._snapshots = {step: self.checkpoints.load_policy(step)}  # keep one old step warm
        return self._snapshots[step]

    def generate(self, request: SamplingRequest, step: int | None = None) -> list[Sample]:
        policy = self.policy_at(step)
        was_training = policy.training
        policy.eval()
        try:
            return sample(policy, request)
        finally:
            policy.train(was_training)

    # -- supervised warm start --------------------------------------------------------------

    def sft_fingerprint(self, batch_size: int) -> Any:
        """The identity of a fine-tuning run (same start weights, data and schedule give the same result), begun with
        its start weights and batch size: a sha256 that ``add_to_fingerprint`` extends with each batch."""
        h = hashlib.sha256()
        for tensor in self.policy.state_dict().values():
            h.update(tensor.numpy().tobytes())
        h.update(repr(batch_size).encode())
        return h

    @staticmethod
    def add_to_fingerprint(h: Any, sequences: Sequence[TokenSequence], learning_rate: float) -> None:
        h.update(repr(round(learning_rate, 12)).encode())
        for seq in sequences:
            h.update(repr((seq.ids, seq.trainable)).encode())

    def begin_sft(self) -> None:
        """Fine-tuning trains every weight with an optimizer of its own."""
        self.optimizer = None

    def _accumulate(self, sequences: Sequence[TokenSequence], loss_fn) -> dict[str, float]:
        """Backpropagate ``loss_fn`` over micro-batches of ``sequences``; token-averaged metrics.

        ``loss_fn(batch, total_tokens)`` returns a loss already divided by the whole set's trainable
        tokens and diagnostics summed over the micro-batch's tokens.
        """
        total = float(sum(s.truncated(self.config.block_size).trainable_tokens() for s in sequences)) or 1.0
        sums: dict[str, float] = {}
        for chunk in micro_batches(sequences, self.config.block_size):
            loss, chunk_sums = loss_fn(collate(chunk, self.config.block_size), total)
            loss.backward()
            for key, value in chunk_sums.items():
                sums[key] = sums.get(key, 0.0) + value
        return {**{key: value / total for key, value in sums.items()}, "trainable_tokens": total}

    def _begin_update(self, learning_rate: float, *, rl: bool) -> torch.optim.Optimizer:
        """The phase's optimizer (made on its first update) at ``learning_rate``, gradients cleared, policy training."""
        if self.optimizer is None:
            self.optimizer = self._new_optimizer(learning_rate, rl=rl)
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate
        self.policy.train()
        self.optimizer.zero_grad(set_to_none=True)
        return self.optimizer

    def sft_step(self, batch: Sequence[TokenSequence], learning_rate: float) -> dict[str, float]:
        optimizer = self._begin_update(learning_rate, rl=False)
        metrics = self._accumulate(batch, lambda b, total: sft_loss(self.policy, b, total))
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        return {**metrics, "grad_norm": float(grad_norm), "learning_rate": learning_rate}

    def finish_sft(self) -> None:
        """Make the fine-tuned weights the current checkpoint and the KL reference; RL starts a fresh optimizer."""
        self.optimizer = None
        self.policy.eval()
        self.checkpoints.save(self.step, self.policy, None)
        self.reference = copy.deepcopy(self.policy)
        self.checkpoints.save_reference(self.reference)

    def load_sft_result(self, path: Path) -> None:
        self.policy.load_state_dict(torch.load(path, weights_only=True))

    # -- reinforcement learning -------------------------------------------------------------

    def grpo_step(self, sequences: Sequence[TokenSequence], *, learning_rate: float, grpo: GRPOConfig) -> dict[str, float]:
        """One GRPO update over ``sequences`` (advantages already set), then checkpoint step + 1."""
        metrics: dict[str, float] = {}
        if sequences:
            optimizer = self._begin_update(learning_rate, rl=True)
            metrics = self._accumulate(sequences, lambda b, total: grpo_loss(self.policy, self.reference, b, grpo, total))
            metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.policy.rl_parameters(), MAX_GRAD_NORM))
            optimizer.step()
            self.policy.eval()
        self.step += 1
        self.checkpoints.save(self.step, self.policy, self.optimizer)
        self._snapshots.clear()
        return metrics
