"""Check and benchmark: the transformers backend's GRPO step on a CUDA GPU, in float32 and in bf16 (issue 31: "the
CUDA path stays bf16"), through the code the service runs: ``PolicyEngine`` (its precision, LoRA, optimizer and
checkpoints), the sampler, the policy server's own reply bodies (``openai_server.completion`` with ``TemplateChat``:
tokens named ``token_id:N``) read back as openai ``Choice`` objects, and ART's tokenisation, packing and loss.

A GPU machine here has no model weights and no network, so the model is randomly initialised in SmolLM2-135M's shape,
with its real tokenizer. A random model solves no math problem, so the reward is a deterministic one that gives every
group variance: the share of a reply's tokens whose id lies in the vocabulary's lower half (about 0.5 for a random
model). The prompts are the math environment's validation problems, 8 a step, 8 samples each, 24 new tokens,
temperature 1, each group seeded by its step, so both precisions draw from the same uniforms. Per step it reports
the rollouts' seconds, the training step's, the mean reward, and what the step measured (``probs_corr``: the
sampler's logprobs against the trainer's, loss, KL to the reference, grad norm); then peak GPU memory.

What it shows is that the step runs and measures on the device, and how close bf16 stays to float32. It does not
show learning: a random model's next-token distribution is nearly uniform (entropy 10.687 nats of at most 10.80),
and in 20 steps at a learning rate of 3e-3 the policy moved (KL 0.2) but the mean reward did not rise
(bench/results/cuda_train_step_h200_*.json). The sampler draws by inverse CDF: a small shift of a near-uniform
distribution moves each draw to a neighbouring token id, nearly always on the same side of the vocabulary's half, so
this reward moves only once the lower half's whole mass does.

    python bench/cuda_train_step.py CONFIG_DIR [--steps 10] [--dtypes float32,bfloat16] [--out F]

CONFIG_DIR holds SmolLM2's ``config.json``, ``chat_template.jinja`` and tokenizer files (those of the converted base
model in ``.artsvc/cache/base-models/``, without the weights). ART's package imports polars at its top (for reading
its own history files); where polars is not installed (the GPU machine), an empty module stands in: nothing this
step runs calls it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm
if importlib.util.find_spec("polars") is None:
    sys.modules["polars"] = types.ModuleType("polars")

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import art  # noqa: E402
from art import dev  # noqa: E402
from openai.types.chat import ChatCompletion  # noqa: E402

from environments.math.env import MathEnvironment  # noqa: E402
from service.backends.openai_server import ChatCompletionRequest, completion, sampling_request  # noqa: E402
from service.backends.transformers.engine import PolicyEngine  # noqa: E402
from service.backends.transformers.template_chat import TemplateChat  # noqa: E402

GROUPS, GROUP_SIZE, NEW_TOKENS = 8, 8, 24


def lower_half_share(token_ids: list[int], vocab_size: int) -> float:
    """The reward: the share of the reply's tokens whose id is below half the vocabulary (0 for an empty reply)."""
    return sum(t < vocab_size // 2 for t in token_ids) / len(token_ids) if token_ids else 0.0


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def rollouts(engine: PolicyEngine, openings: list[list[dict]], step: int) -> tuple[list[art.TrajectoryGroup], float]:
    """One step's groups, sampled as the policy server samples them, their replies as the server's bodies."""
    fmt = TemplateChat(lambda _model: engine.tokenizer)
    requests = [ChatCompletionRequest(model="policy", messages=messages, n=GROUP_SIZE, temperature=1.0,
                                      max_tokens=NEW_TOKENS, logprobs=True, seed=step * 1000 + i)
                for i, messages in enumerate(openings)]  # fmt: skip
    sampling = [sampling_request(r, fmt) for r in requests]
    results = engine.generate(sampling)
    vocab = engine.model.get_output_embeddings().weight.shape[0]
    groups, rewards = [], []
    for request, prompt, samples in zip(requests, sampling, results):
        body = completion(request, fmt, model="policy", samples=samples, prompt_tokens=len(prompt.prompt_ids))
        choices = ChatCompletion.model_validate(body).choices
        trajectories = []
        for choice, sample in zip(choices, samples):
            reward = lower_half_share(sample.token_ids, vocab)
            rewards.append(reward)
            trajectories.append(art.Trajectory(messages_and_choices=[*request.messages, choice], reward=reward))
        groups.append(art.TrajectoryGroup(trajectories))
    return groups, statistics.mean(rewards)


def run(base_dir: Path, dtype: torch.dtype, steps: int, learning_rate: float, device: torch.device) -> dict:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as tmp:
        engine = PolicyEngine(Path(tmp) / "model", base_dir, device=device, dtype=dtype, seed=0)
        env = MathEnvironment()
        rows = list(env.scenarios("val"))
        records = []
        for step in range(steps):
            openings = [env.opening(row) for row in rows[step * GROUPS : (step + 1) * GROUPS]]
            sync()
            started = time.perf_counter()
            groups, reward = rollouts(engine, openings, step)
            sync()
            sampled = time.perf_counter()
            metrics = engine.grpo_step(groups, learning_rate=learning_rate, config=dev.TrainConfig(), scale_rewards=True)
            sync()
            trained = time.perf_counter()
            record = {"step": step + 1, "reward_mean": round(reward, 4), "rollout_s": round(sampled - started, 3),
                      "train_s": round(trained - sampled, 3)}  # fmt: skip
            record |= {k: round(v, 6) for k, v in metrics.items()}
            print(json.dumps({"dtype": str(dtype), **record}), flush=True)
            records.append(record)
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    later = records[1:] or records
    return {
        "dtype": str(dtype).removeprefix("torch."), "steps": records,
        "reward_first_3": statistics.mean(r["reward_mean"] for r in records[:3]),
        "reward_last_3": statistics.mean(r["reward_mean"] for r in records[-3:]),
        "rollout_s_median": statistics.median(r["rollout_s"] for r in later),
        "train_s_median": statistics.median(r["train_s"] for r in later),
        "probs_corr_min": min(r.get("probs_corr", 1.0) for r in records),
        "peak_gpu_memory_gib": round(peak, 3) if peak is not None else None,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config_dir", type=Path)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        base_dir = Path(tmp) / "base"
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.config_dir)).save_pretrained(base_dir)
        AutoTokenizer.from_pretrained(args.config_dir).save_pretrained(base_dir)
        runs = [run(base_dir, getattr(torch, name), args.steps, args.learning_rate, device)
                for name in args.dtypes.split(",")]  # fmt: skip
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "transformers": __import__("transformers").__version__, "art": importlib.metadata.version("openpipe-art"),
        "groups": GROUPS, "group_size": GROUP_SIZE, "new_tokens": NEW_TOKENS, "learning_rate": args.learning_rate,
        "runs": runs,
    }  # fmt: skip
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))
    for r in runs:
        print(json.dumps({k: v for k, v in r.items() if k != "steps"}))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
