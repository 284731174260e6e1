"""The 2048 environment: a whole game per rollout, one move per assistant turn."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from environments.base import BaseEnvironment, Sampling, new_trajectory
from environments.chat import complete
from environments.prompts import few_shot, system
from environments.twenty48 import scoring
from environments.twenty48.engine import Board, board_sum, is_game_over, max_tile, new_game
from environments.twenty48.player import play
from environments.twenty48.render import cell, format_move, observation, parse_move
from environments.twenty48.scenarios import SCENARIO_DIR

if TYPE_CHECKING:  # annotations only: ART is imported at the first trajectory (environments.base.new_trajectory)
    import art

MAX_TOKENS = 24  # "<move>right</move>" is 18 characters; a little room so near misses are seen, not cut
TARGET_TILES = tuple(2**k for k in range(3, 12))  # 8 .. 2048
MAX_TURNS_LIMIT = 2 * TARGET_TILES[-1]  # every turn is a model call
# A game's default turn budget, per unit of target: about what the teacher needs, so a game is a race that play can
# win more often. On the first 200 val seeds, to 16 in 12 turns: the teacher wins 74%, random valid moves 42%.
TURNS_PER_TARGET = 0.75

SYSTEM_PROMPT = (
    "You play 2048 on a 4x4 board: . is empty, else a tile's power of two (1=2, 2=4 ... a=1024, b=2048). "
    "A move slides all tiles one way; equal tiles that meet merge, then a new tile appears. "
    "Win by making a {target} tile ({target_cell}). Under each board, Moves: lists the moves that change it. "
    "Reply with only <move>DIRECTION</move>, DIRECTION being left, right, up or down; any other reply ends the game."
)
# Two example turns, each the teacher's own move on its board: two 2s merge on the way down; two 4s merge leftwards.
# With one, SmolLM2-135M-Instruct mostly copied the board back (1 greedy reply in 25 was a move); with two, all 25.
EXAMPLES: tuple[tuple[Board, str], ...] = (
    ([[0, 0, 0, 0], [0, 0, 0, 0], [2, 0, 0, 0], [2, 4, 0, 0]], "down"),
    ([[0, 0, 0, 0], [0, 2, 0, 0], [0, 0, 0, 0], [0, 0, 4, 4]], "left"),
)


class Twenty48Environment(BaseEnvironment):
    """Reach ``target_tile`` on a 4x4 board, one ``<move>DIRECTION</move>`` reply per turn.

    A game opens with a system prompt (the notation, the rules and the reply format) and two
    example turns; then each turn's user message is the board and the moves that change it (see
    :mod:`environments.twenty48.render`). The embedded character policy skips the system prompt
    and the examples (its tokenizer drops them) and learns the reply format from the warm-start
    demonstrations. The game enforces it: an unparseable reply ends the game with a penalty. A
    move that changes nothing is legal, as in the real game, but wastes the turn (no tile spawns)
    and costs a little reward. The game is won when a tile reaches
    ``target_tile`` and lost when no move is left or after ``max_turns`` replies.

    The default game, to 16 in 12 turns, is sized for a pretrained LM on two CPU cores (each turn is a model call,
    each game a training row of about 800 tokens); the embedded policy plays larger ones (README Results).
    """

    name = "2048"
    version = "2.0.0"
    scorer_name = scoring.SCORER_NAME
    scorer_version = scoring.SCORER_VERSION
    scenario_dir = SCENARIO_DIR
    tools = ()
    # A warm start of ~48,000 demonstrated moves: as many replies as the math environment's, on about twice
    # its tokens (a move is trained with earlier turns as context); a few minutes on two CPU cores. Games
    # last ~0.75 * target_tile moves, so that is 500 games at 128 and 2,000 at 32. With a quarter of
    # that at 32, every sampled and greedy validation game ended on an unparseable reply.
    WARM_START_MOVES = 48_000

    # SmolLM2-135M-Instruct plays no game to the end on its own (every sampled and greedy game ends on a reply that is
    # not a move); 64 of the teacher's games (about 700 moves, two minutes) make it play, winning 30% sampled.
    pretrained_warm_start_examples = 64
    # Validation plays 100 games once each, at the sampling temperature the stopping rules and the gate read: 50 games
    # played twice (sampled and greedy) cost the same (101 against 105 s after the warm start on a 2-core Zen 4), and
    # on 50 a true gain of 8 points passed the gate about 1 time in 14 (bench/gate_power.py, README Results). Steps of
    # 4 openings x 4 games replaced 2 x 8: with 2 openings a step's gradient followed two boards, and on seed 0 of
    # environment 2.0.0 RL gained 10 points by step 4 and lost 13 by step 8; at 4 x 4 it gained 11 by step 2 and held
    # 7-9 to a plateau, but on seed 1 it gained 8 and fell below step 0 as well (README Results, 2026-12-07).
    # The job stops once validation is 15 points above step 0: what the gate needs to ACCEPT on 100 sampled games where
    # about 45 change outcome (+13 with 29 against 16 gave [+0.00, +0.25], README Results). A gain, not an accuracy:
    # the warm start wins 26-27 of 100 on an AMX Xeon and 22 on a Zen 4, where a target of 0.42 left a +16 with ACCEPT
    # running to the step cap (at 0.15 the same seed stopped at step 2, +18 with ACCEPT, in 13 minutes). RL that does
    # not get there stops by plateau or at the step cap. A step plays 4 openings 8 times each, 4 steps at most: at
    # 4 x 4 over 8 steps (the same 128 games) seeds 1 and 2 gained 8-9 points and lost them, and no run met issue 32's
    # bars together; at 4 x 8 seeds 0 and 2 reached the target with ACCEPT in 12.6 and 8.7 minutes on an AMX Xeon, and
    # seed 1 gained 4; on a slow Zen 4 every seed gained 13-16 and kept it (README Results, 2026-12-07 and 12-08).
    pretrained_job = MappingProxyType({
        "training": MappingProxyType({"groups_per_step": 4, "group_size": 8, "learning_rate": 2e-4, "max_steps": 4}),
        "validation": MappingProxyType({"max_examples": 100, "every_n_steps": 2, "greedy": False,
                                        "target_gain": 0.15}),
    })  # fmt: skip

    def __init__(self, *, target_tile: int = 16, max_turns: int | None = None) -> None:
        if isinstance(target_tile, bool) or not isinstance(target_tile, int) or target_tile not in TARGET_TILES:
            raise ValueError(f"target_tile must be a power of two from 8 to 2048, got {target_tile!r}")
        if max_turns is None:
            max_turns = round(TURNS_PER_TARGET * target_tile)
        if type(max_turns) is not int or not 1 <= max_turns <= MAX_TURNS_LIMIT:
            raise ValueError(f"max_turns must be an integer from 1 to {MAX_TURNS_LIMIT} (each turn is a model call)")
        self.target_tile = target_tile
        self.max_turns = max_turns
        self.warm_start_examples = round(self.WARM_START_MOVES / (0.75 * target_tile))

    def preamble(self) -> list[dict[str, str]]:
        """What every game opens with, before its first board: the contract, then the example turns."""
        prompt = SYSTEM_PROMPT.format(target=self.target_tile, target_cell=cell(self.target_tile))
        examples = ((observation(board, moved=True), format_move(move)) for board, move in EXAMPLES)
        return [system(prompt), *few_shot(examples)]

    def opening(self, scenario: dict[str, Any]) -> list[dict[str, str]]:
        board = new_game(int(scenario["seed"])).board
        return [*self.preamble(), {"role": "user", "content": observation(board, moved=True)}]

    async def rollout(self, model: art.Model, scenario: dict[str, Any], sampling: Sampling) -> art.Trajectory:
        game = new_game(int(scenario["seed"]))
        trajectory = new_trajectory(messages_and_choices=self.preamble())
        outcome = None
        turns = wasted = in_a_row = 0  # in_a_row: the latest moves that changed nothing
        moved = True
        while outcome is None:
            trajectory.messages_and_choices.append({"role": "user", "content": observation(game.board, moved=moved)})
            # A seeded rollout varies its seed per turn, so turns do not all draw the same noise.
            turn_sampling = sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + turns)
            choice = await complete(model, trajectory.messages(), turn_sampling, max_tokens=MAX_TOKENS)
            trajectory.messages_and_choices.append(choice)
            turns += 1
            direction = parse_move(choice.message.content)
            if direction is None:
                outcome = scoring.INVALID_MOVE
                break
            moved = game.move(direction)
            wasted += not moved
            in_a_row = 0 if moved else in_a_row + 1
            if max_tile(game.board) >= self.target_tile:
                outcome = scoring.WIN
            elif is_game_over(game.board):
                outcome = scoring.LOSS
            elif in_a_row >= scoring.STUCK_AFTER:
                outcome = scoring.STUCK
            elif turns >= self.max_turns:
                outcome = scoring.TURN_LIMIT
        top = max_tile(game.board)
        trajectory.reward = scoring.reward(
            outcome=outcome,
            max_tile=top,
            board_sum=board_sum(game.board),
            target_tile=self.target_tile,
            wasted_moves=wasted,
        )
        trajectory.metrics = {
            "won": outcome == scoring.WIN,
            "max_tile": top,
            "moves": game.moves,
            "turns": turns,
            "wasted_moves": wasted,
            "invalid_move": outcome == scoring.INVALID_MOVE,
            "stuck": outcome == scoring.STUCK,
            "points": game.points,
        }
        trajectory.metadata = {
            "scenario_id": scenario["id"],
            "outcome": outcome,
            "target_tile": self.target_tile,
            "scorer_version": scoring.SCORER_VERSION,
        }
        return trajectory

    def is_correct(self, trajectory: art.Trajectory) -> bool:
        return trajectory.metadata.get("outcome") == scoring.WIN

    def demonstrations(self, *, seed: int, count: int) -> Iterator[art.Trajectory]:
        """``count`` whole games of the heuristic player on train seeds drawn (with replacement) from ``seed``, played
        as they are read."""
        rng = random.Random(seed)
        train = self.scenarios("train")
        for _ in range(count):
            game = new_game(int(rng.choice(train)["seed"]))
            player_rng = random.Random(rng.getrandbits(64))
            turns = play(game, player_rng, target_tile=self.target_tile, max_turns=self.max_turns)
            played = [m for board, move in turns for m in _demonstrated_turn(board, move)]
            yield new_trajectory(messages_and_choices=[*self.preamble(), *played])


def _demonstrated_turn(board: Board, direction: str) -> tuple[dict[str, str], dict[str, str]]:
    user = {"role": "user", "content": observation(board, moved=True)}  # the teacher only plays moves that change it
    return user, {"role": "assistant", "content": format_move(direction)}
