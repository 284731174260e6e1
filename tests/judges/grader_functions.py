"""Reward functions for the python grader's tests, registered by the tests as an operator registers a plugin's."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def exact(sample: dict, item: dict) -> float:
    return float(sample["output_text"].strip() == str(item["answer"]))


def with_details(sample: dict, item: dict) -> dict:
    print('{"reward": 1.0}')  # a print must not be read as the answer
    return {"reward": 0.25, "details": {"length": len(sample["output_text"])}}


def raises(sample: dict, item: dict) -> float:
    raise ValueError("no answer here")


def hangs(sample: dict, item: dict) -> float:
    time.sleep(600)
    return 1.0


def not_a_number(sample: dict, item: dict) -> float:
    return float("nan")


def a_word(sample: dict, item: dict) -> str:
    return "high"


def too_high(sample: dict, item: dict) -> float:
    return 3.0


def secrets_seen(sample: dict, item: dict) -> dict:
    """1.0 if any environment variable named in item["names"] reached this process."""
    seen = sorted(name for name in item["names"] if name in os.environ)
    return {"reward": float(bool(seen)), "details": {"seen": seen, "env": sorted(os.environ)}}


def hog(sample: dict, item: dict) -> float:
    """Holds 1 GiB, 64 MiB at a time: an error under a smaller memory limit, 1.0 without one."""
    held = [bytearray(64 * 2**20) for _ in range(16)]
    return float(len(held) == 16)


def records_its_run(sample: dict, item: dict) -> float:
    """Writes when it started and ended into item["folder"], so a test can see how many ran at once."""
    started = time.time()
    time.sleep(0.5)
    (Path(item["folder"]) / f"{os.getpid()}.json").write_text(json.dumps([started, time.time()]))
    return 1.0
