"""Benchmark and check: swapping the next checkpoint's LoRA adapter into a loaded model (what the inference process
does for ART's client, service/backends/transformers/inference.py ``CheckpointModel.swap``: peft's
``load_peft_weights`` into ``set_peft_model_state_dict``) against loading base and adapter afresh, on any device.

A randomly initialised model of SmolLM2-135M's shape (``--config-dir``: its config.json and tokenizer files; no weights
needed), two random adapters of the shape training writes (r=16, all linear layers). Checks that the swapped model's
logits equal a fresh load of the second adapter, and that greedy decoding through the service's Generator, with the
weights' identity bumped as the swap bumps it, equals the fresh model's; times both ways.

    python bench/cuda_adapter_swap.py --config-dir DIR [--device cuda] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from service.process_env import apply_process_defaults  # noqa: E402

apply_process_defaults()  # no network, no tqdm bars: before anything imports litellm, transformers or tqdm

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from service.backends.transformers.generation import Generator, SamplingRequest  # noqa: E402


def adapter(base_dir: Path, folder: Path, seed: int) -> None:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir))
    config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(folder)


def load(base_dir: Path, folder: Path, device: str, dtype: torch.dtype):
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=dtype).to(device)
    return PeftModel.from_pretrained(base, str(folder)).eval()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config-dir", type=Path, required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    with tempfile.TemporaryDirectory() as tmp:
        base_dir = Path(tmp) / "base"
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.config_dir))
        model.save_pretrained(base_dir)
        tokenizer = AutoTokenizer.from_pretrained(args.config_dir)
        adapter(base_dir, Path(tmp) / "a", 1)
        adapter(base_dir, Path(tmp) / "b", 2)
        ids = torch.tensor([tokenizer.encode("What is 3 + 4? Reply with the number only.")], device=args.device)

        loaded, loads = None, []
        for _ in range(3):
            sync(args.device)
            started = time.perf_counter()
            loaded = load(base_dir, Path(tmp) / "a", args.device, dtype)
            sync(args.device)
            loads.append(time.perf_counter() - started)
        fresh_b = load(base_dir, Path(tmp) / "b", args.device, dtype)
        swaps = []
        for folder in ("b", "a", "b"):
            sync(args.device)
            started = time.perf_counter()
            set_peft_model_state_dict(loaded, load_peft_weights(str(Path(tmp) / folder), device=args.device))
            sync(args.device)
            swaps.append(time.perf_counter() - started)
        with torch.no_grad():
            swapped_logits, fresh_logits = loaded(input_ids=ids).logits.float(), fresh_b(input_ids=ids).logits.float()
        end = [tokenizer.eos_token_id]
        request = SamplingRequest(prompt_ids=tuple(ids[0].tolist()), n=1, max_tokens=16, temperature=0.0)
        swapped_tokens = Generator(loaded, tokenizer, end_token_ids=end).generate([request], weights=2)[0][0].token_ids
        fresh_tokens = Generator(fresh_b, tokenizer, end_token_ids=end).generate([request])[0][0].token_ids
    result = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device, "dtype": args.dtype,
        "torch": torch.__version__, "fresh_load_s_median": round(statistics.median(loads), 4),
        "swap_s_median": round(statistics.median(swaps), 4),
        "max_abs_logit_difference": float((swapped_logits - fresh_logits).abs().max()),
        "greedy_tokens_equal": swapped_tokens == fresh_tokens,
    }  # fmt: skip
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
