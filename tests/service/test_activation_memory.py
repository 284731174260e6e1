"""A training pass keeps the activations of as many layers as its budget holds (activation_memory.py): the arithmetic,
the measured bytes a position, and an RL step that trains alike with every layer kept and with none."""

from __future__ import annotations

import pytest
import torch

from service.backends.transformers import activation_memory, training
from service.backends.transformers.activation_memory import KeptActivations, layers_to_keep
from service.backends.transformers.engine import LoraSettings, PolicyEngine
from tests.tiny_lm import engine_with_adapter


def test_a_pass_keeps_the_last_layers_its_budget_holds():
    kept = (100.0, 5_000.0)  # a layer keeps 100 bytes a position and 5,000 a pass: 105,000 for 1,000 positions
    assert layers_to_keep(30, 1000, kept, 0) == 0  # no budget: every layer recomputes
    assert layers_to_keep(30, 1000, kept, 104_999) == 0
    assert layers_to_keep(30, 1000, kept, 105_000) == 1
    assert layers_to_keep(30, 1000, kept, 314_999) == 2
    assert layers_to_keep(30, 1000, kept, 10**12) == 30  # never more layers than there are
    assert layers_to_keep(0, 1000, kept, 10**12) == 0
    assert layers_to_keep(30, 0, (100.0, 0.0), 100) == 1  # an empty pass counts as one position


def test_the_default_budget_is_half_a_gib_or_an_eighth_of_the_memory_in_bf16_and_none_in_float32(monkeypatch):
    import os

    pages = {"SC_PHYS_PAGES": 2**19, "SC_PAGE_SIZE": 4096}  # 2 GiB of memory
    monkeypatch.setattr(os, "sysconf", lambda name: pages[name])
    assert activation_memory.default_budget(torch.bfloat16) == 256 << 20
    assert activation_memory.default_budget(torch.float16) == 256 << 20
    pages["SC_PHYS_PAGES"] = 2**24  # 64 GiB
    assert activation_memory.default_budget(torch.bfloat16) == activation_memory.DEFAULT_BUDGET_BYTES
    assert activation_memory.default_budget(torch.float32) == 0  # every layer recomputed, whatever the memory


def test_an_engine_in_float32_recomputes_every_layer_unless_the_operator_sets_a_budget(tiny_lm, tmp_path):
    def budget(name: str, lora: LoraSettings) -> int:
        engine = PolicyEngine(tmp_path / name, tiny_lm, lora=lora, device=torch.device("cpu"), dtype=torch.float32)
        return engine.kept.budget

    assert budget("default", LoraSettings(rank=8)) == 0
    assert budget("given", LoraSettings(rank=8, activation_memory=1 << 20)) == 1 << 20


@pytest.fixture(scope="module")
def engine(tiny_lm, tmp_path_factory) -> PolicyEngine:
    return engine_with_adapter(tmp_path_factory.mktemp("model"), tiny_lm, torch.float32)


@pytest.mark.parametrize("kind", ["packed", "plain"])
def test_what_a_layer_keeps_a_position_is_what_a_pass_of_its_kind_keeps(engine, kind):
    """The measure holds for other passes of its kind: 3 rows of 300 (each packing two sequences, or holding one) keep
    no more than it predicts, and not 15% less (rows together keep a little less a position than a row alone: the
    budget errs on the side of memory)."""
    model = engine.model
    per_position, per_pass = training.kept_bytes(model, kind)
    assert per_position > 0
    layers = activation_memory.checkpointed_layers(model)
    tokens = torch.randint(0, model.config.vocab_size, (3, 300), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(300).expand(3, 300)
    sequences = torch.zeros(3, 300, dtype=torch.long)
    if kind == "packed":
        sequences[:, 120:] = 1
    mask = training.packed_attention_mask(sequences, torch.full((3, 300), -1))
    model.train()

    def run() -> None:
        with training.adapter_in_base_dtype(model):
            training._hidden(model, tokens, mask, positions)

    try:
        recomputed = activation_memory.saved_bytes(run)
        with activation_memory.kept(layers, len(layers)):
            whole = activation_memory.saved_bytes(run)
    finally:
        model.eval()
    predicted = (per_position * 900 + per_pass) * len(layers)
    assert 0.85 * predicted <= whole - recomputed <= 1.01 * predicted
    assert all(layer.gradient_checkpointing for layer in layers)  # each given back


def test_an_rl_step_with_its_activations_kept_trains_as_one_that_recomputes_them(tiny_lm, tmp_path):
    groups = _groups()
    metrics, weights = [], []
    for budget in (0, 10**12):  # every layer recomputed, then every layer kept
        lora = LoraSettings(rank=8, activation_memory=budget)
        engine = PolicyEngine(tmp_path / f"model-{budget}", tiny_lm, lora=lora, dtype=torch.float32)
        assert engine.kept.budget == budget
        metrics.append(engine.grpo_step(groups, learning_rate=1e-3, config={}, scale_rewards=True))
        weights.append({n: p.detach().clone() for n, p in engine.model.named_parameters() if p.requires_grad})
    assert metrics[0]["grad_norm"] > 0
    assert metrics[1] == pytest.approx(metrics[0], rel=1e-5, abs=1e-9)
    for name, value in weights[0].items():
        torch.testing.assert_close(weights[1][name], value, rtol=1e-6, atol=1e-7, msg=name)


def test_a_budget_too_small_for_a_layer_recomputes_them_all(engine):
    layers = activation_memory.checkpointed_layers(engine.model)
    kept = KeptActivations(1, lambda model, kind: (1000.0, 0.0))
    with kept.around(engine.model, 500, kind="packed") as count:
        assert count == 0 and all(layer.gradient_checkpointing for layer in layers)
    with KeptActivations(10**9, lambda model, kind: (1000.0, 0.0)).around(engine.model, 500, kind="packed") as count:
        assert count == len(layers) and not any(layer.gradient_checkpointing for layer in layers)
    assert all(layer.gradient_checkpointing for layer in layers)


def _groups():
    """Two groups of sampled math replies, rewards apart, as the backend's step receives them."""
    import art
    from openai.types.chat import ChatCompletionMessage, ChatCompletionTokenLogprob
    from openai.types.chat.chat_completion import Choice, ChoiceLogprobs

    def trajectory(reply: list[int], reward: float) -> art.Trajectory:
        tokens = [ChatCompletionTokenLogprob(token=f"token_id:{t}", logprob=-1.0, bytes=None, top_logprobs=[])
                  for t in reply]  # fmt: skip
        choice = Choice(index=0, finish_reason="stop", message=ChatCompletionMessage(role="assistant", content="x"),
                        logprobs=ChoiceLogprobs(content=tokens))  # fmt: skip
        return art.Trajectory(messages_and_choices=[{"role": "user", "content": "What is 2 + 3?"}, choice],
                              reward=reward)  # fmt: skip

    return [art.TrajectoryGroup([trajectory([40, 41, 42], 1.0), trajectory([43, 44], 0.0)]),
            art.TrajectoryGroup([trajectory([45, 46, 47, 48], 0.5), trajectory([49], -0.5)])]  # fmt: skip
