"""A good, deliberately imperfect 2048 player: the teacher of the warm-start demonstrations.

It plays the corner strategy (keep the big tiles in the bottom-left corner): down or left,
whichever leaves more empty cells (down on a tie), then right, then up. With small seeded
probabilities it slips, so the demonstrations are not perfect and RL has room to improve on them:
a random valid move (``noise``), or a move that changes nothing (``waste``), after which the
same board comes back and the player moves on from it, which is what a policy must learn to do
after its own wasted move. On the val seeds it wins 91% of games to 128 in 256 turns, 100% to 64
in 128, and 67.5% to 16 in the default 12 turns (75% without the wasted slips; see the tests).
"""

from __future__ import annotations

import random

from environments.twenty48.engine import (
    DIRECTIONS,
    Board,
    Game,
    empty_cells,
    is_game_over,
    max_tile,
    slide,
    valid_moves,
)

CORNER_MOVES = ("down", "left")
FALLBACK_MOVES = ("right", "up")
DEFAULT_NOISE = 0.05
DEFAULT_WASTE = 0.25


def choose_move(
    board: Board, rng: random.Random, *, noise: float = DEFAULT_NOISE, waste: float = DEFAULT_WASTE
) -> str:
    """The player's move on ``board`` (which must not be over); ``rng`` draws the random slips."""
    valid = valid_moves(board)
    if not valid:
        raise ValueError("no move changes this board: the game is over")
    slip = rng.random()
    if slip < noise:
        return rng.choice(valid)
    wasted = [d for d in DIRECTIONS if d not in valid]
    if wasted and slip < noise + waste:
        return rng.choice(wasted)
    corner = [d for d in CORNER_MOVES if d in valid]
    if corner:
        return max(corner, key=lambda d: len(empty_cells(slide(board, d)[0])))  # max keeps the first on ties
    return next(d for d in FALLBACK_MOVES if d in valid)


def play(
    game: Game,
    rng: random.Random,
    *,
    target_tile: int,
    max_turns: int,
    noise: float = DEFAULT_NOISE,
    waste: float = DEFAULT_WASTE,
) -> list[tuple[Board, str]]:
    """Play ``game`` until ``target_tile`` is reached, the game is over or ``max_turns`` moves.

    Returns every turn as (the board the move was chosen on, the move).
    """
    turns: list[tuple[Board, str]] = []
    while max_tile(game.board) < target_tile and not is_game_over(game.board) and len(turns) < max_turns:
        board = game.board
        # never two wasted moves in a row: after one, the demonstration shows the way on
        wasted_last = bool(turns) and turns[-1][0] == board
        direction = choose_move(board, rng, noise=noise, waste=0.0 if wasted_last else waste)
        game.move(direction)
        turns.append((board, direction))
    return turns
