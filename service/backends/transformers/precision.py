"""The dtype the transformers backend holds its base model and activations in: bfloat16 where the hardware multiplies
it natively (CUDA; x86 CPUs with AMX-BF16 or AVX512-BF16), float32 elsewhere; ``ARTSVC_PRECISION`` forces either.

bfloat16 halves the bytes of the weights and of every product, and AMX multiplies it several times faster than float32.
A CPU without those instructions (AVX2 only) has no bfloat16 arithmetic: its kernels convert to float32 and back around
every product, so there bfloat16 costs time and saves only memory. ARM's bf16 extensions are not counted: not measured.
Whatever the base, the LoRA weights and their optimizer state stay float32 (PEFT upcasts the adapter, as ART's GPU
trainer has it) and logits are softmaxed in float32. Under a bfloat16 base the adapter's products run in bfloat16 too
(``adapter_in_base_dtype``: autocast over the float32 weights, as mixed-precision training does on a GPU). The sampler
and the trainer compute under the same rule, so the logprobs a rollout reports are the ones the loss recomputes.
Another precision gives other numbers: the manifest locks it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def adapter_in_base_dtype(model: torch.nn.Module) -> Iterator[None]:
    """Within it, a bfloat16 base model's LoRA products run in bfloat16 (autocast, the adapter's weights still float32
    and their gradients float32); a float32 model is left as it is. PEFT otherwise casts every adapted layer's input
    to float32, adds the adapter's float32 output to the base's, and casts the sum back: a math step's training pass
    (2 packed rows of 512 on SmolLM2, 2-core AMX Xeon) took 0.86 of its time without those casts (bench/train_pass.py).
    Enter it around a backward pass too: gradient checkpointing recomputes the forward there under the same rule.
    Entered again inside itself it does nothing: switching PEFT's casts walks the model's 2,500 modules (7 ms)."""
    weight = model.get_input_embeddings().weight  # type: ignore[operator]
    device = weight.device.type
    inside = torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == torch.bfloat16
    if weight.dtype != torch.bfloat16 or inside:
        yield
        return
    from peft.helpers import disable_input_dtype_casting

    with torch.autocast(device, dtype=torch.bfloat16), disable_input_dtype_casting(model):
        yield
