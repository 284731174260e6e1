"""What the policy reads and writes: a fixed-width board and a strict ``<move>`` reply.

The embedded policy reads one character per token in a 192-token context, so every character
of the board costs context on every turn. A cell is the tile's exponent as one character
(``1`` = 2, ``2`` = 4, ... ``9`` = 512, ``a`` = 1024, ``b`` = 2048, ...) and ``.`` when empty;
writing tile values instead would take up to 63 characters of ragged columns. With single
characters every board is 31 characters and a cell always sits at the same offset in the
message, which a small character model can learn to attend to.
"""

from __future__ import annotations

import re

from environments.twenty48.engine import DIRECTIONS, Board, valid_moves

EMPTY = "."
EXPONENT_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"  # index = log2(tile); 0 is unused
MAX_REPLY_CHARS = 64  # longer replies are rejected before any pattern matching

_MOVE_RE = re.compile(r"<move>(left|right|up|down)</move>")


def cell(value: int) -> str:
    """One character for a tile: ``.`` for empty, else its base-2 exponent in base 36."""
    if value == 0:
        return EMPTY
    exponent = value.bit_length() - 1
    if value < 0 or value != 1 << exponent or not 0 < exponent < len(EXPONENT_DIGITS):
        raise ValueError(f"not a 2048 tile: {value!r}")
    return EXPONENT_DIGITS[exponent]


def render(board: Board) -> str:
    """Rows of space-separated cells, one row per line, e.g. ``". . 1 .\\n. . . .\\n2 . . .\\n. . . 1"``."""
    return "\n".join(" ".join(cell(value) for value in row) for row in board)


NOTHING_MOVED = "Nothing moved."
MOVES = "Moves:"


def observation(board: Board, *, moved: bool) -> str:
    """What the player reads before a move: the board, then the moves that change it (``Moves: left, down``), after
    a note when the last move changed nothing (the same board again, no tile spawned).

    Without the list, SmolLM2-135M after its warm start pressed moves that changed nothing in a quarter to two fifths
    of its validation games until they ended stuck, and RL did not teach it otherwise: whether a move changes the
    board is a fact of the rules a 135M model did not read off 16 cells. Text games list their exits the same way;
    the choice among the listed moves (the corner strategy, the merges) is still the policy's to learn. Without the
    note a small LM read the same board, played the same move again, and spent the rest of its turns so."""
    shown = f"{render(board)}\n{MOVES} {', '.join(valid_moves(board))}"
    return shown if moved else f"{NOTHING_MOVED}\n{shown}"


def format_move(direction: str) -> str:
    """The exact reply that plays ``direction``."""
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}; expected one of {', '.join(DIRECTIONS)}")
    return f"<move>{direction}</move>"


def parse_move(reply: object) -> str | None:
    """The direction of a reply that is exactly ``<move>DIRECTION</move>`` (surrounding whitespace
    allowed), else None. Never raises: anything but such a string is simply not a move."""
    if not isinstance(reply, str) or len(reply) > MAX_REPLY_CHARS:
        return None
    match = _MOVE_RE.fullmatch(str.strip(reply))
    return match.group(1) if match else None
