"""The embedded policy: a small character-level GPT, read top to bottom like nanoGPT.

Its output distribution covers only the tokens a reply may contain (ASCII characters and
``<eot>``); sampling and training both use :func:`output_logprobs`, so the logprobs the server
returns are exactly the ones the trainer optimises.
"""

from __future__ import annotations

import math
import threading
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F

from service.backends.embedded.tokenizer import EMITTABLE_IDS, VOCAB_SIZE

_GLOBAL_RNG = threading.Lock()  # weight init draws from torch's global RNG, which every thread shares


@dataclass(frozen=True)
class PolicyConfig:
    vocab_size: int = VOCAB_SIZE  # characters plus chat special tokens
    block_size: int = 192  # context length in tokens; longer conversations are truncated from the left
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads per block
    n_embd: int = 128  # residual stream width

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


# Named architectures a job can ask for as its ``base_model``.
PRESETS: dict[str, PolicyConfig] = {
    "embedded/char-gpt-0.8m": PolicyConfig(),
    "embedded/char-gpt-0.2m": PolicyConfig(n_layer=3, n_head=4, n_embd=64),
    # Agent conversations (tool calls and their results) need room: 1024 characters of context.
    "embedded/char-gpt-0.8m-1k": PolicyConfig(block_size=1024),
}
DEFAULT_BASE_MODEL = "embedded/char-gpt-0.8m"


KVCache = list[tuple[torch.Tensor, torch.Tensor]]


class SelfAttention(nn.Module):
    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cache is not None:  # incremental decoding: attend to the cached prefix too
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        # A prefix pass is causal; an incremental step (one new token) sees the whole cache.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y), (k, v)


class Block(nn.Module):
    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = SelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(config.n_embd, 4 * config.n_embd),
            nn.GELU(),
            nn.Linear(4 * config.n_embd, config.n_embd),
        )

    def forward(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None = None):
        attn_out, new_cache = self.attn(self.ln_1(x), cache)
        x = x + attn_out
        x = x + self.mlp(self.ln_2(x))
        return x, new_cache


class CharGPT(nn.Module):
    """Decoder-only transformer over characters with learned absolute positions."""

    def __init__(self, config: PolicyConfig, *, seed: int | None = None) -> None:
        """``seed`` fixes the initial weights even while other threads build models (a checkpoint's
        weights are loaded over unseeded ones)."""
        super().__init__()
        with _GLOBAL_RNG, torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            self.config = config
            self.wte = nn.Embedding(config.vocab_size, config.n_embd)
            self.wpe = nn.Embedding(config.block_size, config.n_embd)
            self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
            self.ln_f = nn.LayerNorm(config.n_embd)
            # Untied from wte (unlike GPT-2): RL then reshapes what the policy says without
            # moving how it reads its prompt (see rl_parameters).
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
            self.apply(self._init_weights)
            for name, param in self.named_parameters():  # scaled init of residual projections
                if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                    nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        mask = torch.full((config.vocab_size,), float("-inf"))
        mask[list(EMITTABLE_IDS)] = 0.0
        self.register_buffer("output_mask", mask, persistent=False)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def rl_parameters(self) -> list[nn.Parameter]:
        """What RL updates: everything but the token and position embeddings.

        RL gradients are few and noisy; on the embeddings they scramble how the policy reads
        its prompt (a handful of GRPO steps took greedy accuracy from 99% to 70% in our runs).
        Freezing them is the CPU analogue of LoRA leaving a large model's embeddings alone.
        """
        frozen = {id(self.wte.weight), id(self.wpe.weight)}
        return [p for p in self.parameters() if id(p) not in frozen]

    def forward(
        self, idx: torch.Tensor, cache: KVCache | None = None, start_pos: int = 0
    ) -> tuple[torch.Tensor, KVCache]:
        """Logits for every position of ``idx`` (B, T), and the updated key/value cache."""
        T = idx.size(1)
        if start_pos + T > self.config.block_size:
            raise ValueError(f"sequence of {start_pos + T} tokens exceeds block size {self.config.block_size}")
        pos = torch.arange(start_pos, start_pos + T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        new_cache: KVCache = []
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(x, None if cache is None else cache[i])
            new_cache.append(layer_cache)
        return self.lm_head(self.ln_f(x)), new_cache

    def output_logprobs(self, logits: torch.Tensor) -> torch.Tensor:
        """Log-probabilities over the emittable tokens (others get -inf)."""
        return F.log_softmax(logits + self.output_mask, dim=-1)
