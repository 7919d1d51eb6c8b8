"""The math reward: math-verify equivalence, in worker processes with a hard timeout."""

import asyncio
import os
import signal
import time

import pytest
from math_verify import parse, verify

from art_rlvr import load_scenario
from art_rlvr.scenarios.rewards.math import MathReward, gold_text, verifier_pool

REWARD = MathReward(timeout_s=5.0)
PATHOLOGICAL = "\\boxed{9^{9^{9^{9}}}}"  # sympy tries to evaluate a number with ~3.7e8 digits


@pytest.fixture(scope="module", autouse=True)
async def warm_pool():
    """Workers import sympy once (~1-2 s each); timings below exclude that."""
    await verifier_pool(REWARD.workers).warm_up()


PAIRS = [
    # (gold, completion, correct)
    ("\\frac{1}{2}", "The answer is $\\boxed{\\frac{1}{2}}$.", True),
    ("\\frac{1}{2}", "$\\boxed{0.5}$", True),
    ("\\frac{1}{2}", "$\\boxed{\\dfrac{2}{4}}$", True),
    ("\\frac{1}{2}", "$\\boxed{1/2}$", True),
    ("\\frac{1}{2}", "so x = 1/2", True),
    ("\\frac{1}{2}", "$\\boxed{\\frac{1}{3}}$", False),
    ("5\\sqrt{2}", "$\\boxed{\\sqrt{50}}$", True),
    ("5\\sqrt{2}", "$\\boxed{7.0710678}$", True),  # float rounding to 6 places
    ("5\\sqrt{2}", "$\\boxed{5\\sqrt{3}}$", False),
    ("\\frac{\\sqrt{2}}{2}", "$\\boxed{\\frac{1}{\\sqrt{2}}}$", True),
    ("(4, \\infty)", "$\\boxed{(4, \\infty)}$", True),
    ("(4, \\infty)", "$\\boxed{[4, \\infty)}$", False),  # closed end is a different set
    ("[-3, 3]", "$\\boxed{[-3,3]}$", True),
    ("[-3, 3]", "$\\boxed{-3 \\le x \\le 3}$", False),  # math-verify: inequality != interval
    ("[2, \\infty)", "$x \\in \\boxed{[2, \\infty)}$", True),
    ("25\\%", "$\\boxed{25\\%}$", True),
    ("25\\%", "$\\boxed{25}$", True),
    ("25\\%", "$\\boxed{0.25}$", True),
    ("25\\%", "$\\boxed{2.5}$", False),
    ("\\{2, 3\\}", "$\\boxed{\\{3, 2\\}}$", True),
    ("\\{2, 3\\}", "$\\boxed{2, 3}$", True),
    ("\\{2, 3\\}", "$\\boxed{\\{2, 4\\}}$", False),
    ("3", "$\\boxed{3}$ ... wait, actually $\\boxed{4}$", False),  # the last answer counts
    ("3", "x = 3", True),
    ("3", "The slope is 3.", True),
    ("1000", "$\\boxed{1,000}$", True),
    ("x^2+2x+1", "$\\boxed{(x+1)^2}$", True),
    ("\\frac{3}{4}", "\\boxed{\\frac{3}{4}", True),  # unclosed brace, cut off by max_tokens
    ("3", "I don't know", False),
    ("3", "\x00\x01\xff", False),
    ("3", "🙂 ∑∫ soup", False),
]


@pytest.mark.parametrize(("gold", "completion", "correct"), PAIRS)
async def test_math_reward_agrees_with_math_verify(
    gold: str, completion: str, correct: bool
) -> None:
    direct = verify(parse(gold_text(gold)), parse(completion))  # main thread: alarms work here
    score = await REWARD({"answer": gold}, completion)
    assert direct == correct
    assert score.correct == correct and score.reward == float(correct), score.feedback
    assert score.metrics["timeout"] == 0.0 and score.metrics["verifier_error"] == 0.0
    assert score.feedback.startswith("correct" if correct else ("wrong", "no final answer"))


@pytest.mark.parametrize(
    ("completion", "feedback", "parsed"),
    [
        ("", "empty answer", 0.0),
        ("   \n", "empty answer", 0.0),
        ("no maths here", "no final answer found", 0.0),
        ("9" * 50_000, "no final answer found", 0.0),  # math-verify skips absurd numbers
        ("$\\boxed{7}$", "wrong: read the answer as 7, expected 3", 1.0),
    ],
)
async def test_garbage_and_feedback(completion: str, feedback: str, parsed: float) -> None:
    score = await REWARD({"answer": "3"}, completion)
    assert score.reward == 0.0 and feedback in score.feedback
    assert score.metrics["parsed"] == parsed


async def test_feedback_hides_gold_when_asked() -> None:
    quiet = MathReward(reveal_answer_in_feedback=False)
    assert "3" not in (await quiet({"answer": "3"}, "$\\boxed{7}$")).feedback


async def test_pathological_answer_times_out_without_delaying_others() -> None:
    reward = MathReward(timeout_s=2.0)

    async def timed(x: dict, y: str) -> tuple[float, object]:
        started = time.monotonic()
        score = await reward(x, y)
        return time.monotonic() - started, score

    slow = asyncio.ensure_future(timed({"answer": "1"}, PATHOLOGICAL))
    await asyncio.sleep(0.05)  # the pathological check holds one worker
    ordinary = await asyncio.gather(
        *(timed({"answer": f"\\frac{{{i}}}{{7}}"}, f"so $\\boxed{{{i}/7}}$") for i in range(1, 21))
    )
    slow_seconds, slow_score = await slow
    assert all(score.correct for _, score in ordinary)
    assert max(seconds for seconds, _ in ordinary) < 1.0  # each is milliseconds on its own
    assert slow_score.reward == 0.0 and slow_score.feedback.startswith("verifier timed out")
    assert slow_score.metrics["timeout"] == 1.0
    assert 2.0 <= slow_seconds < 3.5
    assert (await reward({"answer": "2"}, "\\boxed{2}")).correct  # the pool recovered


async def test_pathological_answer_does_not_block_the_event_loop() -> None:
    slow = asyncio.ensure_future(MathReward(timeout_s=1.0)({"answer": "1"}, PATHOLOGICAL))
    worst = 0.0
    while not slow.done():
        before = time.monotonic()
        await asyncio.sleep(0.01)
        worst = max(worst, time.monotonic() - before - 0.01)
    assert (await slow).metrics["timeout"] == 1.0
    assert worst < 0.25


async def test_killed_workers_are_replaced() -> None:
    pool = verifier_pool(REWARD.workers)
    for worker in list(pool._all):
        os.kill(worker.proc.pid, signal.SIGKILL)
    score = await REWARD({"answer": "\\frac{1}{2}"}, "$\\boxed{0.5}$")
    assert score.correct and score.metrics["verifier_error"] == 0.0


async def test_same_input_same_score() -> None:
    x, y = {"answer": "[2, 5)"}, "$\\boxed{(2, 5)}$"
    assert await REWARD(x, y) == await REWARD(x, y)


async def test_shipped_math_sample_solutions_score_one() -> None:
    task = load_scenario("math", seed=0)
    scenarios = [sc for split in task.splits.values() for sc in split]
    assert len(scenarios) == 22 and {sc.x["type"] for sc in scenarios} >= {
        "fraction",
        "sqrt",
        "interval",
        "percent",
        "set",
    }
    right = await asyncio.gather(*(sc.score(sc.x["solution"]) for sc in scenarios))
    wrong = await asyncio.gather(*(sc.score("$\\boxed{12345}$") for sc in scenarios))
    assert [s.reward for s in right] == [1.0] * 22
    assert [s.reward for s in wrong] == [0.0] * 22
