"""The 2048 environment: splits, demonstrations, the heuristic teacher, the reward and rollouts."""

import asyncio
import random

import art
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types.chat.chat_completion import ChatCompletion, Choice

from environments import Sampling, load
from environments.base import EnvironmentConfigError
from environments.twenty48 import Twenty48Environment
from environments.twenty48 import scenarios as scenario_files
from environments.twenty48.engine import DIRECTIONS, max_tile, new_game, slide, valid_moves
from environments.twenty48.player import choose_move, play
from environments.twenty48.render import (
    EMPTY,
    EXPONENT_DIGITS,
    MOVES,
    NOTHING_MOVED,
    format_move,
    observation,
    parse_move,
)
from environments.twenty48.scoring import reward

TINY = "embedded/char-gpt-0.2m"


def unrender(text: str) -> list[list[int]]:
    """The board a message shows, past the note a wasted move leaves and before the moves that change it."""
    board, moves = text.removeprefix(f"{NOTHING_MOVED}\n").rsplit("\n", 1)
    assert moves.startswith(f"{MOVES} ")
    return [[0 if c == EMPTY else 2 ** EXPONENT_DIGITS.index(c) for c in line.split(" ")] for line in board.split("\n")]


def test_committed_splits_are_what_the_generator_makes():
    env = Twenty48Environment()
    for split, rows in scenario_files.generate_splits().items():
        committed = (scenario_files.SCENARIO_DIR / f"{split}.jsonl").read_bytes()
        assert committed == scenario_files.canonical_bytes(rows), f"{split}.jsonl differs from the generator"
        assert list(env.scenarios(split)) == rows
    assert set(env.fingerprints()) == {"train", "val", "test"}


def test_splits_have_unique_ids_and_disjoint_seeds():
    env = Twenty48Environment()
    train, val, test = (env.scenarios(s) for s in ("train", "val", "test"))
    assert (len(train), len(val), len(test)) == (10000, 200, 200)
    rows = [*train, *val, *test]
    assert len({r["id"] for r in rows}) == len({r["seed"] for r in rows}) == len(rows)
    assert all(r["id"].startswith("2048-") and isinstance(r["seed"], int) for r in rows)


@pytest.mark.parametrize(("target", "turns", "floor"), [(128, 256, 0.8), (16, 12, 0.65)])
def test_the_heuristic_player_wins_most_val_games_but_not_all(target, turns, floor):
    wins = 0
    for row in Twenty48Environment().scenarios("val"):
        game = new_game(row["seed"])
        play(game, random.Random(row["seed"]), target_tile=target, max_turns=turns)
        wins += max_tile(game.board) >= target
    assert floor <= wins / 200 < 1.0  # 85% to 128 in 256 turns, 74% to 16 in 12 (the default game) when written


def test_the_player_keeps_to_the_corner_and_slips_only_to_moves_that_change_the_board():
    empty = [0, 0, 0, 0]
    cases = {
        "down": [empty, empty, [0, 2, 0, 0], empty],  # down or left, equally good: down
        "left": [empty, [2, 2, 0, 0], empty, [4, 8, 0, 0]],  # left merges, down does not
        "right": [empty, empty, empty, [2, 4, 0, 0]],  # neither corner move changes the board
        "up": [empty, empty, empty, [2, 4, 8, 16]],
    }
    for move, board in cases.items():
        assert choose_move(board, random.Random(0), noise=0.0) == move
    slips = {choose_move(cases["right"], random.Random(seed), noise=1.0) for seed in range(50)}
    assert slips == set(valid_moves(cases["right"])) == {"right", "up"}
    with pytest.raises(ValueError):
        choose_move([[2, 4, 2, 4], [4, 2, 4, 2], [2, 4, 2, 4], [4, 2, 4, 2]], random.Random(0))


def test_a_board_is_shown_with_the_moves_that_change_it_and_after_a_wasted_move_with_the_note():
    empty = [0, 0, 0, 0]
    corner = [empty, empty, empty, [2, 4, 0, 0]]
    assert observation(corner, moved=True) == ". . . .\n. . . .\n. . . .\n1 2 . .\nMoves: right, up"
    assert observation(corner, moved=False) == f"{NOTHING_MOVED}\n. . . .\n. . . .\n. . . .\n1 2 . .\nMoves: right, up"
    opening = [[2, 0, 0, 0], empty, empty, [0, 0, 0, 2]]
    assert observation(opening, moved=True).endswith("\nMoves: left, right, up, down")
    for row in Twenty48Environment().scenarios("val")[:20]:
        board = new_game(row["seed"]).board
        shown = observation(board, moved=True)
        assert unrender(shown) == board and shown.split("\n")[-1] == f"{MOVES} {', '.join(valid_moves(board))}"


def test_demonstrations_are_deterministic_whole_games_of_listed_moves_with_the_teachers_slips():
    env = Twenty48Environment(target_tile=128, max_turns=256)
    demos = list(env.demonstrations(seed=5, count=20))
    again, other = (env.demonstrations(seed=s, count=20) for s in (5, 6))
    assert [d.messages_and_choices for d in demos] == [d.messages_and_choices for d in again]
    assert [d.messages_and_choices for d in demos] != [d.messages_and_choices for d in other]
    openings = {str(new_game(row["seed"]).board) for row in env.scenarios("train")}
    wins = slips = 0
    preamble = env.preamble()
    for demo in demos:
        assert demo.messages_and_choices[: len(preamble)] == preamble  # the rollouts' opening, before the first board
        turns = demo.messages_and_choices[len(preamble) :]
        assert [m["role"] for m in turns] == ["user", "assistant"] * (len(turns) // 2)
        shown = [m["content"] for m in turns[0::2]]
        boards = [unrender(text) for text in shown]
        moves = [parse_move(m["content"]) for m in turns[1::2]]
        assert str(boards[0]) in openings
        for board, move, text, following in zip(boards, moves, shown, [*boards[1:], None]):
            assert text == observation(board, moved=True) and move in valid_moves(board)  # every move a listed one
            slips += move != choose_move(board, random.Random(0), noise=0.0)
            if following is not None:  # the next board is this one moved, plus one spawned tile
                moved = slide(board, move)[0]
                diff = [(a, b) for ra, rb in zip(moved, following) for a, b in zip(ra, rb) if a != b]
                assert len(diff) == 1 and diff[0][0] == 0 and diff[0][1] in (2, 4)
        last = slide(boards[-1], moves[-1])[0]
        wins += max_tile(last) >= 128
    assert wins >= 10 and slips > 0  # 13 of these 20 when written


def test_bad_constructor_arguments_are_rejected_with_reasons():
    for target in (4, 100, 4096, 0, -128, True, 128.0, "128"):
        with pytest.raises(ValueError, match="power of two from 8 to 2048"):
            Twenty48Environment(target_tile=target)
    for turns in (0, -1, 2.5, True, 4097, 10**9):
        with pytest.raises(ValueError, match="max_turns must be an integer from 1 to 4096"):
            Twenty48Environment(max_turns=turns)
    assert Twenty48Environment().max_turns == 12 and Twenty48Environment().target_tile == 16  # a pretrained LM's game
    assert Twenty48Environment(target_tile=8).max_turns == 6 and Twenty48Environment(target_tile=2048).max_turns == 1536
    assert Twenty48Environment(max_turns=4096).max_turns == 4096
    with pytest.raises(EnvironmentConfigError, match="max_turns must be an integer from 1 to 4096"):
        load("2048", {"max_turns": 10**6})
    with pytest.raises(EnvironmentConfigError, match="power of two"):
        load("2048", {"target_tile": 3})
    env = load("2048", {"target_tile": 64, "max_turns": 40})
    assert (env.name, env.target_tile, env.max_turns, env.tools) == ("2048", 64, 40, ())
    assert env.scorer_name == "twenty48-reward" and env.warm_start_examples > 0


targets = st.sampled_from([8, 16, 32, 64, 128, 256, 512, 1024, 2048])
tile_values = st.sampled_from([2**k for k in range(1, 12)])
losses = st.sampled_from(["loss", "turn_limit", "invalid_move", "stuck"])


@given(targets, tile_values, st.integers(0, 70000), losses)
def test_a_win_beats_every_loss_and_only_an_invalid_move_costs(target, top, extra, outcome):
    top = min(top, target // 2)  # a lost game never reached the target
    total = top + extra
    args = {"max_tile": top, "board_sum": total, "target_tile": target}
    lost = reward(outcome=outcome, **args)
    assert reward(outcome="win", **args) == 2.0 > lost
    valid_end = reward(outcome="loss", **args)
    assert reward(outcome="turn_limit", **args) == reward(outcome="stuck", **args) == valid_end
    assert 0.0 <= valid_end <= 1.0
    assert reward(outcome="invalid_move", **args) == valid_end - 1.0


@given(targets, st.integers(1, 10), st.integers(1, 10), losses)
def test_reward_grows_with_the_max_tile(target, low, high, outcome):
    low, high = sorted((2**low, 2**high))
    at = {tile: reward(outcome=outcome, max_tile=tile, board_sum=4 * high, target_tile=target) for tile in (low, high)}
    assert at[high] >= at[low]
    if high < target and low < high:
        assert at[high] > at[low]


def test_reward_rejects_unknown_outcomes():
    with pytest.raises(ValueError, match="unknown outcome"):
        reward(outcome="draw", max_tile=2, board_sum=4, target_tile=128)


class ScriptedModel:
    """Just enough of an art.Model for a rollout: a chat client whose replies come from ``reply(board)``."""

    def __init__(self, reply):
        self.reply = reply
        self.calls = []

    def get_inference_name(self):
        return "scripted"

    def openai_client(self):
        model = self

        class Completions:
            async def create(self, **request):
                model.calls.append(request)
                text = model.reply(unrender(request["messages"][-1]["content"]))
                message = {"role": "assistant", "content": text}
                return ChatCompletion.model_validate(
                    {
                        "id": "scripted", "object": "chat.completion", "created": 0, "model": "scripted",
                        "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                    }
                )  # fmt: skip

        return type("Client", (), {"chat": type("Chat", (), {"completions": Completions()})()})()


@pytest.mark.asyncio
async def test_a_rollout_of_the_heuristic_is_the_same_game_as_its_demonstration():
    env = Twenty48Environment(target_tile=128, max_turns=256)
    row = env.scenarios("val")[0]
    expected = play(new_game(row["seed"]), random.Random(1), target_tile=128, max_turns=256)
    moves = iter(direction for _, direction in expected)
    model = ScriptedModel(lambda board: format_move(next(moves)))
    trajectory = await env.rollout(model, row, Sampling(temperature=1.0, seed=10))
    preamble = env.opening(row)[:-1]  # system prompt, example boards and moves
    assert trajectory.messages_and_choices[: len(preamble)] == preamble == env.preamble()
    items = trajectory.messages_and_choices[len(preamble) :]
    assert [m["content"] for m in items[0::2]] == [observation(board, moved=True) for board, _ in expected]
    assert all(isinstance(c, Choice) for c in items[1::2]) and len(items) == 2 * len(expected)
    assert items[0] == env.opening(row)[-1]
    assert [m["role"] for m in items[0::2]] == ["user"] * len(expected)
    assert trajectory.metadata["outcome"] == "win" and env.is_correct(trajectory)
    assert trajectory.reward == pytest.approx(2.0)
    assert trajectory.metrics["won"] and trajectory.metrics["max_tile"] >= 128
    assert trajectory.metrics["wasted_moves"] == 0 and trajectory.metrics["moves"] == len(expected)
    assert not trajectory.metrics["invalid_move"]
    assert [call["seed"] for call in model.calls] == list(range(10, 10 + len(expected)))  # fresh noise per turn
    assert all(call["max_tokens"] == 24 and call["logprobs"] for call in model.calls)
    assert model.calls[-1]["messages"] == trajectory.messages()[:-1]


@pytest.mark.asyncio
async def test_rollouts_end_on_the_turn_limit_or_an_unparseable_move_and_a_move_that_changes_nothing_wastes_a_turn():
    env = Twenty48Environment(target_tile=2048, max_turns=5)
    row = env.scenarios("val")[1]
    heuristic = ScriptedModel(lambda board: format_move(choose_move(board, random.Random(0))))
    limited = await env.rollout(heuristic, row, Sampling())
    assert limited.metadata == {
        "scenario_id": row["id"], "outcome": "turn_limit", "target_tile": 2048, "scorer_version": env.scorer_version
    }  # fmt: skip
    assert limited.metrics["moves"] == 5 and 0.0 <= limited.reward <= 1.0 and not env.is_correct(limited)

    # a move that changes nothing is legal but wastes the turn: the same board comes back, with no spawn
    def wasteful(board):  # a move that changes nothing whenever there is one
        return format_move(next((d for d in DIRECTIONS if not slide(board, d)[2]), "up"))

    seen = []

    def careless(board):  # a move that changes nothing whenever there is one, but never three in a row
        seen.append(board)
        if seen[-3:] == [board] * 3:
            return format_move(next(d for d in DIRECTIONS if slide(board, d)[2]))
        return wasteful(board)

    long_game = Twenty48Environment(target_tile=128, max_turns=12)
    sloppy = await long_game.rollout(ScriptedModel(careless), row, Sampling())
    shown = [m["content"] for m in sloppy.messages_and_choices[len(env.preamble()) :: 2]]
    boards = [unrender(text) for text in shown]
    moves = [parse_move(c.message.content) for c in sloppy.messages_and_choices[len(env.preamble()) + 1 :: 2]]
    assert sloppy.metadata["outcome"] == "turn_limit" and not (sloppy.metrics["invalid_move"] or sloppy.metrics["stuck"])
    assert sloppy.metrics["turns"] == 12 and sloppy.metrics["wasted_moves"] == 12 - sloppy.metrics["moves"] > 0
    repeated = sum(a == b for a, b in zip(boards, boards[1:]))
    assert repeated == sloppy.metrics["wasted_moves"] - (not slide(boards[-1], moves[-1])[2])
    notes = [text.startswith(NOTHING_MOVED) for text in shown[1:]]
    assert notes == [a == b for a, b in zip(boards, boards[1:])]  # the note comes after a wasted move, and only then
    game = new_game(row["seed"])
    for direction in moves:
        game.move(direction)
    played = reward(outcome="turn_limit", max_tile=max_tile(game.board), board_sum=sum(map(sum, game.board)),
                    target_tile=128)  # fmt: skip
    assert sloppy.reward == pytest.approx(played - 0.02 * sloppy.metrics["wasted_moves"])

    # three wasted moves in a row end the game, stuck, worth its progress as any other lost game
    stubborn = await long_game.rollout(ScriptedModel(wasteful), row, Sampling())
    assert stubborn.metadata["outcome"] == "stuck" and stubborn.metrics["stuck"] and not env.is_correct(stubborn)
    assert stubborn.metrics["wasted_moves"] == 3 == stubborn.metrics["turns"] - stubborn.metrics["moves"]
    board = unrender(stubborn.messages_and_choices[-2]["content"])
    expected = reward(outcome="loss", max_tile=stubborn.metrics["max_tile"], board_sum=sum(map(sum, board)),
                      target_tile=128) - 0.02 * 3  # fmt: skip
    assert stubborn.reward == pytest.approx(expected)

    garbled = await Twenty48Environment().rollout(ScriptedModel(lambda b: "<move>north</move>"), row, Sampling())
    assert garbled.metadata["outcome"] == "invalid_move" and garbled.metrics["invalid_move"]
    assert -1.0 <= garbled.reward < 0.0 and garbled.metrics["turns"] == 1


@pytest.mark.asyncio
async def test_an_untrained_policy_loses_on_its_first_garbled_reply(tmp_path):
    from service.backends.embedded import EmbeddedBackend

    backend = EmbeddedBackend(path=tmp_path / "models", cache_dir=tmp_path / "cache", seed=0)
    model = art.TrainableModel(name="policy", project="tests", base_model=TINY, base_path=str(tmp_path / "art"))
    await model.register(backend)
    try:
        env = Twenty48Environment(target_tile=64, max_turns=3)
        rows = env.scenarios("val")[:3]
        trajectories = await asyncio.gather(*(env.rollout(model, row, Sampling(temperature=1.0, seed=i))
                                              for i, row in enumerate(rows)))  # fmt: skip
    finally:
        await backend.close()
    for row, trajectory in zip(rows, trajectories):
        system, *examples, user, choice = trajectory.messages_and_choices
        assert system["role"] == "system" and [m["name"] for m in examples] == ["example_user", "example_assistant"] * 2
        assert user["role"] == "user" and user["content"] == observation(new_game(row["seed"]).board, moved=True)
        assert isinstance(choice, Choice) and choice.logprobs is not None
        assert trajectory.metadata["outcome"] == "invalid_move" and trajectory.metrics["moves"] == 0
        assert trajectory.reward < 0.0


@pytest.mark.asyncio
async def test_a_greedy_validation_plays_each_game_once_and_a_sampled_one_plays_it_greedily_beside():
    from service.training.validation import validate

    env = Twenty48Environment(target_tile=16, max_turns=3)
    rows = env.scenarios("val")[:4]
    for temperature, passes in ((1.0, 2), (0.0, 1)):
        model = ScriptedModel(lambda board: format_move(choose_move(board, random.Random(0))))
        values, sampled = await validate(env, model, rows, seed=0, temperature=temperature)
        first_turns = [call for call in model.calls if len(call["messages"]) == len(env.opening(rows[0]))]
        assert sorted(call["temperature"] for call in first_turns) == sorted([temperature, 0.0][:passes] * len(rows))
        assert len(sampled) == values.examples == len(rows) and values.temperature == temperature
        assert values.accuracy == values.greedy_accuracy  # the scripted player ignores the temperature


@pytest.mark.asyncio
async def test_a_validation_without_its_greedy_pass_plays_each_game_once_at_its_temperature():
    from service.training.validation import validate

    env = Twenty48Environment(target_tile=16, max_turns=3)
    rows = env.scenarios("val")[:4]
    model = ScriptedModel(lambda board: format_move(choose_move(board, random.Random(0))))
    values, sampled = await validate(env, model, rows, seed=0, temperature=0.7, greedy=False)
    first_turns = [call for call in model.calls if len(call["messages"]) == len(env.opening(rows[0]))]
    assert [call["temperature"] for call in first_turns] == [0.7] * len(rows)
    assert len(sampled) == values.examples == len(rows) and values.greedy_accuracy is None
    assert values.accuracy == sum(env.is_correct(t) for t in sampled) / len(rows)
