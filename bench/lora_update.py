"""Benchmark: one LoRA-adapted linear layer as PEFT computes it against sampling_adapter.py's form, at the shapes the
sampler and the trainer run SmolLM2-135M's layers at (rank 16, alpha 32: a scaling of 2).

PEFT computes ``base(x) + B(A(x)) * scaling``: besides the two small products, a pass over the update for the
scaling and one for the sum, each writing a fresh tensor the size of the layer's output. sampling_adapter.py folds a
power-of-two scaling into B and adds the update into the base product's own tensor. Both sides here are checked equal
bit for bit (outputs, and in training the input's, A's and B's gradients). The ``train`` cases are why the trainer
keeps PEFT's forward: there the same form gained 0-10% a layer and nothing on a whole 2048 RL step.

- ``sample``: no gradient, bf16 weights and activations, A and B cast to bf16 once (as the sampler holds them); the
  base product through oneDNN's packed weight at decode sizes (as packed_weights.py does at 256 rows or fewer).
- ``train``: forward and backward under bf16 autocast over float32 A and B (precision.adapter_in_base_dtype), the
  base frozen, the input requiring a gradient, as a checkpointed layer's recompute and backward run it.

    python bench/lora_update.py [--rounds 7] [--label NAME]

Prints, per shape, the median microseconds of each side and their ratio; writes
``bench/results/lora_update[_LABEL].json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env_rl import machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
RANK, SCALING = 16, 2.0
LAYERS = {"q/o (576 to 576)": (576, 576), "gate/up (576 to 1,536)": (576, 1536), "down (1,536 to 576)": (1536, 576)}
SHAPES = {"sample": (8, 100, 3000), "train": (1024, 3000)}  # rows: a decode step, a 2048 validation's prefill; passes


def _timed(fn, rounds: int) -> float:
    """Median microseconds of one call, over ``rounds`` rounds of enough calls to last ~0.2 s."""
    fn()
    start = time.perf_counter()
    fn()
    calls = max(1, int(0.2 / max(time.perf_counter() - start, 1e-6)))
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def _weights(d_in: int, d_out: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(d_in * d_out)
    weight = (torch.randn(d_out, d_in, generator=generator) * 0.05).bfloat16()
    a = torch.randn(RANK, d_in, generator=generator) * 0.02
    b = torch.randn(d_out, RANK, generator=generator) * 0.01
    return weight, a, b


def sample_case(rows: int, d_in: int, d_out: int, rounds: int) -> dict:
    weight, a, b = _weights(d_in, d_out)
    a16, b16, folded = a.bfloat16(), b.bfloat16(), (b * SCALING).bfloat16()
    x = torch.randn(rows, 1, d_in).bfloat16()
    if rows <= 256 and torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 64)

        def base() -> torch.Tensor:
            return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    else:

        def base() -> torch.Tensor:
            return F.linear(x, weight)

    def peft() -> torch.Tensor:
        return base() + F.linear(F.linear(x, a16), b16) * SCALING

    def direct() -> torch.Tensor:
        return base().add_(F.linear(F.linear(x, a16), folded))

    with torch.inference_mode():
        equal = torch.equal(peft(), direct())
        return {"base_us": _timed(base, rounds), "peft_us": _timed(peft, rounds), "direct_us": _timed(direct, rounds),
                "equal": equal}  # fmt: skip


def train_case(rows: int, d_in: int, d_out: int, rounds: int) -> dict:
    weight, a, b = _weights(d_in, d_out)
    a.requires_grad_(), b.requires_grad_()
    x = torch.randn(rows, d_in).bfloat16().requires_grad_()
    grad = torch.randn(rows, d_out).bfloat16()

    def peft() -> tuple[torch.Tensor, ...]:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = F.linear(x, weight) + F.linear(F.linear(x, a), b) * SCALING
        return _backward(out)

    def direct() -> tuple[torch.Tensor, ...]:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = F.linear(x, weight).add_(F.linear(F.linear(x, a), b * SCALING))
        return _backward(out)

    def _backward(out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x.grad = a.grad = b.grad = None
        out.backward(grad)
        return out.detach(), x.grad, a.grad, b.grad

    equal = all(torch.equal(p, d) for p, d in zip(peft(), direct()))
    return {"peft_us": _timed(peft, rounds), "direct_us": _timed(direct, rounds), "equal": equal}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    machine_name = machine()
    print(machine_name, f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    cases = []
    for kind, run in (("sample", sample_case), ("train", train_case)):
        for rows in SHAPES[kind]:
            for layer, (d_in, d_out) in LAYERS.items():
                case = {"kind": kind, "rows": rows, "layer": layer, **run(rows, d_in, d_out, args.rounds)}
                case["direct_over_peft"] = case["direct_us"] / case["peft_us"]
                cases.append(case)
                print(f"{kind:6} {rows:5} rows  {layer:24} PEFT {case['peft_us']:9.1f} us  "
                      f"direct {case['direct_us']:9.1f} us  {case['direct_over_peft']:.2f}x  equal {case['equal']}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"lora_update{'_' + args.label if args.label else ''}.json"
    out.write_text(json.dumps({"machine": machine_name, "torch": torch.__version__, "threads": torch.get_num_threads(),
                               "rounds": args.rounds, "cases": cases}, indent=1) + "\n")  # fmt: skip
    print("wrote", out)


if __name__ == "__main__":
    main()
