"""2048 as a multi-turn game: reach a target tile one ``<move>DIRECTION</move>`` reply at a time."""

from environments.twenty48.engine import (
    DIRECTIONS,
    Board,
    Game,
    board_sum,
    is_game_over,
    max_tile,
    new_game,
    slide,
    spawn,
    valid_moves,
)
from environments.twenty48.env import Twenty48Environment
from environments.twenty48.render import format_move, parse_move, render
from environments.twenty48.scoring import OUTCOMES, SCORER_VERSION, reward

__all__ = [
    "DIRECTIONS",
    "OUTCOMES",
    "SCORER_VERSION",
    "Board",
    "Game",
    "Twenty48Environment",
    "board_sum",
    "format_move",
    "is_game_over",
    "max_tile",
    "new_game",
    "parse_move",
    "render",
    "reward",
    "slide",
    "spawn",
    "valid_moves",
]
