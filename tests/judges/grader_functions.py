"""Reward functions for the python grader's tests, imported by name as an installed plugin's would be."""

from __future__ import annotations

import time


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
