"""The 2048 game in plain Python: pure moves, seeded spawns.

Boards are lists of rows of ints (0 for an empty cell). :func:`slide` never touches its input,
so players can try every direction before committing to one, and a game is reproducible from
its seed alone: all randomness is the spawn ``random.Random`` that :class:`Game` carries.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

Board = list[list[int]]
DIRECTIONS = ("left", "right", "up", "down")
SIZE = 4
FOUR_PROBABILITY = 0.1  # a spawned tile is a 4 this often, else a 2


def _slide_line(line: list[int]) -> tuple[list[int], int]:
    """``line`` moved toward its start: equal neighbours merge once, nearest the start first."""
    tiles = [value for value in line if value]
    merged: list[int] = []
    points = 0
    i = 0
    while i < len(tiles):
        if i + 1 < len(tiles) and tiles[i] == tiles[i + 1]:
            merged.append(2 * tiles[i])
            points += 2 * tiles[i]
            i += 2
        else:
            merged.append(tiles[i])
            i += 1
    return merged + [0] * (len(line) - len(merged)), points


def _transpose(board: Board) -> Board:
    return [list(column) for column in zip(*board)]


def slide(board: Board, direction: str) -> tuple[Board, int, bool]:
    """The board after moving every tile ``direction``, the points scored, and whether it changed.

    Points are the sum of the tiles made by merging, as in the original game.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}; expected one of {', '.join(DIRECTIONS)}")
    vertical = direction in ("up", "down")
    backwards = direction in ("right", "down")
    lines = _transpose(board) if vertical else [list(row) for row in board]
    moved: Board = []
    points = 0
    for line in lines:
        new_line, line_points = _slide_line(line[::-1] if backwards else line)
        moved.append(new_line[::-1] if backwards else new_line)
        points += line_points
    new_board = _transpose(moved) if vertical else moved
    return new_board, points, new_board != [list(row) for row in board]


def empty_cells(board: Board) -> list[tuple[int, int]]:
    return [(r, c) for r, row in enumerate(board) for c, value in enumerate(row) if value == 0]


def spawn(board: Board, rng: random.Random) -> Board:
    """A copy of ``board`` with a new tile (2, or 4 with probability 0.1) on a uniformly random empty cell."""
    cells = empty_cells(board)
    if not cells:
        raise ValueError("cannot spawn a tile on a full board")
    r, c = rng.choice(cells)
    new_board = [list(row) for row in board]
    new_board[r][c] = 4 if rng.random() < FOUR_PROBABILITY else 2
    return new_board


def valid_moves(board: Board) -> list[str]:
    """The directions that change ``board``, in :data:`DIRECTIONS` order."""
    return [direction for direction in DIRECTIONS if slide(board, direction)[2]]


def is_game_over(board: Board) -> bool:
    """No move changes the board (for a real game: it is full and no two neighbours are equal)."""
    return not valid_moves(board)


def max_tile(board: Board) -> int:
    return max(max(row) for row in board)


def board_sum(board: Board) -> int:
    return sum(sum(row) for row in board)


@dataclass
class Game:
    """A game in progress: the board, the spawn rng that continues it, and its tally."""

    board: Board
    rng: random.Random = field(repr=False)
    points: int = 0
    moves: int = 0

    def move(self, direction: str) -> bool:
        """Play ``direction`` and spawn a tile; False (and nothing happens) if it changes nothing."""
        board, points, changed = slide(self.board, direction)
        if changed:
            self.board = spawn(board, self.rng)
            self.points += points
            self.moves += 1
        return changed


def new_game(seed: int) -> Game:
    """The game of ``seed``: an empty board with two spawned tiles, spawns drawn from ``Random(seed)``."""
    rng = random.Random(seed)
    board = spawn(spawn([[0] * SIZE for _ in range(SIZE)], rng), rng)
    return Game(board, rng)
