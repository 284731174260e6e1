"""A good, deliberately imperfect 2048 player: the teacher of the warm-start demonstrations.

It plays the corner strategy (keep the big tiles in the bottom-left corner): down or left,
whichever leaves more empty cells (down on a tie), then right, then up. With a small seeded
probability (``noise``) it slips to a random move among those that change the board, so the
demonstrations are not perfect and RL has room to improve on them; it never presses a move that
changes nothing (the board lists the moves that do). On the val seeds it wins 85% of games to 128
in 256 turns, 98.5% to 64 in 128, and 74% to 16 in the default 12 turns (see the tests); random
listed moves win 35.5% of the default game.
"""

from __future__ import annotations

import random

from environments.twenty48.engine import Board, Game, empty_cells, is_game_over, max_tile, slide, valid_moves

CORNER_MOVES = ("down", "left")
FALLBACK_MOVES = ("right", "up")
DEFAULT_NOISE = 0.15


def choose_move(board: Board, rng: random.Random, *, noise: float = DEFAULT_NOISE) -> str:
    """The player's move on ``board`` (which must not be over); ``rng`` draws the random slips."""
    valid = valid_moves(board)
    if not valid:
        raise ValueError("no move changes this board: the game is over")
    if rng.random() < noise:
        return rng.choice(valid)
    corner = [d for d in CORNER_MOVES if d in valid]
    if corner:
        return max(corner, key=lambda d: len(empty_cells(slide(board, d)[0])))  # max keeps the first on ties
    return next(d for d in FALLBACK_MOVES if d in valid)


def play(
    game: Game, rng: random.Random, *, target_tile: int, max_turns: int, noise: float = DEFAULT_NOISE
) -> list[tuple[Board, str]]:
    """Play ``game`` until ``target_tile`` is reached, the game is over or ``max_turns`` moves.

    Returns every turn as (the board the move was chosen on, the move).
    """
    turns: list[tuple[Board, str]] = []
    while max_tile(game.board) < target_tile and not is_game_over(game.board) and len(turns) < max_turns:
        board = game.board
        direction = choose_move(board, rng, noise=noise)
        game.move(direction)
        turns.append((board, direction))
    return turns
