"""How much of an agent's turn is encoding the conversation again? (issue 31: every token computed once)

Plays email-agent episodes with the scripted demonstrator (its tool calls, the tools' real answers), then asks
SmolLM2-135M-Instruct (the main job's model, no adapter) for each turn of them, the episodes of a turn batched as
the backend batches concurrent rollouts, with the transformers backend's own sampler: once with its prefix cache
off, once on. Each turn's prompt is the chat template's rendering of the conversation so far, as the policy server
renders it. Prints, per turn, the prompt tokens, the tokens the model was fed and the seconds taken, and checks that
both samplers chose the same tokens.

    PYTHONPATH=. python bench/turn_prefill.py [--episodes 2]   # PYTHONPATH: this tree's code, not the installed one
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from environments.email.agents import demonstrator, play  # noqa: E402
from environments.email.env import EmailEnvironment  # noqa: E402
from service.backends.transformers import chat  # noqa: E402
from service.backends.transformers.generation import Generator, SamplingRequest  # noqa: E402
from service.backends.transformers.models import DEFAULT_BASE_MODEL, load_tokenizer, resolve_base_model  # noqa: E402

TURNS = 6
CACHE = Path("/tmp/prefixcache")


def conversations(count: int) -> list[list[dict]]:
    """``count`` demonstrator episodes of 6 turns at most, as OpenAI messages from the environment's opening."""
    env = EmailEnvironment(max_turns=TURNS)
    scenarios = random.Random(0).sample(list(env.scenarios("train")), count)
    return [
        play(s, demonstrator, max_turns=TURNS, seed=i, opening=env.opening(s)).messages for i, s in enumerate(scenarios)
    ]


def turn_prompts(tokenizer, messages: list[dict]) -> list[tuple[int, ...]]:
    """The prompt of each assistant turn: the conversation before it, rendered with the tools."""
    tools = list(EmailEnvironment.tools)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    return [tuple(chat.render_prompt(tokenizer, messages[:i], tools)) for i in turns]


def timed(generator: Generator, model: torch.nn.Module, prompts: list[tuple[int, ...]]) -> tuple[int, float, list[int]]:
    """(tokens fed, seconds, tokens chosen) of one greedy token for each prompt: the turn's prefill."""
    fed: list[int] = []
    hook = model.register_forward_hook(lambda _, a, kw, o: fed.append(kw["input_ids"].numel()), with_kwargs=True)
    start = time.perf_counter()
    samples = generator.generate([SamplingRequest(prompt_ids=p, max_tokens=1, temperature=0) for p in prompts])
    seconds = time.perf_counter() - start
    hook.remove()
    return sum(fed), seconds, [s[0].token_ids[0] for s in samples]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2, help="episodes decoded together at each turn")
    args = parser.parse_args()
    model_dir = resolve_base_model(DEFAULT_BASE_MODEL, CACHE)
    tokenizer = load_tokenizer(model_dir)
    chat.add_tool_support(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    ends = chat.end_token_ids(tokenizer)
    off = Generator(model, tokenizer, end_token_ids=ends, prefix_cache_bytes=0)
    on = Generator(model, tokenizer, end_token_ids=ends)
    episodes = [turn_prompts(tokenizer, m) for m in conversations(args.episodes)]
    threads = torch.get_num_threads()
    print(f"{args.episodes} email-agent episodes, batched turn by turn, SmolLM2-135M, float32, {threads} threads")
    print(f"{'turn':>4} {'rows':>4} {'prompt tok':>10} {'fed off':>8} {'fed on':>7} {'s off':>7} {'s on':>7} same")
    totals = [0, 0, 0.0, 0.0]
    for turn in range(TURNS):
        prompts = [e[turn] for e in episodes if turn < len(e)]
        if not prompts:
            break
        fed_off, s_off, chosen_off = timed(off, model, prompts)
        fed_on, s_on, chosen_on = timed(on, model, prompts)
        totals = [totals[0] + fed_off, totals[1] + fed_on, totals[2] + s_off, totals[3] + s_on]
        print(f"{turn + 1:>4} {len(prompts):>4} {sum(map(len, prompts)):>10} {fed_off:>8} {fed_on:>7} {s_off:>7.2f} "
              f"{s_on:>7.2f} {str(chosen_off == chosen_on):>5}")  # fmt: skip
    print(f"{'all':>4} {'':>4} {'':>10} {totals[0]:>8} {totals[1]:>7} {totals[2]:>7.2f} {totals[3]:>7.2f}")
    print(f"prefix cache: {len(on.prefix_cache)} entries, {on.prefix_cache.nbytes / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
