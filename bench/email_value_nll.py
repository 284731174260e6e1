"""Benchmark: what a warm start taught the email agent, token by token. The teacher's episodes on held-out (val)
questions, scored by a policy: the mean negative log-likelihood of the replies' tokens, split into the calls' fixed
text (``<tool_call>``, the tool's name, the keys) and their arguments' values (the search keywords, the message id,
the answer), with the first search's keywords and the answer's value apart. Under ``tool_choice: "required"`` the
grammar writes much of the fixed text anyway; the values are what the policy must choose.

    python bench/email_value_nll.py --base DIR [--adapter CHECKPOINT_DIR] [--questions 16] [--label L]

``--base`` is a job's base model (``$ARTSVC_DATA_DIR/cache/base-models/SmolLM2-135M-Instruct-*``), ``--adapter`` a
checkpoint of its model (``$ARTSVC_DATA_DIR/models/artsvc/models/<model>/checkpoints/0000``, the warm start); without
it the base model is scored. Writes ``bench/results/email_value_nll_<label>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm

from env_rl import machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("fixed", "value", "first_search_value", "answer_value")


def value_characters(reply: str) -> set[int]:
    """Positions in a reply's text of the characters inside its arguments' string values (a key's text is not)."""
    inside: set[int] = set()
    start = reply.find('"arguments": ')
    if start < 0:
        return inside
    in_string = is_value = False
    expect_key = True
    i = start + len('"arguments": ')
    while i < len(reply):
        char = reply[i]
        if in_string:
            if char == "\\":
                inside.update((i, i + 1) if is_value else ())
                i += 2
                continue
            if char == '"':
                in_string = False
            elif is_value:
                inside.add(i)
        elif char == '"':
            in_string, is_value = True, not expect_key
        elif char in "{,":
            expect_key = char == "{" or not _in_list(reply, start, i)
        elif char in ":[":
            expect_key = False
        i += 1
    return inside


def _in_list(reply: str, start: int, at: int) -> bool:
    """Whether position ``at`` lies inside a JSON list of the arguments (a list's commas separate values)."""
    depth = 0
    for char in reply[start:at]:
        depth += {"[": 1, "]": -1}.get(char, 0)
    return depth > 0


def score(engine, rows) -> dict[str, dict[str, float]]:
    """Summed NLL and token counts of each kind over the rows' assistant tokens."""
    import torch

    from service.backends.transformers import training

    sums = {kind: [0.0, 0] for kind in KINDS}
    for row in rows:
        tokens = torch.tensor([row.token_ids])
        n = tokens.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool).tril().unsqueeze(0)
        with torch.no_grad():
            logprobs, _ = training.token_logprobs(engine.model, tokens, causal, torch.arange(n)[None])
        logprobs = logprobs[0].float()  # position p: the log-probability of token p + 1
        for number, (first, end) in enumerate(_spans(row.assistant_mask)):
            texts = [engine.tokenizer.decode(row.token_ids[first : q + 1]) for q in range(first, end)]
            reply, values = texts[-1], value_characters(texts[-1])
            for q in range(first, end):
                begin = len(texts[q - first - 1]) if q > first else 0
                is_value = any(c in values for c in range(begin, len(texts[q - first])))
                nll = -float(logprobs[q - 1])
                kinds = ["value" if is_value else "fixed"]
                if is_value and number == 0 and '"search_inbox"' in reply:
                    kinds.append("first_search_value")
                if is_value and '"return_final_answer"' in reply and '"source_ids"' not in reply[:begin]:
                    kinds.append("answer_value")
                for kind in kinds:
                    sums[kind][0] += nll
                    sums[kind][1] += 1
    return {kind: {"tokens": count, "mean_nll": round(total / max(count, 1), 4)}
            for kind, (total, count) in sums.items()}  # fmt: skip


def _spans(mask: list[int]) -> list[tuple[int, int]]:
    spans, first = [], None
    for position, on in enumerate([*mask, 0]):
        if on and first is None:
            first = position
        elif not on and first is not None:
            spans.append((first, position))
            first = None
    return spans


def teacher_rows(tokenizer, questions: int):
    """The teacher's episodes on the first ``questions`` val questions, as the warm start tokenises them."""
    import art

    from environments.email.agents import demonstrator, play
    from environments.email.env import EmailEnvironment
    from service.backends.transformers import training

    env = EmailEnvironment()
    episodes = []
    for seed, scenario in enumerate(env.scenarios("val")[:questions]):
        played = play(scenario, demonstrator, max_turns=env.max_turns, seed=seed, opening=env.opening(scenario))
        episodes.append(art.Trajectory(messages_and_choices=played.messages, tools=list(env.tools), reward=1.0))
    return training.sft_rows(tokenizer, episodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--adapter", type=Path)
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--label", default="base")
    args = parser.parse_args()

    from service.backends import layout
    from service.backends.transformers.engine import PolicyEngine

    with tempfile.TemporaryDirectory() as folder:
        model_dir = Path(folder) / "model"
        if args.adapter:  # the engine loads a model directory's newest checkpoint
            shutil.copytree(args.adapter, layout.checkpoint_dir(model_dir, 0))
        engine = PolicyEngine(model_dir, args.base)
        result = {"machine": machine(), "adapter": str(args.adapter) if args.adapter else None,
                  "precision": str(engine.dtype), "questions": args.questions,
                  "nll": score(engine, teacher_rows(engine.tokenizer, args.questions))}  # fmt: skip
    print(json.dumps(result, indent=1))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"email_value_nll_{args.label}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
