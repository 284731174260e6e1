"""One trained model: the base LM with a PEFT LoRA adapter, its optimizer, and its checkpoints on disk.

Every step is a PEFT adapter directory in ART's layout (``checkpoints/<step:04d>``: the adapter, the tokenizer
and ``optimizer.pt``), written under a temporary name and renamed, so a crash never leaves half a checkpoint and
a restart resumes from the newest one with its optimizer state. Step 0 is the adapter before any RL step (zero,
or the warm start). Older steps are served by loading their adapter beside the trained one.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import art
import torch
from art import dev

from service.backends import layout
from service.backends.openai_server import Sample
from service.backends.transformers import activation_memory, attention, chat, heap, shared_prefix, training
from service.backends.transformers.generation import Generator, SamplingRequest
from service.backends.transformers.models import load_tokenizer
from service.backends.transformers.precision import resolve
from service.backends.transformers.sampled_replies import SampledReplies

OPTIMIZER_FILE = "optimizer.pt"
REFERENCE = "reference"  # the KL reference's adapter name


@dataclass(frozen=True)
class LoraSettings:
    rank: int = 16
    alpha: int = 32
    target_modules: str | tuple[str, ...] = "all-linear"
    max_grad_norm: float = 1.0
    # Tokens per packed training row (a row still holds a math group's prompt and replies). Measured on a math step of
    # 8 groups x 8 on SmolLM2-135M, 2 CPU cores: 2048 tokens peaked at 5.3 GiB (attention's saved probabilities grow
    # with the square), 512 at 3.1 GiB; with gradient checkpointing 512 peaked at 2.1 GiB for 15% more step time.
    seq_len: int = 512
    gradient_checkpointing: bool = True  # recompute each layer's activations in the backward pass: memory for time
    # bytes of activations a training pass may keep for its backward instead of recomputing them, layer by layer
    # (activation_memory.py); None: activation_memory.default_budget(the base's dtype)
    activation_memory: int | None = None


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class PolicyEngine:
    """Loads (or resumes) ``model_dir``'s adapter on the base model in ``base_dir``, the base in ``dtype`` (default:
    precision.py's choice for the device) and the adapter and its optimizer state in float32."""

    def __init__(self, model_dir: Path, base_dir: Path, *, lora: LoraSettings = LoraSettings(), seed: int = 0,
                 device: torch.device | None = None, dtype: torch.dtype | None = None) -> None:  # fmt: skip
        from peft import LoraConfig, PeftModel, get_peft_model
        from transformers import AutoModelForCausalLM

        self.model_dir, self.base_dir, self.lora = model_dir, base_dir, lora
        self.device = device or default_device()
        self.dtype = dtype or resolve("auto", self.device)
        self.tokenizer = load_tokenizer(base_dir)
        chat.add_tool_support(self.tokenizer)
        torch.manual_seed(seed)
        base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=self.dtype, use_safetensors=True,
                                                    attn_implementation=attention.implementation_for(self.device))
        base = base.to(self.device)
        steps = layout.checkpoint_steps(model_dir)
        if steps:
            self.model = PeftModel.from_pretrained(base, str(layout.checkpoint_dir(model_dir, steps[-1])), is_trainable=True)
            self.step = steps[-1]
        else:
            config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=list(lora.target_modules)
                                if isinstance(lora.target_modules, tuple) else lora.target_modules, task_type="CAUSAL_LM")  # fmt: skip
            self.model = get_peft_model(base, config)
            self.step = 0
        if lora.gradient_checkpointing:
            # on the CPU's attention the recompute skips the attention itself (attention.checkpoint_context)
            selective = {"context_fn": attention.checkpoint_context} if shared_prefix.applies(base) else {}
            self.model.get_base_model().gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False, **selective})
        self.model.eval()
        budget = (activation_memory.default_budget(self.dtype) if lora.activation_memory is None
                  else lora.activation_memory)
        self.kept = activation_memory.KeptActivations(budget, training.kept_bytes)
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=1e-5)
        if steps:
            state = layout.checkpoint_dir(model_dir, self.step) / OPTIMIZER_FILE
            if state.is_file():
                self.optimizer.load_state_dict(torch.load(state, map_location=self.device, weights_only=True))
        else:
            self.save_checkpoint()
        self.reference = self._load_reference()
        self.sampler = Generator(self.model, self.tokenizer, end_token_ids=chat.end_token_ids(self.tokenizer))
        self.replies = SampledReplies()  # an episode's turns as they were drawn
        self._loaded_steps: list[int] = []  # older adapters loaded beside "default", most recent last
        self._version = 0  # bumped whenever the trained adapter's weights change: the sampler's cached states expire
        self._work: str | None = None  # "sampling" or "training": what the engine did last (_switch_to)

    # -- checkpoints -------------------------------------------------------------------------

    def steps(self) -> list[int]:
        return layout.checkpoint_steps(self.model_dir)

    def save_checkpoint(self) -> None:
        self._save_adapter(layout.checkpoint_dir(self.model_dir, self.step), with_optimizer=True)

    def _save_adapter(self, target: Path, *, with_optimizer: bool) -> None:
        """The trained adapter (not the reference or an older step's loaded beside it) to ``target``, whole or not at
        all."""
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.model.save_pretrained(str(tmp), selected_adapters=["default"])
        self.tokenizer.save_pretrained(str(tmp))
        if with_optimizer:
            torch.save(self.optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)

    def keep_only(self, steps_to_keep: list[int]) -> None:
        """Delete every other checkpoint; if the newest goes, roll the adapter back to the newest kept one."""
        keep = set(steps_to_keep)
        for step in self.steps():
            if step not in keep:
                shutil.rmtree(layout.checkpoint_dir(self.model_dir, step), ignore_errors=True)
        if self.step not in keep and (left := self.steps()):
            self._load_into_default(left[-1])

    def _load_reference(self) -> str | None:
        """The KL reference's adapter, loaded beside "default": the warm start where the model had one (RL's KL is
        to where RL began, as the embedded backend's is); None, the base model, otherwise."""
        folder = layout.reference_dir(self.model_dir)
        if not folder.is_dir():
            return None
        if REFERENCE in self.model.peft_config:
            self.model.delete_adapter(REFERENCE)
        self.model.load_adapter(str(folder), adapter_name=REFERENCE)
        self.model.set_adapter("default")  # the trained adapter stays the active, trainable one
        return REFERENCE

    def _load_into_default(self, step: int) -> None:
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        folder = layout.checkpoint_dir(self.model_dir, step)
        set_peft_model_state_dict(self.model, load_peft_weights(str(folder), device=str(self.device)))
        state = folder / OPTIMIZER_FILE
        if state.is_file():
            self.optimizer.load_state_dict(torch.load(state, map_location=self.device, weights_only=True))
        self.step = step
        self._weights_change()

    def _weights_change(self) -> None:
        """The adapter is about to change: cached states of its prompts expire, and they and the sampler's packed
        weights are freed now, before a training step needs the memory."""
        self._version += 1
        self.sampler.prefix_cache.use(("default", self._version))
        self.sampler.packed.release()
        self._switch_to("training")

    def _switch_to(self, work: str) -> None:
        """Where the engine turns from sampling to training or back, the heap's free pages go back to the kernel
        (heap.py): what one phase freed, held in blocks of its own sizes, would otherwise sit beside what the other
        allocates, and the job's peak would be the two together."""
        if self._work not in (None, work):
            heap.release_freed()
        self._work = work

    # -- sampling -----------------------------------------------------------------------------

    def generate(self, requests: list[SamplingRequest], step: int | None = None) -> list[list[Sample]]:
        """Samples from the current adapter, or from an older step's (loaded beside it), remembered as drawn."""
        self._switch_to("sampling")
        drawn = self._generate(requests, step)
        for request, samples in zip(requests, drawn):
            for sample in samples:
                self.replies.remember(request.prompt_ids, sample.text, sample.token_ids)
        return drawn

    def _generate(self, requests: list[SamplingRequest], step: int | None) -> list[list[Sample]]:
        if step is None or step == self.step:
            return self.sampler.generate(requests, weights=("default", self._version))
        name = f"step-{step}"
        if step not in self._loaded_steps:
            self.model.load_adapter(str(layout.checkpoint_dir(self.model_dir, step)), adapter_name=name)
            self._loaded_steps.append(step)
            if len(self._loaded_steps) > 2:
                self.model.delete_adapter(f"step-{self._loaded_steps.pop(0)}")
        self.model.set_adapter(name)
        try:
            return self.sampler.generate(requests, weights=name)
        finally:
            self.model.set_adapter("default")

    # -- training -----------------------------------------------------------------------------

    def grpo_step(self, groups: list[art.TrajectoryGroup], *, learning_rate: float, config: dev.TrainConfig,
                  scale_rewards: bool, max_tokens: int | None = None) -> dict[str, float]:  # fmt: skip
        """One RL step over the groups (ART's tokenisation, packing and loss), then a checkpoint. A trajectory longer
        than ``max_tokens`` fails the step before any change (training.SequenceTooLong)."""
        results = training.tokenize_groups(self.tokenizer, groups, scale_rewards=scale_rewards)
        metrics: dict[str, float] = {"trained_trajectories": float(len(results))}
        if results:
            packed = training.pack(results, seq_len=self.lora.seq_len, max_tokens=max_tokens,
                                   advantage_balance=float(config.get("advantage_balance", 0.0)))  # fmt: skip
            self._weights_change()
            metrics |= training.grpo_step(self.model, self.optimizer, packed, learning_rate=learning_rate, config=config,
                                          max_grad_norm=self.lora.max_grad_norm, reference=self.reference,
                                          kept=self.kept)  # fmt: skip
        self.step += 1
        self.save_checkpoint()
        return metrics

    def sft_step(self, trajectories: list[art.Trajectory], learning_rate: float) -> dict[str, float]:
        rows = training.sft_rows(self.tokenizer, trajectories)
        if not rows:
            return {"loss": 0.0}
        self._weights_change()
        return training.sft_step(self.model, self.optimizer, rows, learning_rate=learning_rate,
                                 max_grad_norm=self.lora.max_grad_norm, kept=self.kept)

    def finish_sft(self) -> None:
        """The warm start becomes step 0 and the KL reference; its optimizer state does not carry into RL."""
        self.optimizer.state.clear()
        self.save_checkpoint()
        self._save_adapter(layout.reference_dir(self.model_dir), with_optimizer=False)
        self.reference = self._load_reference()
