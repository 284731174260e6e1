"""The 2048 reward ("twenty48-reward"), after the reward of ART's own 2048 example.

A finished game earns its progress toward the target on a log scale, so that every doubling
of the biggest tile is worth the same and a policy far from the target still gets a gradient:

    progress = 0.8 * clip((log2(max_tile) - 1) / (log2(target_tile) - 1))
             + 0.2 * clip((log2(board_sum) - 1) / (log2(16 * target_tile) - 1))

``clip`` is to [0, 1] (0 for values below 2), so progress is in [0, 1]. A win is worth
``WIN_REWARD`` (2.0), more than any loss. A game that did not win is worth its progress, however it
ended: on the board, on the turn limit, or stuck (``STUCK_AFTER`` moves in a row that changed
nothing); only a reply that is not a move (``INVALID_MOVE``) costs 1 more. Until 1.2.0 a stuck game
cost 1 too, and RL learned to play safe: a game run to the turn limit was worth about as much as a
quarter chance of winning, so the policy traded wins for never stalling (README Results, 2026-12-07).
A stuck game already ends early, below the progress the same game would have made. Each wasted move
(one that changes nothing: legal in 2048, but a turn spent) costs ``WASTED_MOVE_COST``, up to
``MAX_WASTED_COST``, so that RL prefers the same result reached without them. Change ``SCORER_VERSION``
whenever any reward could change.
"""

from __future__ import annotations

import math

SCORER_NAME = "twenty48-reward"
SCORER_VERSION = "1.2.0"

WIN, LOSS, INVALID_MOVE, STUCK, TURN_LIMIT = "win", "loss", "invalid_move", "stuck", "turn_limit"
OUTCOMES = (WIN, LOSS, INVALID_MOVE, STUCK, TURN_LIMIT)
STUCK_AFTER = 3  # moves in a row that change nothing end the game
WIN_REWARD = 2.0
INVALID_MOVE_PENALTY = 1.0
WASTED_MOVE_COST = 0.02
MAX_WASTED_COST = 0.5
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


def reward(*, outcome: str, max_tile: int, board_sum: int, target_tile: int, wasted_moves: int = 0) -> float:
    """The reward of a game that ended with ``outcome`` on a board with this max tile and sum."""
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}; expected one of {', '.join(OUTCOMES)}")
    waste = min(MAX_WASTED_COST, WASTED_MOVE_COST * max(0, wasted_moves))
    if outcome == WIN:
        return WIN_REWARD - waste
    earned = progress(max_tile=max_tile, board_sum=board_sum, target_tile=target_tile) - waste
    return earned - INVALID_MOVE_PENALTY if outcome == INVALID_MOVE else earned
