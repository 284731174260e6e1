"""Gradient checkpointing that keeps the attention kernel's outputs (attention.checkpoint_context), on the tiny Llama
with LoRA as the trainer runs it: the backward recomputes each layer's products but not its attention, and the
logprobs and every LoRA gradient are those of a pass that kept all its activations, bit for bit, in float32 and bf16,
with an opening computed once and without."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from service.backends.transformers import activation_memory, attention, training
from service.backends.transformers.engine import PolicyEngine
from tests.tiny_lm import engine_with_adapter

ROWS, WIDTH, OPENING = 3, 200, 140
FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


class _AttentionCalls(TorchDispatchMode):
    """Counts the CPU attention kernel's runs (a selective checkpoint's recompute hands back its kept outputs instead)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func is FLASH
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def engine(request, tiny_lm, tmp_path_factory) -> PolicyEngine:
    return engine_with_adapter(tmp_path_factory.mktemp("model"), tiny_lm, request.param)


def _rows(vocab: int, opening: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows packed as ART packs them, alike for their first ``opening`` tokens, the second row reading a span less."""
    tokens = torch.randint(0, vocab, (ROWS, WIDTH), generator=torch.Generator().manual_seed(1))
    tokens[:, :opening] = tokens[0, :opening]
    group_ids = torch.zeros(ROWS, WIDTH, dtype=torch.long)
    group_ids[1, opening + 20 : opening + 30] = 1  # a second sequence in the row, which only its own tokens see
    mask = training.packed_attention_mask(group_ids, torch.zeros_like(group_ids))
    return tokens, mask, torch.arange(WIDTH).expand(ROWS, WIDTH)


def _pass(engine: PolicyEngine, rows, *, keep: int) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """A forward and backward whose last ``keep`` layers keep their activations (the rest recompute them)."""
    model = engine.model
    model.zero_grad(set_to_none=True)
    model.train()
    layers = activation_memory.checkpointed_layers(model)
    with (_AttentionCalls() as counted, training.adapter_in_base_dtype(model),
          activation_memory.kept(layers, keep)):  # fmt: skip
        new, _ = training.token_logprobs(model, *rows)
        (new * torch.linspace(-1, 1, WIDTH)).sum().backward()
    model.eval()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return new.detach(), grads, counted.calls


@pytest.mark.parametrize("opening", [OPENING, 0], ids=["opening-once", "whole-rows"])
def test_the_backward_recomputes_no_attention_and_gives_the_gradients_of_activations_kept(engine, opening):
    rows = _rows(engine.model.config.vocab_size, opening)
    layers = engine.model.config.num_hidden_layers
    kept = _pass(engine, rows, keep=layers)
    for keep in (0, layers // 2):  # every layer recomputed, or the last half kept (a budget that holds half)
        selective = _pass(engine, rows, keep=keep)
        torch.testing.assert_close(selective[0], kept[0], atol=0, rtol=0)
        assert selective[1].keys() == kept[1].keys() and any("lora_A" in name for name in kept[1])
        for name, grad in kept[1].items():
            torch.testing.assert_close(selective[1][name], grad, atol=0, rtol=0, msg=name)
        assert kept[2] == selective[2] == layers * (2 if opening else 1)  # the opening's pass, then the rows'


def test_plain_checkpointing_would_run_the_attention_again(engine):
    """The count above can tell: checkpointing without the kept outputs runs every layer's attention twice."""
    model = engine.model.get_base_model()
    rows = _rows(engine.model.config.vocab_size, 0)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    try:
        plain = _pass(engine, rows, keep=0)
    finally:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False, "context_fn": attention.checkpoint_context})
    assert plain[2] == 2 * engine.model.config.num_hidden_layers
