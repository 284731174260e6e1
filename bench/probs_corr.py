"""Where the sampler's and the trainer's probabilities part in bf16 (issue 31's ``probs_corr``): the main job's
sampler decodes 16 math problems x 8 replies in bf16, then the trainer's own pass (``training.token_logprobs``)
scores every reply in bf16, and a float32 copy of the model with the same adapter scores them as the reference.

ART's ``probs_corr`` is the correlation of exp(logprob) between the sampler's and the trainer's values over a step's
sampled tokens; this reports it over all 128 replies, each side against float32, by the reply's token position, and
the tokens that differ most. The adapter is a trained-looking one (LoRA B drawn at 0.002), the same in both models.

    python bench/probs_corr.py [--problems 16] [--float32-head]

``--float32-head`` runs the bf16 model's vocabulary head in float32 on both sides (a float32 copy of its weight), the
one change that leaves the body in bf16. Writes ``bench/results/probs_corr[_float32_head].json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import types
from datetime import date
from pathlib import Path

from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import torch  # noqa: E402

from env_rl import machine  # noqa: E402
from environments.math.env import MAX_TOKENS, MathEnvironment  # noqa: E402
from service.backends.transformers import chat, training  # noqa: E402
from service.backends.transformers.engine import PolicyEngine  # noqa: E402
from service.backends.transformers.generation import SamplingRequest  # noqa: E402
from service.backends.transformers.models import resolve_base_model  # noqa: E402

GROUP_SIZE = 8


def same_adapter(bf16: PolicyEngine, f32: PolicyEngine, seed: int = 1) -> None:
    """Both models' LoRA weights set alike, B drawn small (at initialisation B is 0 and the adapter does nothing)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for (name, a), (_, b) in zip(bf16.model.named_parameters(), f32.model.named_parameters()):
            if "lora_B" in name:
                a.copy_(torch.randn(a.shape, generator=generator) * 0.002)
            if "lora_" in name:
                b.copy_(a)


def load_adapter(engine: PolicyEngine, folder: Path) -> None:
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    set_peft_model_state_dict(engine.model, load_peft_weights(str(folder), device="cpu"))


def float32_head(engine: PolicyEngine) -> None:
    head = engine.model.get_output_embeddings()
    weight = head.weight.detach().float()
    def forward(self: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):  # the sampler runs under the adapter's bf16 autocast
            return torch.nn.functional.linear(hidden.float(), weight)

    head.forward = types.MethodType(forward, head)


def refined_head(engine: PolicyEngine, top: int) -> None:
    """The bf16 head, then each position's ``top`` largest logits computed again in float32 from the same bf16 hidden
    state and weights: the products' own sums, before the head's output is rounded to bf16."""
    head = engine.model.get_output_embeddings()
    weight = head.weight

    def forward(self: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        logits = torch.nn.functional.linear(hidden, weight).float()
        with torch.autocast("cpu", enabled=False):
            ids = logits.topk(top, dim=-1).indices
            exact = (weight[ids].float() @ hidden.float().unsqueeze(-1)).squeeze(-1)
        return logits.scatter(-1, ids, exact)

    head.forward = types.MethodType(forward, head)


def trainer_logprobs(engine: PolicyEngine, replies: list[tuple[tuple[int, ...], list[int]]]) -> torch.Tensor:
    """Each reply token's logprob from the trainer's pass over prompt and reply."""
    values = []
    for prompt, reply in replies:
        tokens = torch.tensor([list(prompt) + reply])
        length = tokens.shape[1]
        causal = torch.tril(torch.ones(length, length, dtype=torch.bool)).unsqueeze(0)
        with torch.no_grad():
            logprobs, _ = training.token_logprobs(engine.model, tokens, causal, torch.arange(length).unsqueeze(0))
        values += logprobs[0, len(prompt) - 1 : length - 1].tolist()
    return torch.tensor(values)


def corr(a: torch.Tensor, b: torch.Tensor) -> float:
    """ART's probs_corr: the correlation of the two sides' probabilities."""
    return float(torch.corrcoef(torch.stack([a.exp(), b.exp()]))[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=16)
    parser.add_argument("--float32-head", action="store_true")
    parser.add_argument("--refined-head", type=int, default=0, metavar="K")
    parser.add_argument("--mixed", action="store_true",
                        help="the sampler and trainer a float32 model under bf16 autocast: products in bf16, the rest float32")
    parser.add_argument("--adapter", type=Path, help="a trained adapter (a job's checkpoint folder) in both models")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="probs-corr-") as work:
        base = resolve_base_model("SmolLM2-135M-Instruct", Path(work) / "base-models")
        bf16 = PolicyEngine(Path(work) / "bf16", base, dtype=torch.float32 if args.mixed else torch.bfloat16)
        computing = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.mixed else contextlib.nullcontext
        f32 = PolicyEngine(Path(work) / "f32", base, dtype=torch.float32)
        if args.adapter:
            load_adapter(bf16, args.adapter)
            load_adapter(f32, args.adapter)
        else:
            same_adapter(bf16, f32)
        if args.float32_head:
            float32_head(bf16)
        if args.refined_head:
            refined_head(bf16, args.refined_head)
        env = MathEnvironment()
        scenarios = list(env.scenarios("train"))[: args.problems]
        prompts = [tuple(chat.render_prompt(bf16.tokenizer, env.opening(s), None)) for s in scenarios]
        requests = [SamplingRequest(prompt_ids=p, n=GROUP_SIZE, max_tokens=MAX_TOKENS, seed=i)
                    for i, p in enumerate(prompts)]  # fmt: skip
        with computing():
            samples = [s for prompt_samples in bf16.generate(requests) for s in prompt_samples]
        replies = [(prompts[i // GROUP_SIZE], s.token_ids) for i, s in enumerate(samples)]  # a request's n in order
        sampler = torch.tensor([v for s in samples for v in s.logprobs])
        with computing():
            trainer = trainer_logprobs(bf16, replies)
        reference = trainer_logprobs(f32, replies)
    position = torch.tensor([i for s in samples for i in range(len(s.token_ids))])
    reply = torch.tensor([r for r, s in enumerate(samples) for _ in s.token_ids])
    gap = (sampler - trainer).abs()
    by_position = {}
    for name, chosen in (("0", position == 0), ("1", position == 1), ("2", position == 2), ("3+", position >= 3)):
        by_position[name] = {"tokens": int(chosen.sum()), "corr": corr(sampler[chosen], trainer[chosen]),
                             "mean_abs_logprob_gap": float(gap[chosen].mean())}  # fmt: skip
    result = {
        "date": date.today().isoformat(),
        "machine": machine(),
        "float32_head": args.float32_head,
        "refined_head": args.refined_head,
        "mixed": args.mixed,
        "adapter": str(args.adapter) if args.adapter else "random (LoRA B drawn at 0.002)",
        "tokens": len(sampler),
        "corr_sampler_trainer": corr(sampler, trainer),
        "corr_sampler_float32": corr(sampler, reference),
        "corr_trainer_float32": corr(trainer, reference),
        "max_abs_logprob_gap": float(gap.max()),
        "mean_abs_logprob_gap_to_float32": {"sampler": float((sampler - reference).abs().mean()),
                                            "trainer": float((trainer - reference).abs().mean())},
        "max_abs_logprob_gap_to_float32": {"sampler": float((sampler - reference).abs().max()),
                                           "trainer": float((trainer - reference).abs().max())},
        "by_reply_position": by_position,
        "largest_gaps": [{"position": int(position[k]), "reply": int(reply[k]), "sampler": float(sampler[k].exp()),
                          "trainer": float(trainer[k].exp()), "float32": float(reference[k].exp())}
                         for k in gap.argsort(descending=True)[:8].tolist()],  # fmt: skip
    }
    suffix = "_float32_head" if args.float32_head else f"_refined_head{args.refined_head}" if args.refined_head else ""
    suffix += ("_mixed" if args.mixed else "") + ("_trained" if args.adapter else "")
    out = ROOT / "bench" / "results" / f"probs_corr{suffix}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "largest_gaps"}, indent=2))


if __name__ == "__main__":
    main()
