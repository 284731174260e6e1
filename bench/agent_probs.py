"""Where an agent's sampled and trained probabilities part (issue 31's ``probs_corr`` on email: 0.94-0.96 at single
steps, 0.996-0.9995 at the others). Plays an environment's validation scenarios, sampled, through the transformers
backend served as a job serves it; tokenises the episodes as a training step does (``training.tokenize_groups``,
ART's tokeniser) and scores each one with the trainer's own pass (``training.token_logprobs``, no grad). Then reports
``probs_corr`` over all of them, each episode's, each turn's mean |Δ logprob|, and the tokens that part most with the
text before them: a turn whose every token parts says the trainer read another context than the sampler did; a lone
token, rounding at a near tie.

    python bench/agent_probs.py [--env email] [--examples 16] [--adapter DIR] [--label L]

``--adapter`` loads a job's LoRA adapter first (a warm-started ``reference`` folder plays an agent's episodes as a
job does). Writes ``bench/results/agent_probs[_LABEL].json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import art  # noqa: E402
import torch  # noqa: E402

import environments  # noqa: E402
from env_rl import machine  # noqa: E402
from service.backends import make_backend  # noqa: E402
from service.backends.transformers import training  # noqa: E402
from service.training.validation import validate  # noqa: E402


def scored(engine, result) -> list[dict]:  # noqa: ANN001 - a PolicyEngine and an ART TokenizedResult
    """Each sampled token of one tokenised episode: its turn, the sampler's and the trainer's logprob."""
    packed = training.pack([result], seq_len=0)
    tokens, positions = packed["tokens"], packed["input_pos"]
    mask = training.packed_attention_mask(packed["group_ids"], packed["parent_ids"])
    with torch.no_grad():
        new, _ = training.token_logprobs(engine.model, tokens, mask, positions)
    old, ids = packed["logprobs"][0], tokens[0].tolist()
    turn_starts = sorted(result.choice_offsets)
    rows = []
    for at in (~torch.isnan(old)).nonzero().flatten().tolist():
        turn = sum(start <= at for start in turn_starts) - 1
        rows.append({"at": at, "turn": turn, "token": ids[at], "sampled": float(old[at]), "trained": float(new[0, at - 1])})
    return rows


def corr(pairs: list[tuple[float, float]]) -> float | None:
    """ART's probs_corr: the correlation of the two sides' probabilities."""
    if len(pairs) < 2:
        return None
    value = torch.corrcoef(torch.tensor(pairs, dtype=torch.float64).exp().T)[0, 1].item()
    return None if math.isnan(value) else value


async def play(args: argparse.Namespace, data: Path) -> dict:
    env = environments.load(args.env, {})
    backend = make_backend("transformers", data_dir=data, seed=args.seed)
    model = art.TrainableModel(name="probs", project="probs", base_model="SmolLM2-135M-Instruct",
                               base_path=str(data / "art"))  # fmt: skip
    await model.register(backend)
    engine = backend._engines[model.name]
    if args.adapter:
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        set_peft_model_state_dict(engine.model, load_peft_weights(str(args.adapter), device="cpu"))
    rows = list(env.scenarios("val"))[: args.examples]
    values, episodes = await validate(env, model, rows, seed=args.seed, temperature=1.0, greedy=False)
    # distinct rewards, so ART's tokeniser keeps every episode (it skips those without advantage)
    group = art.TrajectoryGroup([t.model_copy(update={"reward": float(2 * i + 1)}) for i, t in enumerate(episodes)])
    results = training.tokenize_groups(engine.tokenizer, [group], scale_rewards=False)
    report = []
    for result in results:
        tokens = scored(engine, result)
        turns = {}
        for token in tokens:
            turns.setdefault(token["turn"], []).append(abs(token["sampled"] - token["trained"]))
        worst = max(tokens, key=lambda t: abs(t["sampled"] - t["trained"]), default=None)
        if worst is not None:
            before = result.token_ids[max(0, worst["at"] - 40) : worst["at"]]
            worst = {**worst, "before": engine.tokenizer.decode(before), "text": engine.tokenizer.decode([worst["token"]])}
        report.append({"tokens": len(tokens), "probs_corr": corr([(t["sampled"], t["trained"]) for t in tokens]),
                       "turn_mean_abs_gap": {k: statistics.fmean(v) for k, v in sorted(turns.items())},
                       "worst": worst, "pairs": [(t["sampled"], t["trained"]) for t in tokens],
                       "messages": result.trajectory.messages(),
                       "token_text": [[t["turn"], engine.tokenizer.decode([t["token"]]), round(t["sampled"], 3),
                                       round(t["trained"], 3)] for t in tokens]})  # fmt: skip
    await backend.close()
    return {"accuracy": values.accuracy, "outcomes": values.outcomes, "episodes": report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="email")
    parser.add_argument("--examples", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--adapter", type=Path)
    parser.add_argument("--data", type=Path, help="a data directory whose converted base model is cached")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agent-probs-") as work:
        result = asyncio.run(play(args, args.data or Path(work)))
    episodes = result["episodes"]
    every = [pair for episode in episodes for pair in episode.pop("pairs")]
    print(f"{len(episodes)} episodes, {len(every)} sampled tokens; probs_corr over all: {corr(every)}")
    for i, episode in enumerate(episodes):
        worst = episode["worst"] or {}
        gaps = " ".join(f"{v:.3f}" for v in episode["turn_mean_abs_gap"].values())
        print(f"episode {i}: corr {episode['probs_corr']}, turns' mean |gap| {gaps}; worst token {worst.get('text')!r} "
              f"at turn {worst.get('turn')}: sampled {worst.get('sampled', 0):.3f}, trained {worst.get('trained', 0):.3f}")
    out = ROOT / "bench" / "results" / f"agent_probs{'_' + args.label if args.label else ''}.json"
    out.write_text(json.dumps({"machine": machine(), "env": args.env, "examples": args.examples, "seed": args.seed,
                               "adapter": str(args.adapter) if args.adapter else None,
                               "probs_corr": corr(every), **result}, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
