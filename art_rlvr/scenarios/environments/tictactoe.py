"""`tictactoe`: the model plays X against a seeded opponent (O).

Cells are numbered 1-9, left to right, top to bottom; the board is shown as text with free
cells showing their number. A reply names one cell: an explicit "move 5" / "cell 5" / "I play
5" counts (the last such phrase), else the only digit 1-9 standing alone; several different
digits with no marker is no move, never a guess. An illegal move (unreadable, out of range, a
taken cell) gets feedback listing the free cells and a retry; the `max_illegal`-th in one game
forfeits it (a loss). Reward: win 1, draw `draw_reward`, loss or forfeit 0; `correct` = won.

The opponent is `random` (a free cell, seeded by the record's seed and the ply) or `heuristic`
(win if it can, else block, else the centre, a corner, any cell; ties broken by the same seeded
RNG). The game is replayed from the episode's messages at every turn: nothing is kept between
turns, so an episode is a pure function of the record and the model's replies.
"""

from __future__ import annotations

import random
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from art_rlvr.core.types import Messages, Record, Reply, Score
from art_rlvr.scenarios.environments.base import Environment, assistant_texts

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
Board = tuple[str, ...]  # nine cells: "X", "O" or ""
Status = Literal["playing", "won", "lost", "draw", "forfeit"]

_MARKED = re.compile(
    r"\b(?:move|cell|square|position|play|take|choose|pick|put|place|mark)\w*"
    r"(?:\s+(?:is|at|on|in|to|the|my|an?|x|number|cell|square|position))*\s*[:#=]?\s*(\d+)\b",
    re.IGNORECASE,
)
_DIGIT = re.compile(r"(?<!\d)(?<!\d\.)(\d+)(?!\.?\d)")


def winner(board: Board) -> str | None:
    return next(
        (board[a] for a, b, c in LINES if board[a] and board[a] == board[b] == board[c]), None
    )


def free_cells(board: Board) -> list[int]:
    """Free cells, 1-based."""
    return [i + 1 for i, mark in enumerate(board) if not mark]


def render(board: Board) -> str:
    rows = [" | ".join(board[r * 3 + c] or str(r * 3 + c + 1) for c in range(3)) for r in range(3)]
    return "\n---------\n".join(rows)


def parse_move(text: str) -> int | None:
    """The cell a reply names (any integer: range is checked by the rules), or None."""
    marked = _MARKED.findall(text)
    if marked:
        return int(marked[-1])
    numbers = {int(n) for n in _DIGIT.findall(text)}
    return numbers.pop() if len(numbers) == 1 else None


def position(board: Board, opponent: int | None = None) -> str:
    """A prompt: the board, then a question naming the free cells. The embedded 135M model
    echoes a preamble or an instruction ("You are X, I am O...", "Your move: reply with...")
    back, but answers this short form with a cell number."""
    after = f", after my O at {opponent}" if opponent else ""
    free = ", ".join(map(str, free_cells(board)))
    return (
        f"Tic-tac-toe board (X is you, O is me{after}):\n\n{render(board)}\n\n"
        f"Which free cell do you take: {free}? Answer with just the number."
    )


def opponent_move(board: Board, level: str, seed: int, ply: int) -> int:
    """0-based cell for O."""
    rng = random.Random(f"tictactoe:{seed}:{ply}")
    free = [i for i, mark in enumerate(board) if not mark]
    if level == "heuristic":
        for mark in ("O", "X"):  # win, else block
            for cell in free:
                if winner(tuple(mark if i == cell else m for i, m in enumerate(board))) == mark:
                    return cell
        for preferred in ([4], [0, 2, 6, 8]):
            options = [c for c in preferred if c in free]
            if options:
                return rng.choice(options)
    return rng.choice(free)


def place(board: Board, cell: int, mark: str) -> Board:
    return tuple(mark if i == cell else m for i, m in enumerate(board))


class Game(BaseModel):
    """Where a game stands after some replies, and what the last reply did."""

    model_config = ConfigDict(frozen=True)

    board: Board = ("",) * 9
    status: Status = "playing"
    illegal: int = 0
    moves: int = 0
    last_illegal: str | None = None  # why the last reply was not a move
    last_opponent: int | None = None  # 1-based


def finished(board: Board) -> Status:
    mark = winner(board)
    if mark:
        return "won" if mark == "X" else "lost"
    return "draw" if all(board) else "playing"


class TicTacToe(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    opponent: Literal["random", "heuristic"] = "random"
    max_illegal: int = Field(default=3, ge=1)
    draw_reward: float = Field(default=0.5, ge=0.0, le=1.0)

    @staticmethod
    def seed_of(x: Record) -> int:
        """The record's `seed`, which picks the opponent's moves."""
        seed = x["seed"]
        if not isinstance(seed, int | float | str):
            raise TypeError(f"a record's seed is {type(seed).__name__}, not a number")
        return int(seed)

    def start(self, x: Record) -> Game:
        """The opening position: empty, or after O's first move when the opponent starts."""
        if not x.get("opponent_first"):
            return Game()
        cell = opponent_move(("",) * 9, self.opponent, self.seed_of(x), 0)
        return Game(board=place(("",) * 9, cell, "O"), last_opponent=cell + 1)

    def play(self, x: Record, game: Game, text: str) -> Game:
        """One reply applied: an illegal move, or X's move and O's answer."""
        if game.status != "playing":
            return game
        move = parse_move(text)
        free = free_cells(game.board)
        why = (
            "I could not read one cell number from your reply"
            if move is None
            else f"{move} is not a cell (1-9)"
            if not 1 <= move <= 9
            else f"cell {move} is taken"
            if move not in free
            else None
        )
        if why is not None or move is None:  # (why is set whenever move is None)
            illegal = game.illegal + 1
            status = "forfeit" if illegal >= self.max_illegal else "playing"
            return game.model_copy(
                update={"illegal": illegal, "status": status, "last_illegal": why}
            )
        board = place(game.board, move - 1, "X")
        status = finished(board)
        ply = sum(bool(m) for m in board)
        reply = None
        if status == "playing":
            reply = opponent_move(board, self.opponent, self.seed_of(x), ply)
            board = place(board, reply, "O")
            status = finished(board)
        return Game(
            board=board, status=status, illegal=game.illegal, moves=game.moves + 1,
            last_opponent=None if reply is None else reply + 1,
        )  # fmt: skip

    def replay(self, x: Record, episode: Messages) -> Game:
        game = self.start(x)
        for text in assistant_texts(episode):
            game = self.play(x, game, text)
        return game

    def opening(self, x: Record) -> list[dict[str, str]]:
        game = self.start(x)
        return [{"role": "user", "content": position(game.board, game.last_opponent)}]

    def respond(self, x: Record, episode: Messages) -> Reply:
        game = self.replay(x, episode)
        illegal = float(game.last_illegal is not None)
        counts = {"illegal_actions": illegal}
        if game.status == "forfeit":
            return Reply(
                done=True, metrics=counts, log=f"forfeit after {game.illegal} illegal moves"
            )
        if game.status != "playing":
            return Reply(done=True, metrics=counts, log=f"{game.status} in {game.moves} moves")
        if game.last_illegal is not None:
            left = self.max_illegal - game.illegal
            return Reply.say(
                f"Illegal move: {game.last_illegal} ({left} illegal move{'s' if left > 1 else ''} "
                f"left before you forfeit). {position(game.board)}",
                metrics=counts,
            )
        return Reply.say(position(game.board, game.last_opponent), metrics=counts)

    def reward(self, x: Record, episode: Messages) -> Score:
        game = self.replay(x, episode)
        value = {"won": 1.0, "draw": self.draw_reward}.get(game.status, 0.0)
        note = {
            "playing": "the game was not finished",
            "forfeit": f"forfeited after {game.illegal} illegal moves",
        }.get(game.status, f"{game.status} in {game.moves} moves")
        return Score(
            reward=value,
            feedback=f"{note}; final board:\n{render(game.board)}",
            metrics={
                "correct": float(game.status == "won"),
                **{k: float(game.status == k) for k in ("won", "draw", "lost", "forfeit")},
                "moves": float(game.moves),
                "unfinished": float(game.status == "playing"),
            },
        )


def environment(**params) -> Environment:
    game = TicTacToe(**params)
    # five moves of X at most, plus a retry for each allowed illegal move
    return Environment(
        opening=game.opening,
        respond=game.respond,
        reward=game.reward,
        max_turns=5 + game.max_illegal,
    )
