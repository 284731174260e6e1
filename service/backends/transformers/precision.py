"""The dtype the transformers backend holds its base model and activations in: bfloat16 where the hardware multiplies
it natively (CUDA; x86 CPUs with AMX-BF16 or AVX512-BF16), float32 elsewhere; ``ARTSVC_PRECISION`` forces either.

bfloat16 halves the bytes of the weights and of every product, and AMX multiplies it several times faster than float32.
A CPU without those instructions (AVX2 only) has no bfloat16 arithmetic: its kernels convert to float32 and back around
every product, so there bfloat16 costs time and saves only memory. ARM's bf16 extensions are not counted: not measured.
Whatever the base, the LoRA weights and their optimizer state stay float32 (PEFT upcasts the adapter, as ART's GPU
trainer has it) and logits are softmaxed in float32; the sampler and the trainer share one model, so the logprobs a
rollout reports are the ones the loss recomputes. Another precision gives other numbers: the manifest locks it.
"""

from __future__ import annotations

from typing import Literal

import torch

Precision = Literal["auto", "bfloat16", "float32"]

NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # as /proc/cpuinfo and torch's cpuinfo name them
_FORCED = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware."""
    capabilities = torch.cpu.get_capabilities()
    return any(capabilities.get(flag, False) for flag in NATIVE_BF16_FLAGS)


def resolve(precision: Precision, device: torch.device) -> torch.dtype:
    """The base model's dtype on ``device``: the forced one, or for ``auto`` bfloat16 on CUDA and on a CPU with native
    bfloat16, float32 on any other; ValueError for an unknown name."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" or native_bf16() else torch.float32
    if precision not in _FORCED:
        raise ValueError(f"unknown precision {precision!r}: auto, bfloat16 or float32")
    return _FORCED[precision]


def dtype_name(dtype: torch.dtype) -> str:
    """``bfloat16`` or ``float32``, as manifests record it."""
    return str(dtype).removeprefix("torch.")
