"""Every environment opens with a system prompt stating its contract, then its few-shot turns (marked with
the OpenAI example names), then the task; demonstrations open the same way as rollouts."""

from __future__ import annotations

import random

import pytest

from environments.email import EmailEnvironment
from environments.math import MathEnvironment
from environments.math.scenarios import LEVELS
from environments.prompts import EXAMPLE_ASSISTANT, EXAMPLE_USER, is_example
from environments.twenty48 import Twenty48Environment
from environments.twenty48.env import EXAMPLES
from environments.twenty48.player import choose_move
from environments.twenty48.engine import new_game
from environments.twenty48.render import format_move, observation, parse_move

ENVIRONMENTS = [
    *(MathEnvironment(level=level) for level in LEVELS),
    Twenty48Environment(),
    Twenty48Environment(target_tile=2048, max_turns=9),
    EmailEnvironment(max_turns=4),
]
MAX_OPENING_CHARS = 900  # about 200 tokens of a real LLM's tokenizer: a 135M model reads it on 2 CPU cores


def _id(env) -> str:
    return f"{env.name}-{getattr(env, 'level', '')}{getattr(env, 'target_tile', '')}"


def _parts(env):
    row = env.scenarios("val")[0]
    opening = env.opening(row)
    return row, opening[0], opening[1:-1], opening[-1]


@pytest.mark.parametrize("env", ENVIRONMENTS, ids=_id)
def test_an_opening_is_a_system_prompt_then_example_turns_then_the_task(env):
    row, system, examples, task = _parts(env)
    assert system["role"] == "system" and set(system) == {"role", "content"}
    assert [m["role"] for m in examples] == ["user", "assistant"] * (len(examples) // 2)
    assert [m["name"] for m in examples] == [EXAMPLE_USER, EXAMPLE_ASSISTANT] * (len(examples) // 2)
    assert all(is_example(m) for m in examples) and not is_example(task) and not is_example(system)
    assert task["role"] == "user" and "name" not in task
    assert sum(len(m["content"]) for m in env.opening(row)) <= MAX_OPENING_CHARS


@pytest.mark.parametrize("env", [e for e in ENVIRONMENTS if e.name == "math"], ids=_id)
def test_math_states_the_strict_format_and_shows_two_worked_examples(env):
    row, system, examples, task = _parts(env)
    assert "one line: Final: N" in system["content"] and "a leading - if negative" in system["content"]
    assert "no leading zeros" in system["content"] and "no other text" in system["content"]
    assert len(examples) == 4 and all(m["content"].startswith("Final: ") for m in examples[1::2])
    assert task["content"] == row["prompt"]


@pytest.mark.parametrize("env", [e for e in ENVIRONMENTS if e.name == "2048"], ids=_id)
def test_2048_states_notation_rules_goal_and_reply_and_shows_the_teachers_moves(env):
    row, system, examples, task = _parts(env)
    text = system["content"]
    assert "4x4" in text and ". is empty" in text and "1=2, 2=4" in text and "a=1024, b=2048" in text
    assert "merge" in text and "<move>DIRECTION</move>" in text and "left, right, up or down" in text
    assert f"a {env.target_tile} tile" in text and "Moves: lists the moves that change it" in text
    assert len(examples) == 2 * len(EXAMPLES) == 4
    for (board, move), (shown, reply) in zip(EXAMPLES, zip(examples[0::2], examples[1::2])):
        assert shown["content"] == observation(board, moved=True)
        assert reply["content"] == format_move(move) == format_move(choose_move(board, random.Random(0), noise=0.0))
    assert {parse_move(m["content"]) for m in examples[1::2]} == {"down", "left"}
    assert task["content"] == observation(new_game(row["seed"]).board, moved=True)


def test_email_states_the_task_its_tools_and_when_to_answer():
    env = EmailEnvironment(max_turns=4)
    row, system, examples, task = _parts(env)
    text = system["content"]
    assert examples == [] and task["content"] == row["question"]
    for tool in env.tools:
        assert tool["function"]["name"] + "(" in text
    assert "return_final_answer(answer, source_ids)" in text and "that ends the task" in text
    assert "you have 4 replies" in text


@pytest.mark.parametrize("env", ENVIRONMENTS[-3:], ids=_id)
def test_multi_turn_demonstrations_open_like_rollouts(env):
    for demo in env.demonstrations(seed=2, count=3):
        messages = demo.messages_and_choices
        opening = env.opening(next(r for r in env.scenarios("train") if _opens(env, r, messages)))
        assert messages[: len(opening)] == opening


def _opens(env, row, messages) -> bool:
    opening = env.opening(row)
    return messages[len(opening) - 1] == opening[-1]
