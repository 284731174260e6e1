"""The 2048 engine, the board rendering and the reply parser."""

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from environments.twenty48.engine import (
    DIRECTIONS,
    board_sum,
    is_game_over,
    max_tile,
    new_game,
    slide,
    spawn,
    valid_moves,
)
from environments.twenty48.render import format_move, parse_move, render


def row_left(row):
    return slide([row, [0] * 4, [0] * 4, [0] * 4], "left")[0][0]


def row_right(row):
    return slide([row, [0] * 4, [0] * 4, [0] * 4], "right")[0][0]


@pytest.mark.parametrize(
    ("row", "left", "right"),
    [
        ([2, 2, 2, 2], [4, 4, 0, 0], [0, 0, 4, 4]),
        ([4, 4, 4, 0], [8, 4, 0, 0], [0, 0, 4, 8]),
        ([2, 2, 2, 0], [4, 2, 0, 0], [0, 0, 2, 4]),
        ([2, 2, 4, 0], [4, 4, 0, 0], [0, 0, 4, 4]),  # the new 4 does not merge again in the same move
        ([4, 0, 0, 4], [8, 0, 0, 0], [0, 0, 0, 8]),
        ([2, 4, 8, 16], [2, 4, 8, 16], [2, 4, 8, 16]),
        ([0, 2, 0, 2], [4, 0, 0, 0], [0, 0, 0, 4]),
        ([8, 8, 16, 16], [16, 32, 0, 0], [0, 0, 16, 32]),
    ],
)
def test_rows_merge_once_toward_the_move(row, left, right):
    assert row_left(row) == left
    assert row_right(row) == right


def test_columns_merge_toward_up_and_down():
    board = [[2, 4, 0, 2], [2, 4, 0, 0], [2, 0, 0, 2], [2, 4, 2, 0]]
    up, up_points, _ = slide(board, "up")
    down, down_points, _ = slide(board, "down")
    assert up == [[4, 8, 2, 4], [4, 4, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert down == [[0, 0, 0, 0], [0, 0, 0, 0], [4, 4, 0, 0], [4, 8, 2, 4]]
    assert up_points == down_points == 4 + 4 + 8 + 4


def test_points_are_the_merged_tiles_and_the_input_is_untouched():
    board = [[2, 2, 2, 2], [4, 4, 4, 0], [0, 0, 0, 0], [8, 0, 8, 2]]
    copy = [list(row) for row in board]
    _, points, changed = slide(board, "left")
    assert points == (4 + 4) + 8 + 16 and changed
    assert board == copy


def test_changed_is_false_exactly_when_the_board_stays():
    packed = [[2, 4, 0, 0], [8, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert slide(packed, "left") == (packed, 0, False)
    assert slide(packed, "up") == (packed, 0, False)
    assert slide(packed, "right")[2] and slide(packed, "down")[2]
    assert valid_moves(packed) == ["right", "down"]


def test_unknown_directions_are_rejected():
    for direction in ("LEFT", "north", "", None):
        with pytest.raises(ValueError, match="unknown direction"):
            slide([[0] * 4 for _ in range(4)], direction)


def test_game_over_needs_a_full_board_without_equal_neighbours():
    stuck = [[2, 4, 2, 4], [4, 2, 4, 2], [2, 4, 2, 4], [4, 2, 4, 2]]
    assert is_game_over(stuck) and valid_moves(stuck) == []
    horizontal_pair = [row[:] for row in stuck]
    horizontal_pair[3][3] = 4
    vertical_pair = [row[:] for row in stuck]
    vertical_pair[0][0] = 4
    hole = [row[:] for row in stuck]
    hole[2][1] = 0
    for board in (horizontal_pair, vertical_pair, hole):
        assert not is_game_over(board) and valid_moves(board)


def test_spawn_draws_twos_nine_times_in_ten_on_uniform_empty_cells():
    rng = random.Random(2048)
    empty = [[0] * 4 for _ in range(4)]
    values, cells = Counter(), Counter()
    for _ in range(20000):
        board = spawn(empty, rng)
        ((r, c),) = [(r, c) for r in range(4) for c in range(4) if board[r][c]]
        values[board[r][c]] += 1
        cells[r, c] += 1
    assert set(values) == {2, 4}
    assert 0.88 < values[2] / 20000 < 0.92  # fixed seed: 6+ standard deviations of slack
    assert len(cells) == 16 and all(1100 < n < 1400 for n in cells.values())  # 1250 expected each
    assert empty == [[0] * 4 for _ in range(4)]


def test_spawn_fills_only_empty_cells_and_refuses_a_full_board():
    rng = random.Random(0)
    board = [[2] * 4 for _ in range(4)]
    board[1][2] = 0
    assert spawn(board, rng)[1][2] in (2, 4)
    with pytest.raises(ValueError):
        spawn([[2] * 4 for _ in range(4)], rng)


def test_a_seed_is_one_game():
    first, second = new_game(7), new_game(7)
    assert first.board == second.board and sum(v > 0 for row in first.board for v in row) == 2
    for direction in ("down", "left", "down", "right", "up", "left"):
        assert first.move(direction) == second.move(direction)
        assert first.board == second.board
    assert first.points == second.points and first.moves == second.moves
    assert any(new_game(seed).board != first.board for seed in range(8, 20))


def test_game_moves_that_change_nothing_are_not_played():
    game = new_game(3)
    for direction in DIRECTIONS:
        if direction not in valid_moves(game.board):
            before = [row[:] for row in game.board]
            assert not game.move(direction)
            assert game.board == before and game.moves == 0
    direction = valid_moves(game.board)[0]
    tiles = sum(v > 0 for row in game.board for v in row)
    assert game.move(direction) and game.moves == 1
    assert sum(v > 0 for row in game.board for v in row) in (tiles, tiles + 1)  # a merge, or not, then a spawn


tiles = st.sampled_from([0, 0, 0, 2, 4, 8, 16, 32, 64, 128, 1024])
boards = st.lists(st.lists(tiles, min_size=4, max_size=4), min_size=4, max_size=4)


@given(boards, st.sampled_from(DIRECTIONS))
def test_slide_conserves_the_sum_and_books_every_merge(board, direction):
    new, points, changed = slide(board, direction)
    assert board_sum(new) == board_sum(board)
    merges = sum(v > 0 for row in board for v in row) - sum(v > 0 for row in new for v in row)
    assert merges >= 0
    assert (points > 0) == (merges > 0)
    assert points % 4 == 0 and points >= 4 * merges  # each merge makes a tile of at least 4
    assert changed == (new != board)
    assert max_tile(new) >= max_tile(board)


@given(boards, st.sampled_from(DIRECTIONS))
def test_a_second_slide_changes_nothing_unless_the_first_merged(board, direction):
    once, points, _ = slide(board, direction)
    twice, _, changed_again = slide(once, direction)
    if points == 0:
        assert twice == once and not changed_again


@given(boards)
def test_a_board_with_a_tile_and_a_hole_is_never_over(board):
    values = [v for row in board for v in row]
    if 0 in values and any(values):
        assert not is_game_over(board)


def test_render_is_a_fixed_width_grid_of_exponents():
    board = [[0, 0, 2, 0], [0, 0, 0, 0], [4, 0, 0, 0], [128, 1024, 2048, 2]]
    assert render(board) == ". . 1 .\n. . . .\n2 . . .\n7 a b 1"
    assert len(render(board)) == len(render([[0] * 4] * 4)) == 31
    with pytest.raises(ValueError):
        render([[3, 0, 0, 0]] + [[0] * 4] * 3)


@pytest.mark.parametrize(
    ("reply", "move"),
    [
        ("<move>left</move>", "left"),
        ("<move>right</move>", "right"),
        ("<move>up</move>", "up"),
        ("<move>down</move>", "down"),
        ("  <move>down</move>\n", "down"),
        ("<move> down</move>", None),
        ("<move>Down</move>", None),
        ("<move>north</move>", None),
        ("<move>left</move><move>up</move>", None),
        ("move left", None),
        ("<move>left</move>.", None),
        ("<move>left", None),
        ("", None),
        ("<move>" + "left" * 100_000 + "</move>", None),
        (None, None),
        (b"<move>left</move>", None),
    ],
)
def test_parse_move_accepts_exactly_the_move_format(reply, move):
    assert parse_move(reply) == move


def test_format_and_parse_round_trip():
    for direction in DIRECTIONS:
        assert parse_move(format_move(direction)) == direction
    with pytest.raises(ValueError):
        format_move("sideways")
