"""A tiny randomly initialised Llama with SmolLM2's real tokenizer and chat template, saved as a Hugging Face
directory: the real code path of the transformers backend (tokeniser, chat template, PEFT, ART's tokenisation) in
a fraction of a second per step. Built once per test session; the tokenizer is read from the SmolLM2 GGUF file."""

from __future__ import annotations

from pathlib import Path

import pytest

TINY_CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}


def build_tiny_lm(folder: Path, *, seed: int = 0) -> Path:
    """Write the tiny model and SmolLM2's tokenizer to ``folder`` and return it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from service.backends.transformers.models import load_tokenizer, smollm2_gguf

    tokenizer = load_tokenizer(smollm2_gguf())
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **TINY_CONFIG,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory) -> Path:
    """A directory holding the tiny model, shared by the session's tests (read-only)."""
    return build_tiny_lm(tmp_path_factory.mktemp("tiny-lm"))


def engine_with_adapter(model_dir: Path, base: Path, dtype):
    """A PolicyEngine on the tiny model in ``dtype`` whose LoRA B weights are drawn nonzero (PEFT starts them at 0),
    so the adapter changes the outputs and gradients flow through every path."""
    import torch

    from service.backends.transformers.engine import LoraSettings, PolicyEngine

    engine = PolicyEngine(model_dir, base, lora=LoraSettings(rank=8), device=torch.device("cpu"), dtype=dtype)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in engine.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    return engine
