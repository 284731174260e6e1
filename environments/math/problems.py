"""The problems of each math level: one function per level that draws a problem from a seeded ``Random``.

A problem is ``(key, row)``. The row holds the ``prompt`` and its integer ``expected_answer``; the key
is the problem under its wording (the operands, unordered where the operation commutes, and for word
problems the operations too), so that splits can be kept disjoint by what is asked, not by how.
Every function draws in a fixed order: changing one changes its level's committed splits.
"""

from __future__ import annotations

import random
from collections.abc import Hashable

Problem = tuple[Hashable, dict]

NAMES = ("Ana", "Ben", "Kim", "Lou", "Mia", "Raj")
ITEMS = ("apples", "books", "coins", "cards", "shells", "stamps")
ADDITION_TEMPLATES = (
    "What is {a} + {b}?",
    "Compute {a} + {b}.",
    "How many {item} in all? {name} has {a}, {other} has {b}.",
)
SUBTRACTION_TEMPLATES = ("What is {a} - {b}?", "Compute {a} - {b}.", "Subtract {b} from {a}.")
MULTIPLICATION_TEMPLATES = (
    "What is {a} * {b}?",
    "Compute {a} x {b}.",
    "{name} has {a} bags of {b} {item}. How many {item} in all?",
)
# Two-step word problems: (template, the operations, which the key records).
WORD_TEMPLATES = (
    ("{name} has {a} {item}, buys {b} more and gives away {c}. How many {item} does {name} have now?", "a+b-c"),
    ("{name} has {a} {item}, gives {c} to {other} and then finds {b}. How many {item} does {name} have now?", "a+b-c"),
    ("{name} has {a} {item}. {other} has {b} more. How many {item} do they have together?", "a+(a+b)"),
    ("{name} buys {a} bags of {b} {item} and gives away {c}. How many {item} are left?", "a*b-c"),
)


def _carry_free_pair(rng: random.Random) -> tuple[int, int]:
    while True:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        if a % 10 + b % 10 < 10 and a // 10 + b // 10 < 10:
            return a, b


def carry_free(rng: random.Random) -> Problem:
    """a + b with a, b in 0..99 and no carry in any digit (the default level; keyed by the ordered pair)."""
    template = rng.choice(ADDITION_TEMPLATES)
    a, b = _carry_free_pair(rng)
    name, other = rng.sample(NAMES, 2)
    prompt = template.format(a=a, b=b, name=name, other=other, item=rng.choice(ITEMS))
    return (a, b), {"prompt": prompt, "expected_answer": a + b}


def carries(rng: random.Random) -> Problem:
    """a + b with a, b in 0..99 and at least one carry."""
    template = rng.choice(ADDITION_TEMPLATES)
    while True:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        if a % 10 + b % 10 >= 10 or a // 10 + b // 10 >= 10:
            break
    name, other = rng.sample(NAMES, 2)
    prompt = template.format(a=a, b=b, name=name, other=other, item=rng.choice(ITEMS))
    return (min(a, b), max(a, b)), {"prompt": prompt, "expected_answer": a + b}


def subtraction(rng: random.Random) -> Problem:
    """a - b with a, b in 0..99: about half the answers are negative."""
    template = rng.choice(SUBTRACTION_TEMPLATES)
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    return (a, b), {"prompt": template.format(a=a, b=b), "expected_answer": a - b}


def multiplication(rng: random.Random) -> Problem:
    """a x b: a number from 2 to 99 times one from 2 to 12, either first."""
    template = rng.choice(MULTIPLICATION_TEMPLATES)
    a, b = rng.randint(2, 99), rng.randint(2, 12)
    if rng.random() < 0.5:
        a, b = b, a
    prompt = template.format(a=a, b=b, name=rng.choice(NAMES), item=rng.choice(ITEMS))
    return (min(a, b), max(a, b)), {"prompt": prompt, "expected_answer": a * b}


def word_problems(rng: random.Random) -> Problem:
    """Two-step word problems: have, buy and give away; have and a friend's more; bags and give away."""
    template, operations = rng.choice(WORD_TEMPLATES)
    name, other = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    if operations == "a*b-c":
        a, b = rng.randint(2, 9), rng.randint(2, 12)
        c = rng.randint(1, a * b - 1)
        answer = a * b - c
    elif operations == "a+(a+b)":
        a, b, c = rng.randint(2, 40), rng.randint(1, 20), 0
        answer = a + (a + b)
    else:  # a+b-c, written as "buys b, gives away c" or "gives away c, finds b": never below zero
        a, b = rng.randint(2, 50), rng.randint(1, 30)
        c = rng.randint(1, a if "gives {c} to" in template else a + b)
        answer = a + b - c
    prompt = template.format(a=a, b=b, c=c, name=name, other=other, item=item)
    return (operations, a, b, c), {"prompt": prompt, "expected_answer": answer}
