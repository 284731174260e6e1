"""A trained checkpoint that answers chat completions: its PEFT adapter applied to the base model it was trained
from, sampled as the training backend's policy server samples it (the chat template with Hermes tools, ``token_id:N``
logprobs, the same :class:`Generator`), except that the caller's text is tokenized as text, never as control tokens
(literal_prompt.py). Only the inference process (service/inference/child.py) loads one.

The base is the directory ``adapter_config.json`` names (``base_model_name_or_path``, which the backend writes as an
absolute path); only safetensors weights are read, of the base and of the adapter, and no model code runs
(``trust_remote_code`` stays off). The tokenizer is the one saved with the checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from service.backends import openai_server
from service.backends.openai_server import ChatCompletionRequest
from service.backends.transformers import attention, chat
from service.backends.transformers.generation import Generator, SamplingRequest
from service.backends.transformers.models import load_tokenizer
from service.backends.transformers.precision import Precision, resolve
from service.backends.transformers.template_chat import TemplateChat

ADAPTER_WEIGHTS = "adapter_model.safetensors"


class NotServable(ValueError):
    """The checkpoint cannot be served here: no safetensors adapter, or its base model is not on this machine."""


def base_model_dir(folder: Path) -> Path:
    """The base model directory the adapter in ``folder`` names; NotServable if it names none that is here."""
    try:
        config = json.loads((folder / "adapter_config.json").read_text())
    except (OSError, ValueError):
        raise NotServable("its adapter_config.json cannot be read") from None
    name = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    base = Path(name) if isinstance(name, str) and name else None
    if base is None or not base.is_absolute() or not (base / "config.json").is_file():
        raise NotServable("the base model its adapter names is not a model directory on this server")
    return base


def _adapter_config(folder: Path) -> dict[str, Any] | None:
    try:
        config = json.loads((folder / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


class CheckpointModel:
    """``folder``'s adapter (None: none, ``base_dir`` alone)
    on its base model, in eval mode, on CUDA when present, else the CPU; the base in
    ``precision`` (precision.py), the adapter in float32, as the training engine loads them."""

    def __init__(self, folder: Path | None, *, precision: Precision = "auto", base_dir: Path | None = None) -> None:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        if folder is not None:
            if not (folder / ADAPTER_WEIGHTS).is_file():
                raise NotServable(f"it has no {ADAPTER_WEIGHTS}")
            base_dir = base_model_dir(folder)
        assert base_dir is not None, "a checkpoint folder or a base model directory"
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        dtype = resolve(precision, device)
        own_tokenizer = folder is not None and (folder / "tokenizer_config.json").is_file()
        self.tokenizer = load_tokenizer(folder if own_tokenizer else base_dir)
        chat.add_tool_support(self.tokenizer)
        base = AutoModelForCausalLM.from_pretrained(
            str(base_dir), dtype=dtype, use_safetensors=True, trust_remote_code=False,
            attn_implementation=attention.implementation_for(device),
        ).to(device)
        self.model = (base if folder is None else PeftModel.from_pretrained(base, str(folder))).eval()
        self.adapter_config = None if folder is None else _adapter_config(folder)
        self.weights = 0  # bumped when another adapter's weights are swapped in: cached prompt states expire
        self.generator = Generator(self.model, self.tokenizer, end_token_ids=chat.end_token_ids(self.tokenizer))
        positions = getattr(base.config, "max_position_embeddings", None)
        positions = positions if isinstance(positions, int) else None
        self.format = TemplateChat(lambda _: self.tokenizer, max_context=positions, literal_text=True)

    def takes(self, folder: Path) -> bool:
        """Whether ``folder``'s adapter can replace this one in place: an adapter of the same shape on the same base
        (the next checkpoint of the same training, as a client samples step after step)."""
        return self.adapter_config is not None and (folder / ADAPTER_WEIGHTS).is_file() and (
            _adapter_config(folder) == self.adapter_config
        )  # fmt: skip

    def swap(self, folder: Path) -> None:
        """Serve ``folder``'s adapter (``takes`` it) instead of this one: its weights copied into the loaded adapter,
        the base kept (loading both again took 1.1-1.5 s per checkpoint for SmolLM2-135M on 2 cores)."""
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        device = next(self.model.parameters()).device
        set_peft_model_state_dict(self.model, load_peft_weights(str(folder), device=str(device)))
        self.weights += 1

    @classmethod
    def of_base(cls, base_dir: Path, *, precision: Precision = "auto") -> CheckpointModel:
        """The base model in ``base_dir`` alone: what a model serves before its first checkpoint."""
        return cls(None, precision=precision, base_dir=base_dir)

    def sampling_request(self, request: ChatCompletionRequest, *, default_max_tokens: int) -> SamplingRequest:
        """``request`` rendered (the caller's text tokenized as text, never as control tokens) with its sampling
        parameters, no model work yet; ServingError for messages the template cannot render or a prompt past the
        model's context."""
        return openai_server.sampling_request(request, self.format, default_max_tokens=default_max_tokens)

    def complete(
        self, request: ChatCompletionRequest, sampling: SamplingRequest, *, model: str,
        should_stop: Callable[[], bool] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """The ``chat.completion`` body for ``request`` sampled as ``sampling``, answered as ``model``; sampling
        ends early once ``should_stop()`` is true."""
        [body] = self.complete_many([(request, sampling, model)], should_stop=should_stop)
        return body

    def complete_many(
        self, items: list[tuple[ChatCompletionRequest, SamplingRequest, str]], *,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """``complete`` for each ``(request, sampling, model)``, decoded together in one batch (as the training
        backend's policy server decodes a step's rollouts)."""
        if not items:
            return []
        samplings = [sampling for _, sampling, _ in items]
        results = self.generator.generate(samplings, should_stop=should_stop, weights=self.weights)
        return [openai_server.completion(request, self.format, model=model, samples=samples,
                                         prompt_tokens=len(sampling.prompt_ids))
                for (request, sampling, model), samples in zip(items, results)]  # fmt: skip
