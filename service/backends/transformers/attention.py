"""Grouped-query attention without copying the KV cache, for the CPU.

Models like SmolLM2 share each key/value head among several query heads (9 query heads, 3 KV heads). transformers'
``sdpa`` attention lets PyTorch handle that sharing (``enable_gqa``) only where no attention mask is given; with one
(every padded batch, every packed training row) it first copies each KV head once per query head that reads it
(``repeat_kv``). While decoding, that copies every layer's whole cache at every token: for 64 rows of 300 tokens on
SmolLM2-135M, about 2.6 GB written and read per decoded token, more than the weights, and a fresh allocation each
time (the page faults a profile of the main job shows). Here the query heads that share a KV head are laid side by
side as extra query positions instead: ``[batch, kv_heads, n_rep * q_len, dim]`` against the cache as it is, the mask
repeated along the (short) query axis. The arithmetic is the same as ``sdpa``'s; nothing the size of the cache is
copied.

While sampling, rows that open alike (an agent's system prompt and tools: 821 tokens of an email episode's 1,000-1,600)
keep that opening's states once, not once a row (``shared_states``): every row's queries meet its keys in one call
and each row's own keys in another, merged by their log-sum-exps (the cascade attention of FlashInfer and vLLM). Each
row's copy of the opening was read at every decoded token: PyTorch's CPU flash kernel over it was 38% of an email
validation's model time.

While training, gradient checkpointing recomputes each layer's forward in the backward; ``checkpoint_context`` keeps
the attention kernel's outputs (a few KiB a position) so the recompute runs only the layer's products, not the
attention again, the part of a pass that runs furthest below the machine's rate on a CPU.

``implementation_for(device)`` names it for a model loaded on the CPU; CUDA keeps ``sdpa`` (its kernels were not
measured against this here). The mask transformers builds for it is ``sdpa``'s.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "sdpa_grouped"


def grouped_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    keep_prefix: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
    shared_prefix: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
    shared_states: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
    sdpa_reads: torch.Tensor | None = None,
    **_: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query ``[b, heads, q, d]``, key/value ``[b, kv_heads, k, d]``; the
    output ``[b, q, heads, d]``. Query head ``h`` reads KV head ``h // n_rep``, as ``repeat_kv`` lays them out.

    ``keep_prefix`` keeps each layer's keys and values (the first call's: a checkpoint's recompute keeps none);
    ``shared_prefix`` lays a kept layer's before this call's own, for every row (shared_prefix.py); ``shared_states``
    (``[1, kv_heads, positions, dim]`` a layer) are states every query of every row sees, before the cache's own;
    ``sdpa_reads`` is ``attention_mask`` converted before the pass (``converted_mask``), as training passes give it."""
    if shared_states is not None:
        return _cascade(query, *shared_states[module.layer_idx], key, value, attention_mask, scaling), None
    if keep_prefix is not None:
        keep_prefix.setdefault(module.layer_idx, (key, value))
    if shared_prefix is not None:
        kept_key, kept_value = shared_prefix[module.layer_idx]
        key = torch.cat([kept_key.expand(key.shape[0], -1, -1, -1), key], dim=2)
        value = torch.cat([kept_value.expand(value.shape[0], -1, -1, -1), value], dim=2)
    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    n_rep = heads // kv_heads
    k_len = key.shape[2]
    if attention_mask is None and q_len > 1 and (is_causal if is_causal is not None else getattr(module, "is_causal", True)):
        # the causal mask sdpa would have implied, made explicit: grouped rows keep their positions
        attention_mask = CAUSAL if q_len == k_len else _causal(q_len, k_len, query.device)
    if sdpa_reads is not None:
        attention_mask = sdpa_reads
    elif attention_mask is not None and attention_mask is not CAUSAL:
        attention_mask = _as_sdpa_reads(attention_mask, n_rep, query.dtype)
    if attention_mask is CAUSAL:  # every row plain causal: sdpa's own causal kernel skips the masked half
        key, value = key.repeat_interleave(n_rep, dim=1), value.repeat_interleave(n_rep, dim=1)
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, dropout_p=dropout, scale=scaling,
                                                               is_causal=True)  # fmt: skip
        return out.transpose(1, 2).contiguous(), None
    grouped_query = query.reshape(batch, kv_heads, n_rep * q_len, dim)
    out = torch.nn.functional.scaled_dot_product_attention(
        grouped_query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        is_causal=False,
    )  # fmt: skip
    return out.reshape(batch, heads, q_len, dim).transpose(1, 2).contiguous(), None


_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # what sdpa runs on a CPU, with its log-sum-exp


def _cascade(
    query: torch.Tensor, shared_key: torch.Tensor, shared_value: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    mask: torch.Tensor | None, scaling: float | None,
) -> torch.Tensor:
    """Attention over shared states (seen by every query) and then each row's own keys (under ``mask``, causal where
    None), as one softmax over both: the two parts' outputs weighted by their log-sum-exps, in float32."""
    batch, heads, q_len, dim = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    n_rep = heads // kv_heads
    grouped = query.reshape(batch, kv_heads, n_rep * q_len, dim)
    everyone = grouped.transpose(0, 1).reshape(1, kv_heads, batch * n_rep * q_len, dim)
    out, lse = _flash(everyone, shared_key, shared_value, scale=scaling)[:2]
    out = out.reshape(kv_heads, batch, n_rep * q_len, dim).transpose(0, 1).float()
    lse = lse.reshape(kv_heads, batch, n_rep * q_len).transpose(0, 1)
    if k_len:
        own_mask = _as_sdpa_reads(mask, n_rep, query.dtype) if mask is not None else None
        if own_mask is CAUSAL or (own_mask is None and q_len > 1):
            own_mask = _grouped(_causal(q_len, k_len, query.device), n_rep, query.dtype)
        # every query must see one of its own keys (its own position) at least: the kernel gives one that sees none
        # (a left-padding position, which no later position reads) an output and log-sum-exp of 0
        own, own_lse = _flash(grouped, key, value, attn_mask=own_mask, scale=scaling)[:2]
        top = torch.maximum(lse, own_lse)
        weight, own_weight = (lse - top).exp().unsqueeze(-1), (own_lse - top).exp().unsqueeze(-1)
        out = (out * weight + own.float() * own_weight) / (weight + own_weight)
    return out.to(query.dtype).reshape(batch, heads, q_len, dim).transpose(1, 2).contiguous()


def _grouped(mask: torch.Tensor, n_rep: int, dtype: torch.dtype) -> torch.Tensor:
    """``mask`` for grouped queries: each query row repeated ``n_rep`` times (row ``rep * q_len + i`` is query
    position ``i``'s) and, if boolean, made additive in ``dtype``, as sdpa itself would make it (0 where attended,
    -inf elsewhere)."""
    grouped = mask.repeat(1, 1, n_rep, 1) if mask.shape[-2] > 1 else mask
    if grouped.dtype != torch.bool:
        return grouped
    return torch.zeros(grouped.shape, dtype=dtype, device=mask.device).masked_fill_(~grouped, float("-inf"))


CAUSAL = torch.empty(0)  # stands for a mask that is plain causal, query and key positions alike
_last: tuple[weakref.ref[torch.Tensor], int, torch.dtype, torch.Tensor] | None = None


def _as_sdpa_reads(mask: torch.Tensor, n_rep: int, dtype: torch.dtype) -> torch.Tensor:
    """``mask`` as sdpa reads it for grouped queries (``_converted``). Every layer of a pass gets the same mask tensor,
    so it is converted once a pass, not once a layer: a warm-start pass spent 8% of its time converting it (``where``)
    and repeating it."""
    global _last
    last = _last
    if last is not None and last[0]() is mask and last[1] == n_rep and last[2] == dtype:
        return last[3]
    converted = _converted(mask, n_rep, dtype)
    _last = (weakref.ref(mask), n_rep, dtype, converted)
    return converted


def converted_mask(backbone: torch.nn.Module, mask: torch.Tensor) -> torch.Tensor:
    """A pass's 4-D boolean ``mask`` as every layer's attention reads it in ``backbone`` (a Llama-like decoder stack),
    made before the pass. Selective checkpointing (``checkpoint_context``) requires a layer's recompute to run the
    operations its forward ran; converting the mask in whichever layer first meets it (``_as_sdpa_reads``) would put
    the conversion in one layer's forward and in another's recompute."""
    config = backbone.config
    dtype = backbone.get_input_embeddings().weight.dtype
    return _converted(mask, config.num_attention_heads // config.num_key_value_heads, dtype)


def _converted(mask: torch.Tensor, n_rep: int, dtype: torch.dtype) -> torch.Tensor:
    """CAUSAL where ``mask`` is plain causal (``is_plain_causal``); otherwise ``_grouped``."""
    return CAUSAL if is_plain_causal(mask) else _grouped(mask, n_rep, dtype)


def is_plain_causal(mask: torch.Tensor) -> bool:
    """Whether a boolean 4-D ``mask`` is square, plain causal and alike in every row: what sdpa's causal kernel runs,
    its keys and values repeated for every query head that reads them."""
    q_len, k_len = mask.shape[-2:]
    return mask.dtype == torch.bool and q_len == k_len > 1 and bool((mask == _causal(q_len, k_len, mask.device)).all())


def _causal(q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
    """The causal mask of ``q_len`` queries that end a sequence of ``k_len`` keys (the last query sees every key)."""
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)[None, None]


AttentionInterface.register(NAME, grouped_sdpa_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


# What sdpa runs on a CPU: its outputs (the attention's output and log-sum-exp, which its backward reads) are kept
_KEPT_OPS = frozenset({torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default})


def _keep_attention(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _KEPT_OPS else CheckpointPolicy.PREFER_RECOMPUTE


# torch.utils.checkpoint's ``context_fn`` for a layer checkpointed over this attention: everything but the attention
# kernel is recomputed in the backward. Its outputs are [rows, heads, positions, 64] in the model's dtype and a
# float32 log-sum-exp a head and position: 35 KiB a position over SmolLM2's 30 layers in bf16, against about 700 KiB
# for everything a layer's backward reads.
checkpoint_context = functools.partial(create_selective_checkpoint_contexts, _keep_attention)


def implementation_for(device: torch.device) -> str:
    """The ``attn_implementation`` a model on ``device`` is loaded with."""
    return NAME if device.type == "cpu" else "sdpa"
