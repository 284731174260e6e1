"""The grouped attention computes what transformers' ``sdpa`` does on every shape the backend feeds it: a padded
prefill, decoding from a cache, a packed training row with its own 4-D mask, and the gradient through it."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from service.backends.transformers import attention


def _pair(n_rep: int) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=6 // n_rep, max_position_embeddings=256)  # fmt: skip
    stock = LlamaForCausalLM(config).eval()
    grouped = LlamaForCausalLM(copy.deepcopy(config)).eval()  # its own config: the implementation is set there
    grouped.load_state_dict(stock.state_dict())
    grouped.set_attn_implementation(attention.NAME)
    stock.set_attn_implementation("sdpa")
    assert grouped.config._attn_implementation == attention.NAME
    return stock, grouped


@pytest.mark.parametrize("n_rep", [1, 3])
def test_a_padded_batch_prefilled_then_decoded_gives_sdpa_s_logits(n_rep):
    stock, grouped = _pair(n_rep)
    tokens = torch.randint(0, 97, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[0, :4] = 0  # left padding, as the sampler lays rows out
    mask[2, :1] = 0
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    caches = DynamicCache(), DynamicCache()
    with torch.inference_mode():
        outs = [m(input_ids=tokens, attention_mask=mask, position_ids=positions, past_key_values=c, use_cache=True)
                for m, c in zip((stock, grouped), caches)]  # fmt: skip
        assert torch.allclose(outs[0].logits[mask.bool()], outs[1].logits[mask.bool()], atol=1e-5)
        for _ in range(4):  # decode: one query position against the cache
            step = torch.randint(0, 97, (3, 1))
            mask = torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], dim=1)
            positions = mask.sum(1, keepdim=True) - 1
            outs = [m(input_ids=step, attention_mask=mask, position_ids=positions, past_key_values=c, use_cache=True)
                    for m, c in zip((stock, grouped), caches)]  # fmt: skip
            assert torch.allclose(outs[0].logits, outs[1].logits, atol=1e-5)


def test_an_unpadded_causal_prefill_without_a_mask_stays_causal():
    stock, grouped = _pair(3)
    tokens = torch.randint(0, 97, (2, 12))
    with torch.inference_mode():
        assert torch.allclose(stock(input_ids=tokens).logits, grouped(input_ids=tokens).logits, atol=1e-5)


def test_a_packed_row_s_4d_mask_and_its_gradient_match_sdpa():
    stock, grouped = _pair(3)
    tokens = torch.randint(0, 97, (1, 10))
    group = torch.tensor([[0, 0, 0, 1, 1, 1, 2, 2, 2, 2]])  # three sequences packed in one row
    mask = (torch.tril(torch.ones(10, 10, dtype=torch.bool)) & (group.unsqueeze(2) == group.unsqueeze(1))).unsqueeze(1)
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 0, 1, 2, 3]])
    grads = []
    for model in (stock, grouped):
        model.train()
        logits = model(input_ids=tokens, attention_mask=mask, position_ids=positions).logits
        logits.logsumexp(-1).sum().backward()
        grads.append((logits.detach(), model.model.layers[0].self_attn.k_proj.weight.grad.clone()))
    assert torch.allclose(grads[0][0], grads[1][0], atol=1e-5)
    assert torch.allclose(grads[0][1], grads[1][1], atol=1e-5)


def test_a_plain_causal_4d_mask_takes_sdpa_s_causal_kernel_and_matches_it():
    """A shared opening's mask is plain causal: it is run as sdpa's causal kernel, which skips the masked half."""
    stock, grouped = _pair(3)
    tokens = torch.randint(0, 97, (2, 10))
    mask = torch.tril(torch.ones(10, 10, dtype=torch.bool)).expand(2, 1, 10, 10)
    assert attention._converted(mask, 3, torch.float32) is attention.CAUSAL
    assert attention._converted(mask[:, :, 1:, :], 3, torch.float32) is not attention.CAUSAL  # not square
    results = []
    for model in (stock, grouped):
        model.train()
        logits = model(input_ids=tokens, attention_mask=mask, position_ids=torch.arange(10).expand(2, 10)).logits
        logits.logsumexp(-1).sum().backward()
        results.append((logits.detach(), model.model.layers[0].self_attn.q_proj.weight.grad.clone()))
    assert torch.allclose(results[0][0], results[1][0], atol=1e-5)
    assert torch.allclose(results[0][1], results[1][1], atol=1e-5)


def test_a_pass_converts_its_mask_once_not_once_a_layer(monkeypatch):
    stock, grouped = _pair(3)
    calls = []
    convert = attention._converted
    monkeypatch.setattr(attention, "_converted", lambda *args: calls.append(args[0].shape) or convert(*args))
    tokens = torch.randint(0, 97, (1, 10))
    group = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 1, 1]])
    mask = (torch.tril(torch.ones(10, 10, dtype=torch.bool)) & (group.unsqueeze(2) == group.unsqueeze(1))).unsqueeze(1)
    with torch.inference_mode():
        grouped(input_ids=tokens, attention_mask=mask)
        assert len(calls) == 1 and grouped.config.num_hidden_layers == 2
        grouped(input_ids=tokens, attention_mask=mask.clone())  # another pass, another mask
        assert len(calls) == 2


@pytest.mark.parametrize("q_len", [1, 5])
@pytest.mark.parametrize("masked", [True, False])
def test_states_every_row_shares_held_once_give_the_attention_over_each_rows_whole_keys(q_len, masked):
    """``shared_states`` (an opening held once for a batch) is attention over the opening then each row's own keys:
    sdpa over the two laid end to end, row by row, left padding and a causal mask included."""
    torch.manual_seed(0)
    rows, heads, kv_heads, dim, opening, own = 4, 6, 2, 8, 7, 6
    query = torch.randn(rows, heads, q_len, dim)
    shared_key, shared_value = torch.randn(1, kv_heads, opening, dim), torch.randn(1, kv_heads, opening, dim)
    key, value = torch.randn(rows, kv_heads, own, dim), torch.randn(rows, kv_heads, own, dim)
    mask = torch.ones(rows, 1, q_len, own, dtype=torch.bool).tril(own - q_len)
    mask[1, :, :, :1] = False  # a row's left padding
    layer = type("Layer", (), {"layer_idx": 3})()
    out, _ = attention.grouped_sdpa_attention(layer, query, key, value, mask if masked else None,
                                              shared_states={3: (shared_key, shared_value)})  # fmt: skip
    whole = [torch.cat([shared.expand(rows, -1, -1, -1), mine], dim=2).repeat_interleave(heads // kv_heads, dim=1)
             for shared, mine in ((shared_key, key), (shared_value, value))]  # fmt: skip
    seen = mask if masked else torch.ones(rows, 1, q_len, own, dtype=torch.bool).tril(own - q_len)
    seen = torch.cat([torch.ones(rows, 1, q_len, opening, dtype=torch.bool), seen], dim=-1)
    expected = torch.nn.functional.scaled_dot_product_attention(query, *whole, attn_mask=seen).transpose(1, 2)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
