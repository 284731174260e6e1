"""The 2048 reward ("twenty48-reward"), after the reward of ART's own 2048 example.

A finished game earns its progress toward the target on a log scale, so that every doubling
of the biggest tile is worth the same and a policy far from the target still gets a gradient:

    progress = 0.8 * clip((log2(max_tile) - 1) / (log2(target_tile) - 1))
             + 0.2 * clip((log2(board_sum) - 1) / (log2(16 * target_tile) - 1))

``clip`` is to [0, 1] (0 for values below 2), so progress is in [0, 1]. A win is worth
``WIN_REWARD`` (2.0), more than any loss. A game lost on the board or on the turn limit is
worth its progress; a game ended by a reply that is not a move (``invalid_move``) or by a move
that changes nothing (``no_change``) is worth ``progress - 1``, always less than the same game
ended validly. Change ``SCORER_VERSION`` whenever any reward could change.

Version 2 ends a game on a move that changes nothing. Version 1 let such a move waste the turn
for 0.02 of reward: RL on SmolLM2 then kept pressing ``left`` on rows already left until the
turn limit (a cost spread over a whole game's replies teaches little), while it removed replies
that end the game within six steps. Ending the game puts the blame on the reply that earned it.
"""

from __future__ import annotations

import math

SCORER_NAME = "twenty48-reward"
SCORER_VERSION = "2.0.0"

WIN, LOSS, INVALID_MOVE, NO_CHANGE, TURN_LIMIT = "win", "loss", "invalid_move", "no_change", "turn_limit"
OUTCOMES = (WIN, LOSS, INVALID_MOVE, NO_CHANGE, TURN_LIMIT)
ENDED_BY_THE_POLICY = (INVALID_MOVE, NO_CHANGE)  # outcomes that cost the penalty
WIN_REWARD = 2.0
INVALID_MOVE_PENALTY = 1.0
MAX_TILE_WEIGHT = 0.8  # the rest of the progress is the board sum's


def _log_progress(value: int, full: int) -> float:
    """How far ``value`` is from 2 to ``full`` in doublings, clipped to [0, 1]."""
    if value <= 2:
        return 0.0
    return min(1.0, (math.log2(value) - 1) / (math.log2(full) - 1))


def progress(*, max_tile: int, board_sum: int, target_tile: int) -> float:
    """Progress of a board toward ``target_tile`` (at least 4), in [0, 1]."""
    if target_tile < 4:
        raise ValueError(f"target_tile must be at least 4, got {target_tile}")
    return MAX_TILE_WEIGHT * _log_progress(max_tile, target_tile) + (1 - MAX_TILE_WEIGHT) * _log_progress(
        board_sum, 16 * target_tile
    )


def reward(*, outcome: str, max_tile: int, board_sum: int, target_tile: int) -> float:
    """The reward of a game that ended with ``outcome`` on a board with this max tile and sum."""
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}; expected one of {', '.join(OUTCOMES)}")
    if outcome == WIN:
        return WIN_REWARD
    earned = progress(max_tile=max_tile, board_sum=board_sum, target_tile=target_tile)
    return earned - INVALID_MOVE_PENALTY if outcome in ENDED_BY_THE_POLICY else earned
