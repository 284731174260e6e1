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


def build_tiny_gguf(path: Path) -> Path:
    """Write a one-layer Llama (float32 weights drawn at random) with a byte-level vocabulary of 261 tokens as a GGUF
    file at ``path``: what the service converts, in about a second where SmolLM2's file takes 10-16 s."""
    import gguf
    import numpy as np
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    hidden, ffn, heads = 16, 32, 2
    tokens = [*bytes_to_unicode().values(), "Fi", "Fin", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(128)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 3) + [3] * 3)  # normal, then control tokens
    writer.add_token_merges(["F i", "Fi n"])
    writer.add_bos_token_id(len(tokens) - 2)
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_pad_token_id(len(tokens) - 3)
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (len(tokens), hidden), "blk.0.attn_q.weight": (hidden, hidden),
              "blk.0.attn_k.weight": (hidden // heads, hidden), "blk.0.attn_v.weight": (hidden // heads, hidden),
              "blk.0.attn_output.weight": (hidden, hidden), "blk.0.ffn_gate.weight": (ffn, hidden),
              "blk.0.ffn_up.weight": (ffn, hidden), "blk.0.ffn_down.weight": (hidden, ffn)}  # fmt: skip
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.standard_normal(shape, dtype=np.float32) * 0.02)
    for name in ("output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"):
        writer.add_tensor(name, np.ones(hidden, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> Path:
    """The tiny GGUF file, shared by the session's tests (read-only)."""
    return build_tiny_gguf(tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf")
