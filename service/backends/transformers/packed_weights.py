"""The base model's frozen weights laid out once for oneDNN while sampling, on a CPU: every product's where the weights
are bfloat16, the output head's where they are float32.

A bfloat16 product on a CPU goes to oneDNN, which first reorders the weight into its blocked layout (AMX tiles): on
every call, for every weight. At a decode step's few rows that reorder is most of the product. On a 2-core AMX Xeon
(bench/decode_costs.py) the MLP's weights took 56-62 us a call at one row and 26 us packed, 109-111 and 61-63 us at
64 rows, the head 3.3 and 1.8 ms at 64; a whole decode step ran 1.01-1.11 times faster. The packed weights are what
inductor's CPU freezing makes (``mkldnn._reorder_linear_weight`` and ``mkldnn._linear_pointwise``), held here without
compiling anything.

A float32 product goes to MKL, which at a decode step's rows runs the vocabulary head (576 -> 49,152 on SmolLM2) far
below its rate: on a 2-core AVX2 Zen 3, 47-61 GFLOP/s at 64 rows and 12-17 at 8, against oneDNN's packed 94-110 and
29-44 (bench/packed_head.py); the layers' own products (at most 1,536 outputs) went either way (0.6-1.5x). So in float32
the head alone is packed: 113 MB for SmolLM2, where every weight would be 540 MB more beside the sampler's caches,
against issue 31's 3 GiB. oneDNN sums in another order than MKL, so a float32 logprob differs in its last bits from
the trainer's, which ``probs_corr`` measures every step.

They are copies: 270 MB for SmolLM2-135M in bfloat16, made in about 130 ms. The sampler keeps them until the adapter
is about to train (``release``), so a training step's peak memory does not hold them, and packs them again on its next
batch (a serving process, which never trains, keeps them).
Products of more than ``SMALL_PRODUCT_ROWS`` rows (a long prompt's prefill) keep the plain layout: there the packed
one, laid out for decoding, gains nothing (the head at 1,200 rows took 1.06 times as long). oneDNN picks its kernel by
shape, so a packed product may round a bfloat16 sum otherwise than the plain one (the bench's products agreed bit for
bit): the trainer's own products round by its shapes too, and ``probs_corr`` measures the two against each other
every step. CUDA is left as it is.
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
def _available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """oneDNN's packed linear is in this torch, and oneDNN runs ``dtype`` on this CPU: float32 on any, bfloat16 with
    AVX512 or AMX (a forced bfloat16 base on an AVX2 CPU is left to torch's own products)."""
    ops = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and all(hasattr(ops, op) for op in PACKED_OPS)
            and (dtype == torch.float32 or bool(ops._is_mkldnn_bf16_supported())))  # fmt: skip


class PackedWeights:
    """Packed copies of the weights asked for, each made on first use and kept until ``release``."""

    def __init__(self) -> None:
        self._packs: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}  # id(weight): (weight, its version, pack)

    @staticmethod
    def applies(weight: torch.Tensor, *, head: bool = False) -> bool:
        """Whether products with ``weight`` (the output head's if ``head``) are packed: on a CPU where oneDNN's packed
        linear runs its dtype, every bfloat16 weight and a float32 head."""
        packs = weight.dtype == torch.bfloat16 or (head and weight.dtype == torch.float32)
        return packs and weight.device.type == "cpu" and _available(weight.dtype)

    def product(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, head: bool = False) -> Product:
        """``x -> F.linear(x, weight, bias)``, through the packed weight where it applies (``head``: the output
        head's product) and ``x`` has few rows."""
        if not self.applies(weight, head=head):
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
