"""How many layers of a training pass keep their activations for the backward instead of recomputing them.

Gradient checkpointing recomputes every layer's forward in the backward: memory for time. On two CPU cores the
recompute was a quarter of the main job's RL step (``bench/rl_step_ab.py``: a math step of 24 episodes took 0.71 of
the time with every layer's activations kept, at 1.0 GiB more peak). What a layer keeps grows with the positions a
pass computes (for SmolLM2-135M in bf16, 22 KiB a position and 7 MiB a pass), so a pass keeps the activations of as
many of its last layers as fit a budget in bytes and recomputes the others. Kept or recomputed, a layer's outputs and
gradients are the same (tests/service/test_selective_checkpointing.py), so the budget moves time and memory, never a
result.

The budget is the operator's (``ARTSVC_ACTIVATION_MEMORY_GIB``). The default, where the base weights are bf16 (or
another 16-bit type), is 0.5 GiB (an eighth of the machine's memory where that is less): about half the layers of the
main job's passes (0.9 GiB for all of them) and a sixth of an agent's (2048's and email's: 2.7-2.9 GiB). In float32
(a CPU without bf16 units) it is 0: there the main job's peak was 3.59 GiB at 0.5 GiB and 2.62 GiB at 0, in the
same wall time (524 and 521 s; its passes 8.2 against 9.0 s a step, its sampling the faster by as much), on a 2-core
AVX2 Zen 3 (README, Results, 2026-12-06). At 1 GiB, every layer of the main job's passes kept, its peak was
2.71-3.05 GiB over three runs, past issue 31's 3 GiB once; at 0.5 GiB, 2.89 GiB on the seed that peaked at 3.05 (README,
Results, "The adapter's update written in place"). Every layer of an agent's passes kept ran a 2048 step 0.87x as long
alone, but a whole 2048 job no faster, at a peak 2 GiB higher ("Activations kept within a budget"). A pass longer than
the budget holds (a client's long trajectory) keeps fewer layers rather than more memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from transformers.modeling_layers import GradientCheckpointingLayer

from service.backends.transformers import attention, shared_prefix

DEFAULT_BUDGET_BYTES = 512 << 20
CALIBRATION_POSITIONS = (128, 384)  # the passes that measure what a layer keeps (measure)


def default_budget(dtype: torch.dtype) -> int:
    """For base weights in ``dtype``: 0 in a 32-bit type (every layer recomputed); else DEFAULT_BUDGET_BYTES, or an
    eighth of this machine's memory where that is less (where the memory cannot be read: 0)."""
    if dtype.itemsize > 2:
        return 0
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 0
    return min(DEFAULT_BUDGET_BYTES, total // 8)


def checkpointed_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The layers that recompute their activations in the backward (a decoder layer each), in the order a forward
    runs them."""
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]


def layers_to_keep(layers: int, positions: int, kept: tuple[float, float], budget: int) -> int:
    """How many of ``layers`` keep their activations for a pass computing ``positions`` within ``budget`` bytes, each
    keeping ``kept`` (bytes a position, bytes a pass)."""
    if layers <= 0 or budget <= 0:
        return 0
    per_position, per_pass = kept
    per_layer = max(positions, 1) * per_position + per_pass
    return min(layers, int(budget // per_layer)) if per_layer > 0 else layers


@contextmanager
def kept(layers: list[torch.nn.Module], count: int) -> Iterator[None]:
    """Within it, the last ``count`` of ``layers`` (checkpointed ones, as ``checkpointed_layers`` lists them) keep their
    activations for the backward instead of recomputing them; enter it around the pass's forward and backward."""
    keeping = layers[len(layers) - count :] if count > 0 else []
    for layer in keeping:
        layer.gradient_checkpointing = False
    try:
        yield
    finally:
        for layer in keeping:
            layer.gradient_checkpointing = True


def saved_bytes(run: Callable[[], object]) -> int:
    """The bytes of the distinct storages autograd saves for the backward while ``run()`` computes."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(storages.values())


class KeptActivations:
    """A training pass's budget for kept activations (``budget`` bytes), applied per pass: ``measure(model, kind)``
    gives what one layer keeps in a pass of that kind, as (bytes a position, bytes a pass), measured once a kind, on
    the first pass of it that has layers to choose from."""

    def __init__(self, budget: int, measure: Callable[[Any, str], tuple[float, float]]) -> None:
        self.budget = budget
        self._measure = measure
        self._kept: dict[str, tuple[float, float]] = {}

    @contextmanager
    def around(self, model: torch.nn.Module, positions: int, *, kind: str) -> Iterator[int]:
        """Around a pass of ``kind`` computing ``positions``: as many of its last layers as fit the budget keep their
        activations (how many is what it yields)."""
        layers = checkpointed_layers(model) if self.budget > 0 else []
        if not layers:
            yield 0
            return
        if kind not in self._kept:
            self._kept[kind] = self._measure(model, kind)
        count = layers_to_keep(len(layers), positions, self._kept[kind], self.budget)
        with kept(layers, count):
            yield count


def around_pass(kept: KeptActivations | None, model: torch.nn.Module, inputs: dict[str, torch.Tensor],
                mask: torch.Tensor) -> AbstractContextManager[object]:  # fmt: skip
    """Around a pass over ``inputs``' rows under ``mask`` (its forward and backward): the layers whose activations it
    keeps, counted for what the pass is: rows each holding one sequence (a plain causal mask, which the CPU's
    attention computes with its keys repeated for every query head, so a layer keeps more a position) or packed."""
    if kept is None:
        return nullcontext()
    if not shared_prefix.applies(model):
        return kept.around(model, inputs["tokens"].numel(), kind="packed")
    computed = shared_prefix.computed_positions(inputs["tokens"], inputs["input_pos"])
    plain = attention.is_plain_causal(mask.unsqueeze(1)) and not shared_prefix.shared_length(
        inputs["tokens"], inputs["input_pos"], mask)  # fmt: skip
    return kept.around(model, computed, kind="plain" if plain else "packed")


Pass = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object]  # (tokens, mask, positions): a training forward


def measure(model: torch.nn.Module, kind: str, run: Pass,
            mask_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> tuple[float, float]:  # fmt: skip
    """What one layer of ``model`` keeps for the backward were it not checkpointed, as (bytes a position it computes,
    bytes a pass): ``run`` over one row holding one sequence (``kind`` "plain") or two packed ("packed"; ``mask_of``
    their group and parent ids), at each of CALIBRATION_POSITIONS, as what autograd saves with every layer's
    activations kept less what it saves with every layer recomputed, shared among the checkpointed layers; the line
    through the two."""
    layers = checkpointed_layers(model)
    training = model.training
    model.train()
    try:
        kept = [_kept_by_all(model, layers, kind, length, run, mask_of) / max(len(layers), 1)
                for length in CALIBRATION_POSITIONS]  # fmt: skip
    finally:
        model.train(training)
    (short, long), (at_short, at_long) = CALIBRATION_POSITIONS, kept
    per_position = max(at_long - at_short, 0.0) / (long - short)
    return per_position, max(at_short - per_position * short, 0.0)


def _kept_by_all(model: torch.nn.Module, layers: list[torch.nn.Module], kind: str, length: int, run: Pass,
                 mask_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> int:  # fmt: skip
    device = next(model.parameters()).device
    tokens = torch.zeros(1, length, dtype=torch.long, device=device)
    positions = torch.arange(length, device=device).unsqueeze(0)
    sequences = torch.zeros_like(tokens)
    if kind == "packed":
        sequences[:, length // 2 :] = 1
    mask = mask_of(sequences, torch.full_like(tokens, -1))
    recomputed = saved_bytes(lambda: run(tokens, mask, positions))
    with kept(layers, len(layers)):
        return max(saved_bytes(lambda: run(tokens, mask, positions)) - recomputed, 0)
