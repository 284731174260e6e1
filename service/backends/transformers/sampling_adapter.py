"""The LoRA adapter as the sampler runs it: PEFT's arithmetic without PEFT's per-call work.

A decode step calls every adapted layer once (7 a layer on SmolLM2, 30 layers: 210 calls a decoded token), and for
each PEFT walks its active adapters, checks variants and casts, calls four modules (the base layer, dropout, A and B)
and, under the trainer's autocast (precision.adapter_in_base_dtype), casts A's and B's float32 weights to bfloat16
again: autocast keeps no cast under inference mode. Within ``adapter_as_sampled`` each adapted layer computes
``base(x) + B(A(x)) * scaling`` directly, with A and B cast to the base's dtype once on entry. These are the
operations PEFT runs, on the same values, so a sample's tokens and logprobs are the same bit for bit (a test holds
them to it), and the trainer still recomputes exactly what the sampler reported. A layer PEFT would run otherwise (its
adapter disabled or merged, a variant such as DoRA, dropout that is active, several adapters at once) keeps PEFT's
forward. On a 2-core AMX Xeon a math step's 64 rollouts were sampled 1.17x faster in bfloat16 and 1.10x in float32
(bench/sampling_adapter.py). Given ``PackedWeights``, the base products and the output head's go through its packed
copies where it packs them (packed_weights.py). The scaling is folded into B where it is a power of two (alpha 32 over
rank 16: 2), which rounds the same, and the update is added into the base product's own tensor: a prefill of 3,000
positions otherwise wrote two more tensors the size of the layer's output (each a fresh allocation, its pages faulted
in), and took up to twice the base product's time (a 2-core Zen 4, 576 outputs: 10.6 ms against 5.6 ms;
bench/lora_update.py). The trainer keeps PEFT's forward: the same two changes there, with autograd, left a 2048 RL step
as it was (1.01x).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from peft.tuners.lora.layer import Linear as LoraLinear

from service.backends.transformers.packed_weights import PackedWeights


@contextmanager
def adapter_as_sampled(model: torch.nn.Module, packed: PackedWeights | None = None) -> Iterator[None]:
    """Within it, every plainly adapted linear layer of ``model`` computes its active adapter directly, in the base
    weights' dtype, its base product and the output head's through ``packed`` where given; on exit (an error included)
    each has its own forward again. Entered inside itself, the inner one leaves the layers to the outer (which alone
    gives them back)."""
    replaced = [module for module in model.modules()
                if isinstance(module, LoraLinear) and "forward" not in module.__dict__ and _plain(module)]  # fmt: skip
    for module in replaced:
        module.forward = _direct(module, packed)  # an instance attribute: nn.Module's call finds it before the class's
    head = model.get_output_embeddings()  # type: ignore[operator]
    if packed is not None and type(head) is torch.nn.Linear and "forward" not in head.__dict__:
        head.forward = packed.product(head.weight, head.bias, head=True)
        replaced.append(head)
    try:
        yield
    finally:
        for module in replaced:
            del module.forward


def _folds(scaling: float) -> bool:
    """Whether ``scaling`` is a power of two: ``(B * scaling) h`` then rounds as ``(B h) * scaling`` does, bit for
    bit (an exponent's change commutes with rounding)."""
    return math.frexp(scaling)[0] == 0.5


def _plain(layer: LoraLinear) -> bool:
    """Whether PEFT would compute ``base(x) + B(A(dropout(x))) * scaling`` with an identity dropout, for one adapter."""
    if layer.disable_adapters or layer.merged or len(layer.active_adapters) != 1:
        return False
    name = layer.active_adapters[0]
    if name not in layer.lora_A or name in layer.lora_variant:
        return False
    dropout = layer.lora_dropout[name]
    return isinstance(dropout, torch.nn.Identity) or not dropout.training


def _direct(layer: LoraLinear, packed: PackedWeights | None) -> Callable[..., torch.Tensor]:
    name = layer.active_adapters[0]
    weight, bias = layer.base_layer.weight, layer.base_layer.bias
    base = packed.product(weight, bias) if packed is not None else lambda x: F.linear(x, weight, bias)
    a = layer.lora_A[name].weight.detach().to(weight.dtype)
    scaling = layer.scaling[name]
    folded = _folds(scaling)
    b = (layer.lora_B[name].weight.detach() * (scaling if folded else 1)).to(weight.dtype)
    peft_forward = type(layer).forward.__get__(layer)

    def forward(x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        if args or kwargs or x.dtype != weight.dtype:  # a call the sampler never makes: PEFT's own handling
            return peft_forward(x, *args, **kwargs)
        update = F.linear(F.linear(x, a), b)
        if not folded:
            update.mul_(scaling)
        return base(x).add_(update)  # PEFT's ``result + B(A(x)) * scaling``, into the base product's fresh tensor

    return forward
