"""The base model's frozen weights laid out once for oneDNN while sampling, where the weights are bfloat16 on a CPU.

A bfloat16 product on a CPU goes to oneDNN, which first reorders the weight into its blocked layout (AMX tiles): on
every call, for every weight. At a decode step's few rows that reorder is most of the product. On a 2-core AMX Xeon
(bench/decode_costs.py) the MLP's weights took 56-62 us a call at one row and 26 us packed, 109-111 and 61-63 us at
64 rows, the head 3.3 and 1.8 ms at 64; a whole decode step ran 1.01-1.11 times faster. The packed weights are what
inductor's CPU freezing makes (``mkldnn._reorder_linear_weight`` and ``mkldnn._linear_pointwise``), held here without
compiling anything.

They are copies: 270 MB for SmolLM2-135M, made in about 130 ms. The sampler keeps them until the adapter is about to
train (``release``), so a training step's peak memory does not hold them, and packs them again on its next batch
(a serving process, which never trains, keeps them).
Products of more than ``SMALL_PRODUCT_ROWS`` rows (a long prompt's prefill) keep the plain layout: there the packed
one, laid out for decoding, gains nothing (the head at 1,200 rows took 1.06 times as long). oneDNN picks its kernel by
shape, so a packed product may round a bfloat16 sum otherwise than the plain one (the bench's products agreed bit for
bit): the trainer's own products round by its shapes too, and ``probs_corr`` measures the two against each other
every step. Float32 weights (MKL's products, which oneDNN's do not match) and CUDA are left as they are.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

SMALL_PRODUCT_ROWS = 256  # the most rows (tokens) a product reads the packed weight at: a decode step, not a prefill

PACKED_OPS = ("_reorder_linear_weight", "_linear_pointwise", "_is_mkldnn_bf16_supported")

Product = Callable[[torch.Tensor], torch.Tensor]


@functools.cache
def _available() -> bool:
    """oneDNN's packed linear is in this torch, and oneDNN runs bfloat16 on this CPU (AVX512 or AMX; a forced bfloat16
    base on an AVX2 CPU is left to torch's own products)."""
    ops = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and all(hasattr(ops, op) for op in PACKED_OPS)
            and bool(ops._is_mkldnn_bf16_supported()))  # fmt: skip


class PackedWeights:
    """Packed copies of the weights asked for, each made on first use and kept until ``release``."""

    def __init__(self) -> None:
        self._packs: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}  # id(weight): (weight, its version, pack)

    @staticmethod
    def applies(weight: torch.Tensor) -> bool:
        """Whether products with ``weight`` are packed: bfloat16 on a CPU where oneDNN's packed linear runs it."""
        return weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and _available()

    def product(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Product:
        """``x -> F.linear(x, weight, bias)``, through the packed weight where it applies and ``x`` has few rows."""
        if not self.applies(weight):
            return lambda x: F.linear(x, weight, bias)
        packed = self._pack(weight)

        def product(x: torch.Tensor) -> torch.Tensor:
            if x.dtype != weight.dtype or x.numel() > SMALL_PRODUCT_ROWS * x.shape[-1]:
                return F.linear(x, weight, bias)
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")

        return product

    def _pack(self, weight: torch.Tensor) -> torch.Tensor:
        held = self._packs.get(id(weight))
        if held is not None and held[0] is weight and held[1] == weight._version:
            return held[2]
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 64)  # laid out for a batch of 64 rows
        self._packs[id(weight)] = (weight, weight._version, packed)
        return packed

    def release(self) -> None:
        """Free every packed copy (the next products pack again)."""
        self._packs.clear()

    def __len__(self) -> int:
        return len(self._packs)
