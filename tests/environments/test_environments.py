"""Multi-turn environments in scenario files: the game rules and rewards as pure functions,
episodes that fail or run away (over loopback, against the scripted server), bad
`[environment]` tables, the single-turn request kept exactly, and one real episode of every
built-in environment scenario with the embedded model."""

from __future__ import annotations

import textwrap
from pathlib import Path

import art
import pytest
from openai.types.chat.chat_completion import Choice

from art_rlvr import load_scenario
from art_rlvr.core.outcome import feedback_of, is_correct, turns
from art_rlvr.gepa.adapter import example_eval
from art_rlvr.loops.context import group_metrics
from art_rlvr.rollouts.rollout import rollout
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.scenarios.environments.arith_retry import ArithRetry
from art_rlvr.scenarios.environments.calc import calculator, multiply
from art_rlvr.scenarios.environments.calc import environment as calc_environment
from art_rlvr.scenarios.environments.tictactoe import (
    Game,
    TicTacToe,
    finished,
    opponent_move,
    parse_move,
    render,
)
from art_rlvr.scenarios.sources import ScenarioFileError
from art_rlvr.testing import ScriptedServer, Step, scripted_model


def board(text: str) -> tuple[str, ...]:
    """'XO.X.....' -> a board (dots are free cells)."""
    return tuple("" if c == "." else c for c in text)


def episode(*replies: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "go"}] + [
        {"role": "assistant", "content": r} for r in replies
    ]


# ---- tic-tac-toe rules -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "move"),
    [
        ("5", 5),
        (" 7.\n", 7),
        ("I play 3", 3),
        ("My move is 9.", 9),
        ("I'll take cell 1 because 1 is free", 1),
        ("Move: 4, not 6", 4),
        ("cell 12", 12),  # read honestly; the rules call it off the board
        ("5 or 7", None),  # two guesses are no move
        ("the centre", None),
        ("1.5", None),
        ("", None),
    ],
)
def test_moves_are_read_leniently_but_honestly(text: str, move: int | None) -> None:
    assert parse_move(text) == move


@pytest.mark.parametrize(
    ("cells", "status"),
    [
        ("XXX.OO...", "won"),
        ("OX.OX.O..", "lost"),
        ("X.O.X.O.X", "won"),
        ("XOXXOOOXX", "draw"),
        ("XO.......", "playing"),
    ],
)
def test_game_status(cells: str, status: str) -> None:
    assert finished(board(cells)) == status


@pytest.mark.parametrize(
    ("cells", "cell"),
    [
        ("OO.XX....", 2),  # O wins rather than blocks
        ("XX.O.....", 2),  # blocks X
        ("X........", 4),  # takes the centre
        ("....X....", None),  # a corner, chosen by the seeded RNG
    ],
)
def test_heuristic_opponent(cells: str, cell: int | None) -> None:
    move = opponent_move(board(cells), "heuristic", seed=1, ply=1)
    assert move == cell if cell is not None else move in (0, 2, 6, 8)


def test_random_opponent_is_legal_and_seeded() -> None:
    b = board("X.O.X.O..")
    moves = {opponent_move(b, "random", seed=s, ply=4) for s in range(40)}
    assert moves == {1, 3, 5, 7, 8}
    assert opponent_move(b, "random", 9, 4) == opponent_move(b, "random", 9, 4)


@pytest.mark.parametrize(
    ("replies", "status", "reward", "illegal"),
    [
        # the random opponent with seed 0 answers 5 with 2, then 1 with 7 (checked below)
        (("5", "1", "9"), "won", 1.0, 0),
        (("5", "5", "I play 1", "9"), "won", 1.0, 1),
        (("5", "5", "nope", "2"), "forfeit", 0.0, 3),
        (("5",), "playing", 0.0, 0),
    ],
)
def test_a_game_replays_from_the_replies(replies, status, reward, illegal) -> None:
    game = TicTacToe(opponent="random", max_illegal=3)
    x = {"seed": 0, "opponent_first": False}
    played = game.replay(x, episode(*replies))
    assert (played.status, played.illegal) == (status, illegal)
    score = game.reward(x, episode(*replies))
    assert score.reward == reward and score.metrics["correct"] == float(status == "won")


def test_the_seed_0_game_used_above() -> None:
    game = TicTacToe()
    x = {"seed": 0, "opponent_first": False}
    after = game.play(x, Game(), "5")
    assert after.last_opponent == 2 and after.board == board(".O..X....")
    assert game.play(x, after, "1").last_opponent == 7


def test_illegal_moves_get_feedback_and_a_retry() -> None:
    game = TicTacToe()
    x = {"seed": 0, "opponent_first": False}
    reply = game.respond(x, episode("5", "5"))
    assert not reply.done and reply.metrics == {"illegal_actions": 1.0}
    assert "cell 5 is taken" in reply.messages[0]["content"]
    assert "Which free cell do you take: 1, 3, 4, 6, 7, 8, 9?" in reply.messages[0]["content"]
    assert game.respond(x, episode("5", "5", "x", "y")).done


def test_the_opponent_may_open_and_the_board_is_text() -> None:
    game = TicTacToe(opponent="heuristic")
    opening = game.opening({"seed": 3, "opponent_first": True})[0]["content"]
    assert "after my O at 5" in opening  # the heuristic takes the centre
    assert render(board("....O....")) in opening


# ---- arith with retries ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("replies", "reward", "correct", "attempts"),
    [
        (("7",), 1.0, 1.0, 1),
        (("6", "7"), 0.5, 1.0, 2),
        (("6", "no idea", "The answer is 7"), 0.25, 1.0, 3),
        (("6", "6", "6"), 0.0, 0.0, 3),
        (("7", "8"), 1.0, 1.0, 1),  # replies after the right one do not count
    ],
)
def test_arith_retry_reward(replies, reward, correct, attempts) -> None:
    env = ArithRetry(attempts=3, discount=0.5)
    score = env.reward({"answer": 7}, episode(*replies))
    assert (score.reward, score.metrics["correct"], score.metrics["attempts"]) == (
        reward,
        correct,
        attempts,
    )


def test_arith_retry_feedback_never_tells_the_answer() -> None:
    env = ArithRetry(attempts=3)
    reply = env.respond({"answer": 7}, episode("6"))
    assert not reply.done and "7" not in reply.messages[0]["content"]
    assert "6 is not right" in reply.messages[0]["content"]
    assert env.respond({"answer": 7}, episode("6", "7")).done
    assert env.respond({"answer": 7}, episode("6", "5", "4")).done


async def test_a_retry_solved_on_the_second_try_is_correct_everywhere() -> None:
    """Reward 0.5 on `arith_retry` is a solve (`outcome.is_correct`): group statistics count the
    group all correct and GEPA's perfect-minibatch rule sees it as nothing to improve, as
    evaluation and expert iteration do."""
    record = load_scenario("arith_retry", seed=0).splits["val"][0]
    answer = int(record.x["answer"])
    script = [Step.reply(str(answer + 1)), Step.reply(str(answer))] * 2
    with ScriptedServer(script) as server:
        model = scripted_model(server)
        group = art.TrajectoryGroup([await rollout(model, record) for _ in range(2)])
    assert [(t.reward, is_correct(t)) for t in group.trajectories] == [(0.5, True)] * 2
    stats = group_metrics([group])
    assert (stats["frac_all_correct"], stats["accuracy"], stats["reward_mean"]) == (1, 1, 0.5)
    assert example_eval(group, "Be brief.").perfect


# ---- the calculator tool ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("123456 * 789012", "97408265472"),
        ("(2 + 3) ** 2 - 1", "24"),
        ("7 / 2", "3.5"),
        ("12,345 × 2", "24690"),
        ("2^10", "1024"),
        ("}} 967670 * 272329 =", "263524603430"),  # stray JSON a forced call writes
    ],
)
def test_calculator(expression: str, value: str) -> None:
    assert calculator(expression) == value


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("1/0", "division by zero"),
        ("__import__('os').system('true')", "not allowed"),
        ("9 ** 9 ** 9", "exponents"),
        ("(10 ** 60) ** 60", "digits"),
        ("two times three", "cannot read"),
        ('{"": ""}', "cannot read"),
    ],
)
def test_calculator_refuses(expression: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        calculator(expression)


@pytest.mark.parametrize(
    ("a", "b", "value"),
    [(123456, 789012, "97408265472"), (-3, 7, "-21"), (0, 10**100, "0")],
)
def test_multiply(a: int, b: int, value: str) -> None:
    assert multiply(a, b) == value


def test_multiply_refuses_a_product_beyond_its_bound() -> None:
    with pytest.raises(ValueError, match="digits"):
        multiply(10**800, 10**800)


@pytest.mark.parametrize(
    ("params", "name"), [({}, "multiply"), ({"tool": "calculator"}, "calculator")]
)
def test_calc_offers_the_tool_it_is_configured_with(params: dict, name: str) -> None:
    assert [t.__name__ for t in calc_environment(**params).tools] == [name]


# ---- environments that fail, hang or run away ------------------------------------------------

FAULTY = """
import asyncio
import time
from art_rlvr.scenarios.environments import Environment, Reply
from art_rlvr.scenarios.rewards import Score

def make(mode: str, reward: str = "ok") -> Environment:
    def respond(x, episode):
        if mode == "raise":
            raise RuntimeError("the board caught fire")
        if mode == "hang":
            time.sleep(5)
        if mode == "garbage":
            return 42
        if mode == "forever":
            return Reply.say("again")
        return Reply(done=True)

    async def respond_async(x, episode):
        await asyncio.sleep(10**6)

    def score(x, episode):
        if reward == "raise":
            raise KeyError("no such field")
        if reward == "garbage":
            return "full marks"
        if reward == "hang":
            time.sleep(5)
        return Score(reward=1.0, feedback="fine")

    async def score_async(x, episode):
        await asyncio.sleep(10**6)

    return Environment(
        respond=respond_async if mode == "async_hang" else respond,
        reward=score_async if reward == "async_hang" else score,
    )
"""

HEAD = """name = "t"
user_template = "What is {a} {op} {b}?"
[source]
type = "arith"
splits = { train = 2, val = 2, test = 2 }
"""


@pytest.fixture(scope="module")
def faulty_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("faulty")
    (folder / "faulty_envs.py").write_text(FAULTY)
    return folder


def write(folder: Path, text: str) -> Path:
    path = folder / "t.toml"
    path.write_text(textwrap.dedent(text))
    return path


async def run_faulty(
    folder: Path, monkeypatch: pytest.MonkeyPatch, mode: str, reward: str = "ok", turns_: int = 3
) -> tuple[art.Trajectory, int]:
    monkeypatch.syspath_prepend(str(folder))
    toml = HEAD + (
        f'[environment]\nname = "faulty_envs:make"\nmax_turns = {turns_}\ntimeout_s = 0.3\n'
        f'params = {{ mode = "{mode}", reward = "{reward}" }}\n'
    )
    scenario = load_scenario(str(write(folder, toml)))
    with ScriptedServer([], default=Step.reply("7")) as server:
        t = await rollout(scripted_model(server), scenario.splits["val"][0])
        return t, len(server.chat_requests)


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("raise", "environment raised RuntimeError: the board caught fire"),
        ("hang", "environment timed out after 0.3 s"),
        ("async_hang", "environment timed out after 0.3 s"),
        ("garbage", "an environment returns Reply, str or None, not int"),
    ],
)
async def test_a_failing_environment_ends_the_episode_with_zero(
    faulty_dir, monkeypatch, mode: str, reason: str
) -> None:
    t, requests = await run_faulty(faulty_dir, monkeypatch, mode)
    assert requests == 1 and t.reward == 0.0 and not is_correct(t)
    assert t.metrics["env_error"] == 1.0
    assert any(reason in line for line in t.logs), t.logs
    assert reason in feedback_of(t)
    assert isinstance(t.messages_and_choices[-1], Choice)  # the turn is kept


@pytest.mark.parametrize(
    ("reward", "reason"),
    [
        ("raise", "reward raised KeyError"),
        ("garbage", "reward returned str; a reward returns a Score"),
        ("hang", "reward timed out after 0.3 s"),
        ("async_hang", "reward timed out after 0.3 s"),
    ],
)
async def test_a_failing_reward_scores_zero(faulty_dir, monkeypatch, reward, reason) -> None:
    t, _ = await run_faulty(faulty_dir, monkeypatch, "done", reward)
    assert t.reward == 0.0 and t.metrics["reward_error"] == 1.0
    assert any(reason in line for line in t.logs) and reason in feedback_of(t)


async def test_a_runaway_episode_hits_the_turn_cap(faulty_dir, monkeypatch) -> None:
    t, requests = await run_faulty(faulty_dir, monkeypatch, "forever", turns_=3)
    assert requests == 3 and t.metrics["turns"] == 3 and t.metrics["turn_cap_hit"] == 1
    assert [m["role"] for m in turns(t)].count("assistant") == 3
    assert any("turn cap" in line for line in t.logs)
    assert t.reward == 1.0 and t.metrics["env_error"] == 0  # the reward still judged it


async def test_a_healthy_custom_environment(faulty_dir, monkeypatch) -> None:
    t, requests = await run_faulty(faulty_dir, monkeypatch, "done")
    assert requests == 1 and t.reward == 1.0 and feedback_of(t) == "fine"
    assert t.metrics["env_error"] == 0 and t.metrics["reward_error"] == 0


@pytest.mark.parametrize(
    ("override", "first"),
    [
        (None, "auto"),  # the scenario's own
        ("multiply", {"type": "function", "function": {"name": "multiply"}}),
        ("none", "none"),
    ],
)
async def test_sampling_overrides_the_scenarios_tool_choice(override, first) -> None:
    """What expert iteration's `search_tool_choice` rides on: the rollout asks with the
    override on turn 0, and (reset after a call, as in the Agents SDK) nothing on turn 1."""
    sc = load_scenario("calc").splits["val"][0]
    script = [
        Step.calls(("multiply", {"a": sc.x["a"], "b": sc.x["b"]})),
        Step.reply(str(sc.x["answer"])),
    ]
    with ScriptedServer(script) as server:
        t = await rollout(scripted_model(server), sc, sampling=SamplingConfig(tool_choice=override))
        bodies = [r.body for r in server.chat_requests]
    assert bodies[0]["tool_choice"] == first and "tool_choice" not in bodies[1]
    assert is_correct(t) and t.metrics["tool_calls"] == 1 and t.metrics["tool_errors"] == 0


# ---- bad [environment] tables are one-line errors with file:line -----------------------------


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('name = "nonesuch"\n', ":7: unknown environment 'nonesuch'"),
        ('name = "tictactoe"\nparams = { opponent = "genius" }\n', ":8: bad parameters"),
        ('name = "tictactoe"\nmax_turns = 0\n', ":8: field 'environment.max_turns'"),
        ('name = "tictactoe"\nsurprise = 1\n', ":8: field 'environment.surprise'"),
        ('name = "no_such_module_xyz:make"\n', ":7: cannot import 'no_such_module_xyz'"),
        (
            'name = "art_rlvr.scenarios.environments.calc:nope"\n',
            ":7: 'art_rlvr.scenarios.environments.calc' has no",
        ),
        ('name = "art_rlvr.scenarios.environments:Reply"\n', ":7: environment factory"),
        ('name = "calc"\ntool_choice = "divide"\n', ":8: tool_choice 'divide' is not auto"),
        ('name = "arith_retry"\ntool_choice = "multiply"\n', ":8: tool_choice 'multiply' is not"),
    ],
)
def test_bad_environment_tables(tmp_path: Path, table: str, message: str) -> None:
    path = write(tmp_path, HEAD + "[environment]\n" + table)
    with pytest.raises(ScenarioFileError) as caught:
        load_scenario(str(path))
    assert f"{path}{message}" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            HEAD + '[environment]\nname = "calc"\n',
            "field 'reward': a \\[reward\\] table is required",
        ),
        (
            HEAD.replace('user_template = "What is {a} {op} {b}?"\n', "")
            + '[environment]\nname = "arith_retry"\n',
            "field 'user_template': required",
        ),
    ],
)
def test_what_an_environment_does_not_give_is_required(tmp_path, text, message) -> None:
    with pytest.raises(ScenarioFileError, match=message):
        load_scenario(str(write(tmp_path, text)))


# ---- one real episode of every built-in environment, with the embedded model -----------------


@pytest.mark.parametrize("name", ["arith_retry", "tictactoe", "calc"])
async def test_an_episode_with_the_embedded_model(model, name: str) -> None:
    scenario = load_scenario(name, seed=0)
    sc = scenario.splits["val"][0]
    t = await rollout(model, sc, sampling=SamplingConfig(max_tokens=12, temperature=0.0))
    sampled = [i for i in t.messages_and_choices if isinstance(i, Choice)]
    assert sampled and all(c.model_extra["token_ids"] for c in sampled)
    assert t.metrics["turns"] == len(sampled) <= scenario.environment.max_turns
    assert 0.0 <= t.reward <= 1.0 and feedback_of(t)
    assert t.metrics.get("env_error", 0.0) == 0.0 and t.metrics.get("reward_error", 0.0) == 0.0
    assert t.metadata["task"] == name
    if name == "calc":
        assert t.tools and t.tools[0]["function"]["name"] == "multiply"
