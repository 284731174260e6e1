"""How an opening is written for a real instruct LLM: a system prompt, then few-shot turns, then the task.

The system prompt states the environment's contract (the task and the exact reply format). Few-shot
turns are ordinary user and assistant messages marked with the OpenAI few-shot names
(``"name": "example_user"`` / ``"name": "example_assistant"``), so a chat template renders them as
real conversation turns while anything that must tell them apart (the embedded character policy,
which skips them; the trainer, which never trains on them) can.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

EXAMPLE_USER = "example_user"
EXAMPLE_ASSISTANT = "example_assistant"
EXAMPLE_NAMES = (EXAMPLE_USER, EXAMPLE_ASSISTANT)


def system(text: str) -> dict[str, str]:
    """The system message that states an environment's contract."""
    return {"role": "system", "content": text}


def few_shot(examples: Iterable[tuple[str, str]]) -> list[dict[str, str]]:
    """One example_user and one example_assistant turn per (question, reply) pair, in order."""
    turns = []
    for question, reply in examples:
        turns.append({"role": "user", "name": EXAMPLE_USER, "content": question})
        turns.append({"role": "assistant", "name": EXAMPLE_ASSISTANT, "content": reply})
    return turns


def is_example(message: Mapping[str, Any]) -> bool:
    """Whether ``message`` is a few-shot example turn (its ``name`` is one of :data:`EXAMPLE_NAMES`)."""
    return message.get("name") in EXAMPLE_NAMES
