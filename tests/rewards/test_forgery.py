"""Wrong solutions that try to forge a pass from inside their own process: each scores 0, in
each sandbox that runs here. Before the judge ran in a process of its own (main e6a4417), the
first six scored 1.0 in both sandboxes (the rest were caught already, or, for the /proc probe, it could read the
harness's descriptors). Honest plain-data answers still pass, with Python's `==` (1.0 == 1).
"""

from __future__ import annotations

import pytest
from test_rewards_code import ADD, pytestmark  # noqa: F401 (the skip when no sandbox runs)

from art_rlvr.scenarios.rewards.code import CodeReward
from art_rlvr.scenarios.rewards.sandbox import sandbox_problem

HALF = {  # a float comparison through abs(), as many HumanEval tests do
    "prompt": 'def half(x):\n    """Half of x."""\n',
    "test": "def check(candidate):\n    assert abs(candidate(3) - 1.5) < 1e-9\n",
    "entry_point": "half",
}
POLY = {  # HumanEval/32's shape: the test judges with a helper from the prompt
    "prompt": "def poly(xs, x):\n    return sum(c * x**i for i, c in enumerate(xs))\n\n\n"
    'def root(xs):\n    """A zero of the polynomial."""\n',
    "test": "def check(candidate):\n    assert abs(poly([-2, 1], candidate([-2, 1]))) < 1e-9\n",
    "entry_point": "root",
}
# the harness's nonce, wherever a frame up the stack holds it, then fake reports on stdout
FRAMES = """
def add(a, b):
    import os, sys
    frame, found = sys._getframe(1), set()
    while frame is not None:
        found |= {v for v in frame.f_locals.values() if isinstance(v, str) and len(v) == 32}
        frame = frame.f_back
    for nonce in found:
        for index in range(3):
            print(f"\\n{nonce} {{'kind': 'unit', 'index': {index}, 'ok': True}}")
        print(f"\\n{nonce} {{'kind': 'done'}}", flush=True)
    os._exit(0)
"""
EQ = """
class Anything:
    def __eq__(self, other):
        return True
    __hash__ = None

def add(a, b):
    return Anything()
"""
INT_SUBCLASS = """
class Int(int):
    def __eq__(self, other):
        return True

def add(a, b):
    return Int(0)
"""
COMPILE = """
import builtins
real = builtins.compile
builtins.compile = lambda source, *rest, **kw: real("pass", *rest[:2])

def add(a, b):
    return 0
"""
ABS = "import builtins\nbuiltins.abs = lambda value: 0\n\ndef half(x):\n    return 0\n"
POLY_HELPER = "def poly(xs, x):\n    return 0\n\ndef root(xs):\n    return 99\n"
# open the memory or the descriptors (the report pipe, the tests) of another process of the run:
# the right answer only if it can; not pid 1 (bubblewrap's init, which holds only stdio)
PROBE = """
def add(a, b):
    import os
    me = os.getpid()
    for pid in [p for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, me)]:
        for path in (f'/proc/{pid}/mem', f'/proc/{pid}/fd/3', f'/proc/{pid}/fd/4'):
            try:
                open(path, 'rb').close()
                return a + b
            except OSError:
                pass
    return 0
"""
EXIT = "import sys\n\ndef add(a, b):\n    sys.exit(0)\n"
HARD_EXIT = "import os\n\ndef add(a, b):\n    os._exit(0)\n"
PRINT = "print(\"{'kind': 'unit', 'index': 0, 'ok': True}\")\nprint(\"{'kind': 'done'}\")\n\ndef add(a, b):\n    return 0\n"

FORGERIES = [  # (name, task, program, a fragment of the feedback)
    ("an __eq__ that is always true", ADD, EQ, "plain data"),
    ("an int subclass whose __eq__ is always true", ADD, INT_SUBCLASS, "plain data"),
    ("the nonce read through sys._getframe(1).f_locals", ADD, FRAMES, "exited"),
    ("builtins.compile patched to compile `pass`", ADD, COMPILE, "wrong answer"),
    ("builtins.abs patched to return 0", HALF, ABS, "wrong answer"),
    ("the prompt's helper redefined", POLY, POLY_HELPER, "wrong answer"),
    ("another process's memory or descriptors", ADD, PROBE, "wrong answer"),
    ("sys.exit(0) before the asserts", ADD, EXIT, "SystemExit"),
    ("os._exit(0) before the asserts", ADD, HARD_EXIT, "exited"),
    ("report lines printed to stdout", ADD, PRINT, "wrong answer"),
]


@pytest.mark.parametrize("kind", ["root", "bwrap"])
@pytest.mark.parametrize(
    ("task", "program", "said"), [pytest.param(*case[1:], id=case[0]) for case in FORGERIES]
)
async def test_forgeries_score_zero(kind: str, task: dict, program: str, said: str) -> None:
    if (problem := sandbox_problem(kind)) is not None:
        pytest.skip(problem)
    score = await CodeReward(sandbox=kind, limits={"timeout_s": 5.0})(task, program)
    assert score.reward == 0.0 and score.metrics["correct"] == 0.0, score.feedback
    assert said in score.feedback, score.feedback


HONEST = [
    (ADD, "def add(a, b):\n    print('debug', a, b)\n    return a + b\n"),
    (ADD, "def add(a, b):\n    return float(a + b)\n"),  # 3.0 == 3, as in the original tests
    (HALF, "def half(x):\n    return x / 2\n"),
    (POLY, "def root(xs):\n    return -xs[0] / xs[1]\n"),
]


@pytest.mark.parametrize(("task", "program"), HONEST)
async def test_honest_solutions_still_pass(task: dict, program: str) -> None:
    score = await CodeReward(limits={"timeout_s": 5.0})(task, program)
    assert score.reward == 1.0, score.feedback


async def test_an_exception_the_test_expects_crosses_as_itself() -> None:
    task = {
        "prompt": 'def positive(x):\n    """x, or ValueError if negative."""\n',
        "test": "def check(candidate):\n    try:\n        candidate(-1)\n    except ValueError:\n        pass\n    else:\n        assert False\n    assert candidate(2) == 2\n",
        "entry_point": "positive",
    }
    program = (
        "def positive(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x\n"
    )
    assert (await CodeReward()(task, program)).reward == 1.0
