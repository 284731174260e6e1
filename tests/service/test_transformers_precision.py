"""The transformers backend in bfloat16 (forced here: this may be an AVX2 machine) and float32, on the tiny Llama: the
choice follows the CPU's flags, the base is bfloat16 while the LoRA weights, their optimizer state and the adapter on
disk stay float32, the sampler's logprobs are the trainer's, a step trains, and a checkpoint is served and merged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from service import adapters
from service.backends import layout
from service.backends.transformers import chat, precision, training
from service.backends.transformers.engine import LoraSettings, PolicyEngine
from service.backends.transformers.generation import SamplingRequest
from service.backends.transformers.inference import ADAPTER_WEIGHTS, CheckpointModel
from service.backends.transformers.packed_weights import PackedWeights

CPU = torch.device("cpu")
MESSAGES = [{"role": "user", "content": "What is 2 + 3? Reply with `Final: <int>`."}]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [({"avx2": True}, torch.float32), ({"avx2": True, "avx512_bf16": True}, torch.bfloat16),
     ({"amx_bf16": True, "amx_tile": True}, torch.bfloat16), ({}, torch.float32)],
)  # fmt: skip
def test_auto_picks_bfloat16_where_the_cpu_multiplies_it_natively_and_a_forced_one_wins(flags, expected, monkeypatch):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: flags)
    assert precision.resolve("auto", CPU) == expected
    assert precision.resolve("auto", torch.device("cuda")) == torch.bfloat16
    assert precision.resolve("float32", torch.device("cuda")) == torch.float32
    assert precision.resolve("bfloat16", CPU) == torch.bfloat16
    with pytest.raises(ValueError, match="unknown precision"):
        precision.resolve("fp8", CPU)  # type: ignore[arg-type]


def _engine(tiny_lm: Path, folder: Path, dtype: torch.dtype, alpha: int = 32) -> PolicyEngine:
    """An engine with confident and unsure tokens (the final norm scales the logits up: a random init is nearly
    uniform) and a nonzero adapter, so the sampler and the trainer apply all of it."""
    engine = PolicyEngine(folder, tiny_lm, lora=LoraSettings(rank=8, alpha=alpha), device=CPU, dtype=dtype)
    torch.manual_seed(0)
    with torch.no_grad():
        engine.model.get_base_model().model.norm.weight.mul_(40)
        for name, param in engine.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    return engine


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_trainer_recomputes_the_probabilities_the_sampler_reported(dtype, tiny_lm, tmp_path):
    engine = _engine(tiny_lm, tmp_path / "model", dtype)
    prompt = tuple(chat.render_prompt(engine.tokenizer, MESSAGES, None))
    requests = [SamplingRequest(prompt_ids=prompt, n=3, max_tokens=16, seed=1),
                SamplingRequest(prompt_ids=prompt[:-2], n=3, max_tokens=16, seed=2)]  # fmt: skip
    sampled, recomputed = [], []
    for request, samples in zip(requests, engine.generate(requests)):
        for sample in samples:
            tokens = torch.tensor([[*request.prompt_ids, *sample.token_ids]])
            length = tokens.shape[1]
            mask = torch.tril(torch.ones(1, length, length, dtype=torch.bool))
            with torch.no_grad():
                logprobs, _ = training.token_logprobs(engine.model, tokens, mask, torch.arange(length).unsqueeze(0))
            recomputed += logprobs[0, len(request.prompt_ids) - 1 : length - 1].tolist()
            sampled += sample.logprobs
    probs = torch.tensor([sampled, recomputed]).exp()
    assert probs[0].std() > 0.2  # probabilities from near 0 to near 1: the correlation means something
    assert torch.corrcoef(probs)[0, 1] >= 0.999  # ART's probs_corr


def test_a_bfloat16_base_trains_float32_lora_weights_and_saves_them_as_float32(tiny_lm, tmp_path):
    import art

    engine = PolicyEngine(tmp_path / "model", tiny_lm, lora=LoraSettings(rank=8), device=CPU, dtype=torch.bfloat16)
    assert engine.lora.gradient_checkpointing and engine.model.get_base_model().is_gradient_checkpointing
    trainable = {name: p for name, p in engine.model.named_parameters() if p.requires_grad}
    frozen = [p for p in engine.model.parameters() if not p.requires_grad]
    assert trainable and all("lora_" in name and p.dtype == torch.float32 for name, p in trainable.items())
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    before = {name: p.detach().clone() for name, p in trainable.items()}
    reply = {"role": "assistant", "content": "Final: 5"}
    metrics = engine.sft_step([art.Trajectory(messages_and_choices=[*MESSAGES, reply], reward=1.0)], 1e-2)
    assert torch.isfinite(torch.tensor([metrics["loss"], metrics["grad_norm"]])).all() and metrics["loss"] > 0
    assert any(not torch.equal(before[name], p) for name, p in trainable.items())
    moments = [v for state in engine.optimizer.state.values() for v in state.values() if v.is_floating_point()]
    assert moments and all(v.dtype == torch.float32 for v in moments)

    engine.finish_sft()
    folder = layout.checkpoint_dir(engine.model_dir, engine.step)
    assert {t.dtype for t in load_file(folder / ADAPTER_WEIGHTS).values()} == {torch.float32}
    served = CheckpointModel(folder, precision="bfloat16")  # the inference process's model, as the trainer's
    assert {p.dtype for n, p in served.model.named_parameters() if "lora_" in n} == {torch.float32}
    adapters.merge(folder, tiny_lm, tmp_path / "merged")  # the export loads its own base (as saved: float32)
    assert (tmp_path / "merged" / "model.safetensors").is_file()


def _packed_rows(rows: int, width: int, vocab: int) -> dict:
    """``rows`` packed rows of ``width`` tokens, each a prompt of 20 then replies of 10 with sampled logprobs and
    advantages of both signs, padded at the end, as ART packs a step."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (rows, width), generator=generator)
    group_ids, parent_ids = torch.full((rows, width), -1), torch.full((rows, width), -1)
    positions = torch.zeros(rows, width, dtype=torch.long)
    replies = torch.zeros(rows, width, dtype=torch.bool)
    for row in range(rows):
        group_ids[row, :20] = parent_ids[row, :20] = 0
        positions[row, :20] = torch.arange(20)
        for reply, start in enumerate(range(20, width - 10 - 3 * row, 10)):  # rows end at different columns
            group_ids[row, start : start + 10], parent_ids[row, start : start + 10] = reply + 1, 0
            positions[row, start : start + 10] = torch.arange(20, 30)
            replies[row, start : start + 10] = True
    advantages = torch.where(replies, torch.randn(rows, width, generator=generator), torch.zeros(rows, width))
    sampled = torch.where(replies, -torch.rand(rows, width, generator=generator), torch.full((rows, width), float("nan")))
    tokens = torch.where(group_ids >= 0, tokens, torch.full_like(tokens, -100))
    return {"tokens": tokens, "group_ids": group_ids, "parent_ids": parent_ids, "input_pos": positions,
            "assistant_mask": replies, "logprobs": sampled, "advantages": advantages,
            "weights": replies.float(), "pixel_values": [None] * rows, "image_grid_thw": [None] * rows}  # fmt: skip


def test_packed_rows_trained_in_one_pass_step_as_they_do_one_row_at_a_time(tiny_lm, tmp_path, monkeypatch):
    """Micro-batches of several packed rows (``TRAIN_BATCH_TOKENS``) change how many rows a pass holds, not the step:
    the same loss, entropy, KL, gradient norm and updated adapter as row by row, in float32."""
    from art import dev

    results = []
    for budget in (1, training.TRAIN_BATCH_TOKENS):
        engine = _engine(tiny_lm, tmp_path / f"model-{budget}", torch.float32)
        packed = _packed_rows(4, 96, engine.model.config.vocab_size)
        monkeypatch.setattr(training, "TRAIN_BATCH_TOKENS", budget)
        assert len(training.micro_batches(packed["tokens"], packed["input_pos"])) == (4 if budget == 1 else 1)
        metrics = training.grpo_step(engine.model, engine.optimizer, packed, learning_rate=1e-2,  # type: ignore[arg-type]
                                     config=dev.TrainConfig(), max_grad_norm=1.0)  # fmt: skip
        adapter = {n: p.detach().clone() for n, p in engine.model.named_parameters() if p.requires_grad}
        results.append((metrics, adapter))
    (rows, rows_adapter), (batched, batched_adapter) = results
    assert rows["grad_norm"] > 0 and rows["packed_rows"] == batched["packed_rows"] == 4
    for key in ("loss", "entropy", "kl_policy_ref", "grad_norm", "trained_tokens", "probs_corr"):
        assert batched[key] == pytest.approx(rows[key], rel=1e-4, abs=1e-6), key
    for name, weight in rows_adapter.items():
        torch.testing.assert_close(batched_adapter[name], weight, atol=1e-6, rtol=1e-4)


def test_a_steps_probs_corr_is_one_correlation_over_all_its_sampled_tokens(tiny_lm, tmp_path, monkeypatch):
    """A micro-batch whose own correlation is undefined (one sampled token) counts its token, not a missing share:
    the step reads as its rows trained in one pass do. A step with no sampled logprob reports no probs_corr."""
    from art import dev

    engine = _engine(tiny_lm, tmp_path / "model", torch.float32)
    packed = _packed_rows(3, 96, engine.model.config.vocab_size)
    lone = packed["logprobs"][2].clone()
    first = int((~torch.isnan(lone)).nonzero()[0])
    packed["logprobs"][2] = float("nan")
    packed["logprobs"][2, first] = lone[first]

    def step(budget: int) -> dict[str, float]:
        monkeypatch.setattr(training, "TRAIN_BATCH_TOKENS", budget)
        return training.grpo_step(engine.model, engine.optimizer, packed, learning_rate=0.0,  # type: ignore[arg-type]
                                  config=dev.TrainConfig(), max_grad_norm=1.0)  # fmt: skip

    by_row, together = step(1)["probs_corr"], step(training.TRAIN_BATCH_TOKENS)["probs_corr"]
    assert -1.0 < together < 1.0 and by_row == pytest.approx(together, abs=1e-9)
    packed["logprobs"][:] = float("nan")
    assert "probs_corr" not in step(training.TRAIN_BATCH_TOKENS)


def test_a_bfloat16_base_runs_its_adapters_products_in_bfloat16_when_training(tiny_lm, tmp_path):
    """The trainer computes the adapter as the base (precision.adapter_in_base_dtype): no float32 copy of an activation
    goes into a LoRA product, while the adapter's weights stay float32, sampling or not. (The sampler skips the LoRA
    modules to the values they give under the same rule: the test after the next.)"""
    engine = _engine(tiny_lm, tmp_path / "model", torch.bfloat16)
    lora_a = next(m for n, m in engine.model.named_modules() if n.endswith("q_proj.lora_A.default"))
    seen: list[tuple[torch.dtype, torch.dtype]] = []
    lora_a.register_forward_hook(lambda module, args, out: seen.append((args[0].dtype, out.dtype)))
    prompt = tuple(chat.render_prompt(engine.tokenizer, MESSAGES, None))
    engine.generate([SamplingRequest(prompt_ids=prompt, max_tokens=2, seed=0)])
    tokens = torch.tensor([prompt])
    mask = torch.tril(torch.ones(1, len(prompt), len(prompt), dtype=torch.bool))
    training.token_logprobs(engine.model, tokens, mask, torch.arange(len(prompt)).unsqueeze(0))[0].sum().backward()
    assert seen and set(seen) == {(torch.bfloat16, torch.bfloat16)}
    assert lora_a.weight.dtype == torch.float32 and lora_a.weight.grad.dtype == torch.float32
    q_proj = next(m for n, m in engine.model.named_modules() if n.endswith("q_proj"))
    with precision.adapter_in_base_dtype(engine.model), precision.adapter_in_base_dtype(engine.model):  # nested
        assert q_proj.cast_input_dtype_enabled is False and torch.is_autocast_enabled("cpu")
    assert q_proj.cast_input_dtype_enabled is True and not torch.is_autocast_enabled("cpu")  # restored after


def test_a_bfloat16_steps_probs_corr_is_computed_in_float32(tiny_lm, tmp_path):
    """ART's loss runs outside the adapter's autocast: under it ``torch.corrcoef`` multiplies in bfloat16, and a
    step's probs_corr read 1.0 or 0.996 and nothing between (an H200 and the CPUs alike)."""
    from art import dev
    from art.loss import shift_tensor

    engine = _engine(tiny_lm, tmp_path / "model", torch.bfloat16)
    packed = _packed_rows(1, 96, engine.model.config.vocab_size)
    inputs = {k: v for k, v in packed.items() if isinstance(v, torch.Tensor)}
    mask = training.packed_attention_mask(inputs["group_ids"], inputs["parent_ids"])
    engine.model.train()
    with torch.no_grad(), precision.adapter_in_base_dtype(engine.model):
        new, _ = training.token_logprobs(engine.model, inputs["tokens"], mask, inputs["input_pos"],
                                         at=training.read_positions(inputs))  # fmt: skip
    sampled = ~torch.isnan(shift_tensor(inputs["logprobs"], float("nan")))
    noisy = new.float() + 0.3 * torch.randn(new.shape, generator=torch.Generator().manual_seed(1))
    old = torch.where(sampled, noisy, torch.full_like(noisy, float("nan")))
    packed["logprobs"] = torch.cat([torch.full((1, 1), float("nan")), old[:, :-1]], dim=1)  # as the loss shifts it
    expected = torch.corrcoef(torch.stack([noisy[sampled].exp(), new.float()[sampled].exp()]))[0, 1].item()
    assert 0.99 < expected < 0.9995  # between bfloat16's steps below 1 (0.9961 and 1.0)
    metrics = training.grpo_step(engine.model, engine.optimizer, packed, learning_rate=1e-2,  # type: ignore[arg-type]
                                 config=dev.TrainConfig(), max_grad_norm=1.0)  # fmt: skip
    assert metrics["probs_corr"] == pytest.approx(expected, abs=1e-4)


def test_a_steps_kl_is_the_exact_kl_of_each_trained_positions_distribution(tiny_lm, tmp_path):
    """The step's KL is KL(policy ‖ reference) summed over the vocabulary at every position that predicts a trained
    token, then averaged (rl_measures): computed here from the two models' whole logits. It does not read which token
    was sampled, so one reply token the policy finds unlikely cannot swing it as it swung k3's estimate."""
    from art import dev

    engine = _engine(tiny_lm, tmp_path / "model", torch.float32)
    packed = _packed_rows(2, 96, engine.model.config.vocab_size)
    inputs = {k: v for k, v in packed.items() if isinstance(v, torch.Tensor)}
    mask = training.packed_attention_mask(inputs["group_ids"], inputs["parent_ids"]).unsqueeze(1)
    ids, positions = inputs["tokens"].clamp(min=0), inputs["input_pos"]
    with torch.no_grad():
        policy = engine.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.log_softmax(-1)
        with engine.model.disable_adapter():
            base = engine.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.log_softmax(-1)
    predicting = torch.nn.functional.pad(inputs["assistant_mask"][:, 1:], (0, 1), value=False)
    per_position = torch.nn.functional.kl_div(base, policy, log_target=True, reduction="none").sum(-1)
    expected = float(per_position[predicting].mean())
    metrics = training.grpo_step(engine.model, engine.optimizer, packed, learning_rate=0.0,  # type: ignore[arg-type]
                                 config=dev.TrainConfig(), max_grad_norm=1.0)  # fmt: skip
    assert expected > 0.01 and metrics["kl_policy_ref"] == pytest.approx(expected, rel=1e-4)


def _lora_layers(engine: PolicyEngine) -> list[torch.nn.Module]:
    from peft.tuners.lora.layer import Linear as LoraLinear

    return [m for m in engine.model.modules() if isinstance(m, LoraLinear)]


def _sampled(engine: PolicyEngine, weights: str) -> list[tuple]:
    prompt = tuple(chat.render_prompt(engine.tokenizer, MESSAGES, None))
    requests = [SamplingRequest(prompt_ids=prompt, n=3, max_tokens=12, seed=1, top_logprobs=3),
                SamplingRequest(prompt_ids=prompt[:-2], n=2, max_tokens=12, temperature=0.0)]  # fmt: skip
    drawn = engine.sampler.generate(requests, weights=weights)
    return [(s.token_ids, s.logprobs, s.top_logprobs) for samples in drawn for s in samples]


@pytest.mark.parametrize("alpha", [32, 12])  # a scaling of 4, folded into B; 1.5, multiplied after B
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_sampler_computes_its_adapter_directly_to_the_values_peft_gives(dtype, alpha, tiny_lm, tmp_path,
                                                                           monkeypatch):  # fmt: skip
    """sampling_adapter.py: the adapted layers skip PEFT's forward while sampling, and every token, logprob and top
    logprob is what PEFT's own forward (under the trainer's rule) gives, bit for bit (the base's products unpacked on
    both sides: packed_weights.py's products may round otherwise), whether the scaling is folded into B or not."""
    from contextlib import nullcontext

    from peft.tuners.lora.layer import Linear as LoraLinear

    from service.backends.transformers import generation

    monkeypatch.setattr(PackedWeights, "applies", staticmethod(lambda weight, **_: False))
    engine = _engine(tiny_lm, tmp_path / "model", dtype, alpha)
    peft_forward, calls = LoraLinear.forward, []
    monkeypatch.setattr(LoraLinear, "forward", lambda self, *a, **k: calls.append(1) or peft_forward(self, *a, **k))
    direct = _sampled(engine, "direct")
    assert calls == []  # no adapted layer went through PEFT's forward
    monkeypatch.setattr(generation, "adapter_as_sampled", lambda model, packed: nullcontext())
    through_peft = _sampled(engine, "peft")
    assert len(calls) > len(_lora_layers(engine))
    assert direct == through_peft and any(tokens for tokens, _, _ in direct)


def test_the_sampler_computes_the_active_adapter_and_gives_peft_back_its_forward(tiny_lm, tmp_path):
    """The adapter sampled is the active one (an older step's, set for its requests); a layer PEFT would run otherwise
    (adapters disabled) keeps PEFT's forward; on leaving, an error included, every layer has PEFT's forward again."""
    from service.backends.transformers.sampling_adapter import adapter_as_sampled

    engine = _engine(tiny_lm, tmp_path / "model", torch.bfloat16)
    layers = _lora_layers(engine)
    trained = _sampled(engine, "trained")
    engine.model.load_adapter(str(layout.checkpoint_dir(engine.model_dir, 0)), adapter_name="zero")  # B still 0 there
    engine.model.set_adapter("zero")
    zero = _sampled(engine, "zero")
    engine.model.set_adapter("default")
    with engine.model.disable_adapter():
        with adapter_as_sampled(engine.model):
            assert not any("forward" in layer.__dict__ for layer in layers)
        base = _sampled(engine, "base")
    assert zero == base != trained
    with pytest.raises(RuntimeError), adapter_as_sampled(engine.model):
        with adapter_as_sampled(engine.model):  # nested: the inner leaves the layers to the outer
            pass
        assert all("forward" in layer.__dict__ for layer in layers)
        raise RuntimeError
    assert not any("forward" in layer.__dict__ for layer in layers)
