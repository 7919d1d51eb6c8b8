"""Code rewards: run the completion against the task's tests in a throwaway sandbox.

This module turns a completion into a program (the fenced code, joined with the prompt's
imports and signature), splits the tests into units, and turns the judge's reports into a
score and one line of feedback. The sandbox itself (namespaces, limits, the launcher) is in
`scenarios.rewards.sandbox`: the program runs in one process, the tests in another that calls
its functions with plain data and compares what comes back, so the program cannot forge a pass.
"""

from __future__ import annotations

import ast
import asyncio
import os
import re
import signal
import weakref
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from art_rlvr.core.types import Record, Score
from art_rlvr.scenarios.rewards.base import RewardConfigError, first_error
from art_rlvr.scenarios.rewards.sandbox import (
    RunResult,
    SandboxChoice,
    SandboxLimits,
    Tests,
    choose_sandbox,
    run_sandboxed,
    sandbox_unavailable_reason,
)

_MAX_COMPLETION_CHARS = 100_000
SANDBOX_STOPS = ("crashed", "memory", "output_limit")  # the sandbox stopped it (not a timeout)
_limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)


def _limiter(concurrency: int) -> asyncio.Semaphore:
    """One semaphore per event loop and width: sandboxes are CPU-bound processes."""
    per_loop = _limiters.setdefault(asyncio.get_running_loop(), {})
    return per_loop.setdefault(concurrency, asyncio.Semaphore(concurrency))


# --- turning a completion into a program ------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def _defines(source: str, name: str) -> bool:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name
        for node in tree.body
    )


def extract_code(completion: str, entry_point: str | None = None) -> str:
    """The code in a completion: a fenced block (the one defining the entry point if any), an
    unterminated fence cut off by max_tokens, or the raw text."""
    blocks = [b for b in _FENCE.findall(completion) if b.strip()]
    if not blocks:
        return completion
    if entry_point:
        defining = [b for b in blocks if _defines(b, entry_point)]
        if defining:
            return defining[-1]
    return blocks[0]


def build_program(prompt: str, code: str, entry_point: str | None) -> str:
    """Whole function -> prompt (for its imports) then code; a body -> prompt + code."""
    if entry_point is None or not prompt:
        return code
    if _defines(code, entry_point):
        return prompt + "\n\n" + code.strip("\n") + "\n"
    joined = prompt + code
    if not _compiles(joined):
        indented = prompt + "".join(
            "    " + line if line.strip() else line for line in code.splitlines(keepends=True)
        )
        # else the harness reports the syntax error against what the model wrote
        return indented if _compiles(indented) else joined
    return joined


def _compiles(source: str) -> bool:
    try:
        compile(source, "solution.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


@lru_cache(maxsize=1024)
def split_tests(test: str, entry_point: str | None) -> tuple[str, ...]:
    """Test units: each top-level statement of `check(candidate)` (or of the test file, when it
    has no `check`), so a failure says which test failed and partial credit is possible."""
    fallback = ("check(candidate)",) if entry_point else ()
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return fallback
    check = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None
    )
    if check is None:
        return fallback
    params = [a.arg for a in check.args.args]
    if params != ["candidate"] or any(isinstance(n, ast.Return) for n in ast.walk(check)):
        return fallback
    units = tuple(ast.unparse(stmt) for stmt in check.body if not _is_docstring(stmt))
    return units or fallback


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


# --- the reward -------------------------------------------------------------------------------


def describe(
    result: RunResult, units: tuple[str, ...], show_test: bool = True
) -> tuple[int, str, str]:
    """(tests passed, failure kind, feedback) from a run."""
    n_units = len(units)
    reports = result.reports
    ran = [r for r in reports if r.get("kind") == "unit"]
    passed = sum(1 for r in ran if r.get("ok"))
    done = any(r.get("kind") == "done" for r in reports)
    first_fail = next((r for r in ran if not r.get("ok")), None)
    early = next(
        (
            r
            for r in reports
            if r.get("kind") in ("syntax_error", "definition_error", "missing_function")
        ),
        None,
    )
    progress = f"{passed}/{n_units} tests passed"
    if result.output_overflow:
        return passed, "output_limit", f"output limit exceeded ({progress} before it was stopped)"
    if result.timed_out or result.exit_code in (124, 128 + signal.SIGXCPU):
        return passed, "timeout", f"timeout ({progress} before it was stopped)"
    if result.over_memory_mb:
        return (
            passed,
            "memory",
            (
                f"memory limit: the solution's processes held {result.over_memory_mb:.0f} MB "
                f"together, over the run's limit ({progress})"
            ),
        )
    if result.oom_kills:
        return (
            passed,
            "memory",
            (
                "memory limit: the kernel killed a process of the solution for the run's memory "
                f"limit ({progress})"
            ),
        )
    gone = next((r for r in (early, first_fail) if r and r.get("failure") == "exited"), None)
    if gone is not None:
        return passed, "crashed", _ended(reports, progress, result)
    if early is not None:
        kind = str(early["kind"])
        label = {
            "syntax_error": "syntax error",
            "definition_error": "runtime error while defining the solution",
            "missing_function": "missing function",
        }[kind]
        return passed, kind, f"{label}: {early.get('error', '')}"
    if done and first_fail is None and passed == n_units:
        return passed, "passed", f"all {n_units} tests passed"
    if first_fail is not None:
        error = str(first_fail.get("error", ""))
        at = first_fail.get("index", 0)
        if not isinstance(at, int | float | str):
            raise TypeError(f"a sandbox report's index is {type(at).__name__}")
        index = int(at)
        which = f"test {index + 1} of {n_units}"
        if show_test and 0 <= index < n_units:
            which += f" `{_shorten(units[index])}`"
        if first_fail.get("failure") == "memory":
            return passed, "memory", f"memory limit: {which} raised {error} ({progress})"
        if first_fail.get("failure") == "error":
            return passed, "runtime_error", f"runtime error in {which}: {error} ({progress})"
        detail = f": {error}" if error and error != "AssertionError" else ""
        return passed, "wrong_answer", f"wrong answer: {which} failed{detail} ({progress})"
    code = result.exit_code
    last = [line.strip() for line in result.stderr_tail.splitlines() if line.strip()]
    said = f"; stderr: {_shorten(last[-1])}" if last else ""
    if code is not None and code > 128:
        return (
            passed,
            "crashed",
            f"crashed: killed by {_signal_name(code - 128)} ({progress}){said}",
        )
    return passed, "crashed", f"exited before the tests finished (exit {code}; {progress}){said}"


def _signal_name(number: int) -> str:
    return signal.Signals(number).name if number in signal.valid_signals() else str(number)


def _ended(reports: list[dict], progress: str, result: RunResult) -> str:
    """Feedback for a solution's process that ended before the tests did."""
    status = next((r.get("status") for r in reports if r.get("kind") == "solution_exit"), None)
    last = [line.strip() for line in result.stderr_tail.splitlines() if line.strip()]
    said = f"; output: {_shorten(last[-1])}" if last else ""
    if isinstance(status, int) and os.WIFSIGNALED(status):
        name = _signal_name(os.WTERMSIG(status))
        return f"crashed: the solution's process was killed by {name} ({progress}){said}"
    code = os.WEXITSTATUS(status) if isinstance(status, int) else "?"
    return (
        f"exited before the tests finished (the solution's process exited {code}; {progress}){said}"
    )


def _shorten(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class CodeReward(BaseModel):
    """Reward 1 when every test unit passes (or the fraction passed, with partial_credit)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_field: str = "prompt"
    test_field: str = "test"
    entry_point_field: str | None = "entry_point"
    partial_credit: bool = False
    show_failed_test: bool = True
    # a run is partly kernel work (namespaces, mounts, teardown): 2 per core beats 1 per core
    concurrency: int = Field(default_factory=lambda: 2 * (os.cpu_count() or 1), ge=1)
    limits: SandboxLimits = SandboxLimits()
    sandbox: SandboxChoice = "auto"  # root namespaces when root, else bubblewrap

    async def __call__(self, x: Record, y: str) -> Score:
        y = y if isinstance(y, str) else ""
        entry = str(x[self.entry_point_field]) if self.entry_point_field else None
        test = str(x[self.test_field])
        units = split_tests(test, entry)
        if not y.strip():
            return _zero("no code in the answer", "no_code", len(units))
        if len(y) > _MAX_COMPLETION_CHARS:
            return _zero("answer too long to run", "no_code", len(units))
        code = extract_code(y.replace("\x00", ""), entry)
        prompt = str(x.get(self.prompt_field, ""))
        program = build_program(prompt, code, entry)
        tests = Tests(support=prompt, test=test, units=list(units), entry_point=entry)
        async with _limiter(self.concurrency):
            result = await run_sandboxed(program, tests, self.limits, choose_sandbox(self.sandbox))
        passed, kind, feedback = describe(result, units, self.show_failed_test)
        total = max(len(units), 1)
        correct = kind == "passed"
        reward = 1.0 if correct else (passed / total if self.partial_credit else 0.0)
        return Score(
            reward=reward,
            feedback=feedback,
            metrics={
                "correct": float(correct),
                "tests_passed": float(passed),
                "tests_total": float(len(units)),
                "pass_fraction": passed / total,
                "format": float("```" in y),
                "timeout": float(kind == "timeout"),
                "sandbox_error": float(kind in SANDBOX_STOPS),
            },
        )


def _zero(feedback: str, kind: str, n_units: int) -> Score:
    return Score(
        reward=0.0,
        feedback=feedback,
        metrics={
            "correct": 0.0,
            "tests_passed": 0.0,
            "tests_total": float(n_units),
            "pass_fraction": 0.0,
            "format": 0.0,
            "timeout": 0.0,
            "sandbox_error": 0.0,
        },
    )


def code(**params) -> CodeReward:
    try:
        reward = CodeReward(**params)
    except ValidationError as error:
        raise RewardConfigError(f"bad parameters for reward 'code': {first_error(error)}") from None
    reason = sandbox_unavailable_reason(reward.sandbox)
    if reason is not None:
        raise RewardConfigError(f"reward 'code': {reason}")
    return reward
