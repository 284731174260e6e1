"""Benchmark: the machine's limit and the main job's distance from it, in the same run (issue 31, item 1).

First the machine: CPU model and ISA flags (AMX, AVX512-BF16, AVX512F, AVX2), torch GEMM throughput at the model's
shapes (2048x576 @ 576x1536) in float32 and bfloat16 on 2 threads, and memory bandwidth (read: a large tensor's sum;
copy: read+write). Then a short real job (``artsvc train --env math --max-steps 3``, the default model and backend),
run in a child process that counts the model's work as it happens: every packed training row (its length: the
forward, reference, recompute and backward passes run over all its positions), every sampling forward (batch rows,
new positions, cache length). The step rows and validation points of the job's store give the recorded phase times.

FLOPs counted (``Shapes``): 2 x params per position through the decoder's linear layers (LoRA adapters where they
are on), 2 x vocab x hidden per position whose logits are made (the head), and 4 x layers x hidden per (query, key)
pair of attention (QK^T and AV). A training row of n positions runs: the policy's forward, the reference's forward
(adapter off, no grad), the recomputed forward of gradient checkpointing (the layers' products only: neither the
head nor the attention, whose outputs are kept, attention.checkpoint_context), and the
backward: activation gradients through the frozen base (2 x params per position, attention 2x its forward) plus the
LoRA weights' gradients; no weight gradient of the base. The head runs only where ART's loss reads (the replies).
The packed row's attention mask is dense, so all n^2 pairs count. Sampling: the prefill's positions against their
keys, and each decode step's batch rows (the rows still decoding) against the cache. Memory traffic: the weights
once per model call (float32) plus the K and V cache each decode step reads. Roofline time: FLOPs at the float32 GEMM
rate (``ARTSVC_PRECISION``'s choice on CPUs without AMX or AVX512-BF16) plus bytes at the read bandwidth (the
issue's sum; ``roofline_max_s`` takes the larger of the two per model call instead); the
bf16 figure is the same FLOPs at the bf16 GEMM rate, the bytes halved. Not counted: the optimizer (LoRA's 5M
parameters), embeddings, norms, softmax and other elementwise work; the training passes' memory traffic.

    python bench/roofline.py [--max-steps 3] [--val-examples 32] [--label NAME] [extra artsvc train flags]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from service.process_env import PROCESS_DEFAULTS

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
ENV = dict(PROCESS_DEFAULTS)  # no network, no tqdm bars: as `artsvc` runs, in this process and the job's
FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2")


# ---------------------------------------------------------------- the arithmetic (pure; tests/bench checks it)


@dataclass(frozen=True)
class Shapes:
    layers: int
    hidden: int  # query heads x head dim
    kv_dim: int  # key/value heads x head dim
    body_params: int  # the decoder layers' linear weights
    head_params: int  # vocab x hidden
    lora_params: int
    bytes_per_param: int = 4  # float32 on CPU today

    @property
    def weight_bytes(self) -> int:
        return (self.body_params + self.head_params + self.lora_params) * self.bytes_per_param


def forward_flops(s: Shapes, positions: int, pairs: int, *, logits: int, lora: bool = True) -> float:
    """One forward over ``positions`` new positions, ``pairs`` (query, key) pairs of attention, ``logits`` head rows."""
    return 2.0 * (s.body_params + (s.lora_params if lora else 0)) * positions + 2.0 * s.head_params * logits + 4.0 * s.layers * s.hidden * pairs


def train_row_flops(
    s: Shapes, n: int, *, logits: int | None = None, reference: bool = True, checkpointing: bool = True
) -> dict[str, float]:
    """A packed GRPO row of ``n`` positions (dense mask: n^2 pairs), pass by pass, the head at ``logits`` of them (the
    positions the loss reads; all of them when not given)."""
    pairs, logits = n * n, n if logits is None else logits
    out = {"policy_forward": forward_flops(s, n, pairs, logits=logits)}
    out["reference_forward"] = forward_flops(s, n, pairs, logits=logits, lora=False) if reference else 0.0
    out["recompute"] = 2.0 * (s.body_params + s.lora_params) * n if checkpointing else 0.0
    out["backward"] = (
        2.0 * (s.body_params + s.lora_params) * n  # activation gradients through the (frozen) base and the adapters
        + 2.0 * s.lora_params * n  # the adapters' weight gradients
        + 2.0 * s.head_params * logits  # the head's activation gradient
        + 8.0 * s.layers * s.hidden * pairs  # attention's backward: twice its forward
    )
    return out


def sampling_call(s: Shapes, rows: int, new: int, cached: int, *, logits: int) -> tuple[float, float]:
    """(FLOPs, bytes) of one sampling forward: ``rows`` x ``new`` positions after ``cached`` cache positions; the
    weights are read once, and every row's K and V cache once per layer."""
    flops = forward_flops(s, rows * new, rows * new * (cached + new), logits=logits)
    kv = 2.0 * s.layers * s.kv_dim * s.bytes_per_param * rows * cached
    return flops, s.weight_bytes + kv


def roofline(flops: float, nbytes: float, gflops: float, gbs: float) -> float:
    return flops / (gflops * 1e9) + nbytes / (gbs * 1e9)


# ---------------------------------------------------------------- the machine


def cpu() -> dict[str, Any]:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), platform.processor())
    flags = set(next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []))
    return {"model": model, "cores": os.cpu_count(), "flags": {f: f in flags for f in FLAGS}}


def _median_seconds(fn, reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure_machine(threads: int = 2) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    m, k, n = 2048, 576, 1536
    gemm = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        seconds = _median_seconds(lambda: torch.mm(a, b), reps=15)
        gemm[name] = round(2 * m * k * n / seconds / 1e9, 1)
    x = torch.randn(64 * 1024 * 1024)  # 256 MiB, past any cache
    y = torch.empty_like(x)
    read = x.numel() * 4 / _median_seconds(lambda: x.sum(), reps=9) / 1e9
    copy = 2 * x.numel() * 4 / _median_seconds(lambda: y.copy_(x), reps=9) / 1e9
    return {**cpu(), "threads": threads, "torch": torch.__version__, "gemm_shape": f"{m}x{k} @ {k}x{n}",
            "gemm_gflops": gemm, "read_gbs": round(read, 1), "copy_gbs": round(copy, 1)}  # fmt: skip


# ---------------------------------------------------------------- the child: the job, its work counted


def _kept(logits_to_keep: Any, new: int) -> int:
    """Positions a model call makes logits for: transformers' ``logits_to_keep``, a count or the positions' indices."""
    if logits_to_keep is None or isinstance(logits_to_keep, int):
        return logits_to_keep or new
    return logits_to_keep.numel()


class _Counter:
    def __init__(self) -> None:
        self.phase = "setup"
        self.lock = threading.Lock()
        self.shapes: dict[str, Any] | None = None
        self.rows: list[dict[str, Any]] = []  # training passes
        self.calls: list[dict[str, Any]] = []  # sampling forwards
        self.timers: list[dict[str, Any]] = []  # phase, name, seconds

    def time(self, name: str, seconds: float) -> None:
        with self.lock:
            self.timers.append({"phase": self.phase, "name": name, "s": seconds})


def _shapes_of(model: Any) -> dict[str, Any]:
    import torch

    body = head = lora = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            if "lora_" in name:
                lora += module.weight.numel()
            elif name.endswith("lm_head"):
                head += module.weight.numel()
            else:
                body += module.weight.numel()
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return {"layers": config.num_hidden_layers, "hidden": config.num_attention_heads * head_dim,
            "kv_dim": config.num_key_value_heads * head_dim, "body_params": body, "head_params": head,
            "lora_params": lora, "bytes_per_param": next(model.parameters()).element_size(),
            "total_params": sum(p.numel() for p in model.parameters()), "vocab": config.vocab_size,
            "tied_embeddings": bool(getattr(config, "tie_word_embeddings", False))}  # fmt: skip


def child(out: Path, argv: list[str]) -> None:
    import torch

    from service.backends.transformers import engine as engine_mod
    from service.backends.transformers import generation, training
    from service.training import loop

    c = _Counter()

    class Counting:  # the sampler's model, each call's shape recorded
        def __init__(self, model: Any) -> None:
            self._model = model

        def __getattr__(self, name: str) -> Any:
            return getattr(self._model, name)

        def __call__(self, *args: Any, **kw: Any) -> Any:
            ids = kw.get("input_ids", args[0] if args else None)
            cache = kw.get("past_key_values")
            cached = cache.get_seq_length() if cache is not None else 0
            started = time.perf_counter()
            result = self._model(*args, **kw)
            rows, new = ids.shape
            with c.lock:
                c.calls.append({"phase": c.phase, "rows": rows, "new": new, "cached": cached,
                                "logits": rows * _kept(kw.get("logits_to_keep"), new),
                                "s": time.perf_counter() - started})  # fmt: skip
            return result

    init = generation.Generator.__init__

    def counted_init(self: Any, model: Any, *args: Any, **kw: Any) -> None:
        if c.shapes is None:
            c.shapes = _shapes_of(model)
        init(self, Counting(model), *args, **kw)

    generation.Generator.__init__ = counted_init

    def timed(owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args: Any, **kw: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kw)
            finally:
                c.time(label, time.perf_counter() - started)

        setattr(owner, name, wrapper)

    passes, hidden = training.policy_and_reference, training._hidden

    def counted_passes(model: Any, inputs: Any, mask: Any, at: Any, *args: Any, **kw: Any) -> Any:
        tokens = inputs["tokens"]  # an RL micro-batch: the policy's pass and the reference's, the head at ``at``
        with c.lock:
            c.rows.append({"phase": c.phase, "kind": "policy_forward", "rows": tokens.shape[0], "n": tokens.shape[1],
                           "logits": int(at.sum())})  # fmt: skip
        return passes(model, inputs, mask, at, *args, **kw)

    def timed_hidden(*args: Any, **kw: Any) -> Any:
        if torch.is_grad_enabled():
            return hidden(*args, **kw)
        started = time.perf_counter()  # the reference's body; its head runs beside the policy's
        try:
            return hidden(*args, **kw)
        finally:
            c.time("reference_forward", time.perf_counter() - started)

    training.policy_and_reference, training._hidden = counted_passes, timed_hidden
    timed(generation.Generator, "generate", "sampling")
    timed(training, "grpo_step", "grpo_step")
    timed(training, "_step", "optimizer")
    timed(engine_mod.PolicyEngine, "grpo_step", "backend_train")
    timed(engine_mod.PolicyEngine, "save_checkpoint", "checkpoint_save")

    def phased(name: str, label: str) -> None:
        original = getattr(loop, name)

        async def wrapper(run: Any, step: int, *args: Any, **kw: Any) -> Any:
            c.phase = f"{label} {step}"
            started = time.perf_counter()
            try:
                return await original(run, step, *args, **kw)
            finally:
                c.time(label, time.perf_counter() - started)
                c.phase = "other"

        setattr(loop, name, wrapper)

    phased("train_step", "step")
    phased("record_point", "validation")
    from service.cli import main

    sys.argv = ["artsvc", "train", *argv]
    try:
        main()
    finally:
        out.write_text(json.dumps({"shapes": c.shapes, "rows": c.rows, "calls": c.calls, "timers": c.timers}))


# ---------------------------------------------------------------- the parent: machine, job, analysis


def run_job(argv: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="artsvc-roofline-") as data_dir:
        counts = Path(data_dir) / "counts.json"
        env = {k: v for k, v in os.environ.items() if k != "ARTSVC_DATABASE_URL"} | ENV | {"ARTSVC_DATA_DIR": data_dir}
        command = [sys.executable, __file__, "--child", str(counts), "--", "--env", "math", "--json", *argv]
        started = time.monotonic()
        done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        wall = time.monotonic() - started
        if done.returncode != 0:
            sys.exit(f"the job failed ({done.returncode}); its error is above")
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        with sqlite3.connect(Path(data_dir) / "artsvc.db") as db:
            db.row_factory = sqlite3.Row
            steps = [{"step": r["step"], "wall_time_s": r["wall_time_s"], "metrics": json.loads(r["metrics"])}
                     for r in db.execute("select * from training_steps where job_id = ? order by step", (summary["id"],))]  # fmt: skip
            points = [dict(r) for r in db.execute("select * from validation_points where job_id = ? order by step", (summary["id"],))]
        return {"command": "artsvc train --env math --json " + " ".join(argv), "process_wall_s": wall, "summary": summary,
                "steps": steps, "validation": points, "counts": json.loads(counts.read_text())}  # fmt: skip


def analyse(machine: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    counts = job["counts"]
    s = Shapes(**{k: counts["shapes"][k] for k in ("layers", "hidden", "kv_dim", "body_params", "head_params", "lora_params", "bytes_per_param")})
    f32, bf16, bw = machine["gemm_gflops"]["float32"], machine["gemm_gflops"]["bfloat16"], machine["read_gbs"]
    phases: dict[str, dict[str, float]] = {}

    def add(phase: str, key: str, value: float) -> None:
        phases.setdefault(phase, {}).setdefault(key, 0.0)
        phases[phase][key] += value

    for row in counts["rows"]:
        if row["kind"] != "policy_forward":  # one policy forward per packed row: the row's passes counted from it
            continue
        flops = train_row_flops(s, row["n"], logits=row.get("logits", row["n"] * row["rows"]) // row["rows"])
        for _ in range(row["rows"]):
            add(row["phase"], "train_flops", sum(flops.values()))
            add(row["phase"], "packed_positions", row["n"])
            add(row["phase"], "packed_rows", 1)
        add(row["phase"], "roofline_s", row["rows"] * sum(flops.values()) / (f32 * 1e9))
        add(row["phase"], "roofline_bf16_s", row["rows"] * sum(flops.values()) / (bf16 * 1e9))
        add(row["phase"], "roofline_max_s", row["rows"] * sum(flops.values()) / (f32 * 1e9))
    for call in counts["calls"]:
        flops, nbytes = sampling_call(s, call["rows"], call["new"], call["cached"], logits=call["logits"])
        decode = call["new"] == 1
        add(call["phase"], "decode_steps" if decode else "prefill_calls", 1)
        add(call["phase"], "decoded_positions" if decode else "prefill_positions", call["rows"] * call["new"])
        add(call["phase"], "sampling_flops", flops)
        add(call["phase"], "sampling_bytes", nbytes)
        add(call["phase"], "roofline_s", roofline(flops, nbytes, f32, bw))
        add(call["phase"], "roofline_bf16_s", roofline(flops, nbytes / 2, bf16, bw))
        add(call["phase"], "roofline_max_s", max(flops / (f32 * 1e9), nbytes / (bw * 1e9)))
    for timer in counts["timers"]:
        add(timer["phase"], f"measured_{timer['name']}_s", timer["s"])
    for step in job["steps"]:  # what the store recorded
        m = step["metrics"]
        for key in ("rollout_s", "judge_s", "train_s", "tokens_generated", "trained_tokens", "packed_rows"):
            if key in m:
                phases.setdefault(f"step {step['step']}", {})[f"stored_{key}"] = m[key]
    for point in job["validation"]:
        for key in ("wall_time_s", "tokens_generated"):
            if point.get(key) is not None:
                phases.setdefault(f"validation {point['step']}", {})[f"stored_{key}"] = point[key]
    for name, p in phases.items():
        if name.startswith("step "):
            grpo = p.get("measured_grpo_step_s", 0.0)
            p["breakdown_s"] = {
                "sampling": p.get("measured_sampling_s", 0.0),
                "rollouts_other (env, scoring, batching waits)": p.get("stored_rollout_s", 0.0) + p.get("stored_judge_s", 0.0) - p.get("measured_sampling_s", 0.0),
                "reference_logprobs": p.get("measured_reference_forward_s", 0.0),
                "forward+backward": grpo - p.get("measured_reference_forward_s", 0.0) - p.get("measured_optimizer_s", 0.0),
                "optimizer": p.get("measured_optimizer_s", 0.0),
                "tokenize+pack": p.get("measured_backend_train_s", 0.0) - grpo - p.get("measured_checkpoint_save_s", 0.0),
                "checkpoint_save": p.get("measured_checkpoint_save_s", 0.0),
                "store+log (step wall less rollouts and train_s)": p.get("measured_step_s", 0.0) - p.get("stored_rollout_s", 0.0) - p.get("stored_judge_s", 0.0) - p.get("stored_train_s", 0.0),
            }  # fmt: skip
        wall = p.get("measured_step_s") or p.get("measured_validation_s")
        if wall:
            p["wall_s"] = wall
            p["x_roofline"] = wall / p["roofline_s"] if p.get("roofline_s") else None
    total_roof = sum(p.get("roofline_s", 0.0) for p in phases.values())
    job_wall = job["summary"].get("wall_time_s") or job["process_wall_s"]
    totals = {
        "job_wall_s": job_wall,  # run_job's wall time (the CLI's summary): model load, validations, steps
        "process_wall_s": round(job["process_wall_s"], 1),  # plus python, torch import and the GGUF conversion
        "steps_wall_s": sum(p.get("measured_step_s", 0.0) for p in phases.values()),
        "validation_wall_s": sum(p.get("measured_validation_s", 0.0) for p in phases.values()),
        "train_flops": sum(p.get("train_flops", 0.0) for p in phases.values()),
        "sampling_flops": sum(p.get("sampling_flops", 0.0) for p in phases.values()),
        "sampling_bytes": sum(p.get("sampling_bytes", 0.0) for p in phases.values()),
        "roofline_s": total_roof,
        "roofline_max_s": sum(p.get("roofline_max_s", 0.0) for p in phases.values()),
        "roofline_bf16_s": sum(p.get("roofline_bf16_s", 0.0) for p in phases.values()),
    }
    totals["job_remainder_s"] = job_wall - totals["steps_wall_s"] - totals["validation_wall_s"]  # load, baseline, finish
    totals["steps_and_validation_x_roofline"] = (totals["steps_wall_s"] + totals["validation_wall_s"]) / total_roof
    totals["job_x_roofline"] = job_wall / total_roof
    totals["job_x_roofline_bf16"] = job_wall / totals["roofline_bf16_s"]
    return {"shapes": counts["shapes"], "phases": phases, "totals": totals}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]), sys.argv[4:])
        return
    if len(sys.argv) > 2 and sys.argv[1] == "--report":  # a results file's table again, nothing run
        result = json.loads(Path(sys.argv[2]).read_text())
        job = {"counts": result["counts"], "steps": result["stored_steps"], "validation": result["stored_validation"],
               "summary": result["summary"], "process_wall_s": result["totals"]["process_wall_s"]}
        result |= analyse(result["machine"], job)
        if len(sys.argv) > 3 and sys.argv[3] == "--write":  # the analysis redone on the stored counts
            Path(sys.argv[2]).write_text(json.dumps(result, indent=2) + "\n")
        report(result)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--val-examples", type=int, default=32)
    parser.add_argument("--label", default="")
    args, extra = parser.parse_known_args()
    os.environ.update(ENV)
    machine = measure_machine()
    print(json.dumps(machine), flush=True)
    job = run_job(["--max-steps", str(args.max_steps), "--val-examples", str(args.val_examples), *extra])
    result = {"date": date.today().isoformat(), "machine": machine, "command": job["command"], "summary": job["summary"],
              **analyse(machine, job), "stored_steps": job["steps"], "stored_validation": job["validation"],
              "counts": job["counts"]}  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    label = args.label or ("amx" if machine["flags"]["amx_bf16"] else "avx512" if machine["flags"]["avx512f"] else "avx2")
    path = RESULTS / f"roofline_{label}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    report(result)
    print(f"\nwritten: {path.relative_to(ROOT)}")


def report(r: dict[str, Any]) -> None:
    m, t = r["machine"], r["totals"]
    isa = ", ".join(f for f, on in m["flags"].items() if on) or "none of " + ", ".join(FLAGS)
    print(f"\n{m['model']}, {m['cores']} cores ({isa}); torch {m['torch']}, {m['threads']} threads")
    print(f"GEMM {m['gemm_shape']}: float32 {m['gemm_gflops']['float32']} GFLOP/s, bf16 {m['gemm_gflops']['bfloat16']} GFLOP/s; "
          f"read {m['read_gbs']} GB/s, copy {m['copy_gbs']} GB/s\n")  # fmt: skip
    print("| phase | wall s | roofline s (f32) | x roofline | train TFLOP | sampled TFLOP | sampled GB | packed pos | decoded pos |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, p in r["phases"].items():
        if p.get("wall_s", 0.0) < 0.5 and not p.get("roofline_s"):  # a validation not due, the set-up's save
            continue
        print(f"| {name} | {p['wall_s']:.1f} | {p.get('roofline_s', 0):.2f} | {p.get('x_roofline') or 0:.1f} | "
              f"{p.get('train_flops', 0) / 1e12:.2f} | {p.get('sampling_flops', 0) / 1e12:.2f} | {p.get('sampling_bytes', 0) / 1e9:.1f} | "
              f"{p.get('packed_positions', 0):.0f} | {p.get('decoded_positions', 0):.0f} |")  # fmt: skip
    columns = next(p["breakdown_s"] for p in r["phases"].values() if "breakdown_s" in p)
    print("\n| step s | " + " | ".join(columns) + " |\n|" + " --- |" * (len(columns) + 1))
    for name, p in r["phases"].items():
        if "breakdown_s" in p:
            print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in p["breakdown_s"].values()) + " |")
    print(f"\njob wall {t['job_wall_s']:.1f} s (process {t['process_wall_s']:.1f} s; steps {t['steps_wall_s']:.1f} s, validations "
          f"{t['validation_wall_s']:.1f} s, the rest {t['job_remainder_s']:.1f} s); steps and validations "
          f"{t['steps_and_validation_x_roofline']:.1f}x their roofline; roofline {t['roofline_s']:.1f} s at float32 (max-form {t['roofline_max_s']:.1f} s), "
          f"{t['roofline_bf16_s']:.1f} s at bf16; the job is {t['job_x_roofline']:.1f}x its float32 roofline, "
          f"{t['job_x_roofline_bf16']:.1f}x the bf16 one")  # fmt: skip


if __name__ == "__main__":
    main()
