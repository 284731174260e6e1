"""packed_weights.py: the sampler's bfloat16 products, and a float32 model's output head, read weights laid out once for
oneDNN, within their dtype's rounding of the plain products; prefills, a float32 model's other weights and changed
weights are not served from a stale or wrong pack; a training step frees the packs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from service.backends.transformers.generation import SamplingRequest
from service.backends.transformers.packed_weights import SMALL_PRODUCT_ROWS, PackedWeights, _available
from tests.service.test_transformers_precision import MESSAGES, _engine

needs_onednn_bf16 = pytest.mark.skipif(not _available(), reason="oneDNN does not run bfloat16 on this CPU")
needs_onednn = pytest.mark.skipif(not _available(torch.float32), reason="this torch has no oneDNN packed linear")


@needs_onednn_bf16
@pytest.mark.parametrize("rows", [1, 7, 64, SMALL_PRODUCT_ROWS])
def test_a_packed_product_is_the_plain_one_within_bfloat16_rounding(rows):
    torch.manual_seed(0)
    weight, bias = torch.randn(96, 64, dtype=torch.bfloat16), torch.randn(96, dtype=torch.bfloat16)
    x = torch.randn(rows, 1, 64, dtype=torch.bfloat16)
    packed = PackedWeights()
    with torch.inference_mode():
        got, plain = packed.product(weight, bias)(x), F.linear(x, weight, bias)
    assert len(packed) == 1 and got.shape == plain.shape and got.dtype == torch.bfloat16
    torch.testing.assert_close(got, plain, rtol=2e-2, atol=2e-2)


@needs_onednn_bf16
def test_a_prefill_a_float32_weight_and_a_changed_weight_are_not_served_from_a_pack(monkeypatch):
    torch.manual_seed(0)
    weight = torch.randn(32, 16, dtype=torch.bfloat16)
    packed = PackedWeights()
    product = packed.product(weight)
    calls = []
    plain_linear = F.linear
    monkeypatch.setattr(F, "linear", lambda *a, **k: calls.append(1) or plain_linear(*a, **k))
    long = torch.randn(SMALL_PRODUCT_ROWS + 1, 16, dtype=torch.bfloat16)
    assert torch.equal(product(long), plain_linear(long, weight)) and calls == [1]  # a prefill's rows: plain
    full, as_float = torch.randn(32, 16), torch.randn(4, 16)
    assert torch.equal(packed.product(full)(as_float), plain_linear(as_float, full))  # a float32 layer: never packed
    assert len(calls) == 2 and len(packed) == 1
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        weight.mul_(-1)  # changed in place: its pack is stale
    torch.testing.assert_close(packed.product(weight)(x), plain_linear(x, weight), rtol=2e-2, atol=2e-2)
    packed.release()
    assert len(packed) == 0


@needs_onednn
@pytest.mark.parametrize("rows", [1, 7, 64, SMALL_PRODUCT_ROWS])
def test_a_float32_heads_packed_product_is_the_plain_one_within_float32_rounding(rows):
    torch.manual_seed(0)
    weight, x = torch.randn(4096, 64), torch.randn(rows, 1, 64)
    packed = PackedWeights()
    with torch.inference_mode():
        got, plain = packed.product(weight, head=True)(x), F.linear(x, weight)
    assert len(packed) == 1 and got.shape == plain.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, plain, rtol=1e-5, atol=1e-5)
    long = torch.randn(SMALL_PRODUCT_ROWS + 1, 64)
    assert torch.equal(packed.product(weight, head=True)(long), F.linear(long, weight))  # a prefill's rows: plain


@needs_onednn
def test_a_float32_sampler_packs_the_head_alone_and_samples_what_the_plain_products_give(
    tiny_lm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
):  # fmt: skip
    """On a float32 model only the output head is packed (MKL runs it far below its rate at a decode step's rows);
    oneDNN sums in another order, so the replies are the plain products' and the logprobs theirs to float32 rounding,
    and a training step frees the pack as it frees bfloat16's."""
    from tests.service.test_transformers_precision import _sampled

    engine = _engine(tiny_lm, tmp_path / "model", torch.float32)
    packed = _sampled(engine, "trained")
    assert len(engine.sampler.packed) == 1  # the head, not one of the adapted layers
    engine.sampler.packed.release()
    monkeypatch.setattr(PackedWeights, "applies", staticmethod(lambda weight, **_: False))
    plain = _sampled(engine, "trained")
    assert len(engine.sampler.packed) == 0 and any(tokens for tokens, _, _ in plain)
    assert [tokens for tokens, _, _ in packed] == [tokens for tokens, _, _ in plain]
    for (_, logprobs, _), (_, plain_logprobs, _) in zip(packed, plain):
        assert logprobs == pytest.approx(plain_logprobs, abs=1e-4)
    monkeypatch.undo()
    _sampled(engine, "trained")
    engine.sft_step([_demonstration()], learning_rate=1e-3)
    assert len(engine.sampler.packed) == 0


@needs_onednn_bf16
def test_a_bfloat16_sampler_packs_every_adapted_layer_and_the_head_once_and_a_training_step_frees_them(
    tiny_lm: Path, tmp_path: Path,
):  # fmt: skip
    from service.backends.transformers import chat

    engine = _engine(tiny_lm, tmp_path / "model", torch.bfloat16)
    prompt = tuple(chat.render_prompt(engine.tokenizer, MESSAGES, None))
    request = SamplingRequest(prompt_ids=prompt, n=3, max_tokens=8, seed=1)
    adapted = sum(1 for name, _ in engine.model.named_modules() if name.endswith("q_proj") and "lora" not in name)
    engine.generate([request])
    layers = len(engine.sampler.packed)
    assert layers == 7 * adapted + 1  # q, k, v, o, gate, up and down of each layer, and the head
    engine.generate([request])
    assert len(engine.sampler.packed) == layers  # the base is frozen: packed once
    engine.sft_step([_demonstration()], learning_rate=1e-3)
    assert len(engine.sampler.packed) == 0  # freed before the step, not held through it
    engine.generate([request])
    assert len(engine.sampler.packed) == layers


def _demonstration():
    import art

    return art.Trajectory(messages_and_choices=[*MESSAGES, {"role": "assistant", "content": "4"}], reward=1.0)
