"""MATH-style answers, compared by mathematical equivalence with math-verify.

math-verify (sympy underneath) can take unbounded time on a hostile answer such as
`9^{9^{9^{9}}}`, and its own timeouts use `signal.alarm`, which only works on a main thread.
So every check runs in a small pool of long-lived worker processes, with math-verify's own
timeouts off and a hard wall-clock deadline here: a worker that misses it is SIGKILLed and
replaced, and the answer scores 0 with "verifier timed out" (counted in `metrics["timeout"]`).
The event loop only waits on pipes, so one pathological answer never delays the others beyond
the pool's width.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import json
import os
import subprocess
import sys
import threading
import weakref

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from art_rlvr.core.types import Record, Score
from art_rlvr.scenarios.rewards.base import RewardConfigError, first_error

_MAX_ANSWER_CHARS = 8_000  # the final answer sits at the end; keep the tail
_STARTUP_TIMEOUT_S = 120.0

# Runs in each worker: one JSON request per line in, one JSON result per line out.
_WORKER = r"""
import json, logging, sys
logging.disable(logging.CRITICAL)
from math_verify import parse, verify
sys.stdout.write('{"ready": true}\n')
sys.stdout.flush()
for line in sys.stdin:
    request = json.loads(line)
    try:
        gold = parse(request["gold"], parsing_timeout=None)
        pred = parse(request["pred"], parsing_timeout=None)
        ok = bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None)
        result = {
            "ok": bool(ok),
            "parsed": bool(pred),
            "gold": str(gold[-1]) if gold else "",
            "pred": str(pred[-1]) if pred else "",
        }
    except Exception as error:
        result = {"ok": False, "parsed": False, "error": repr(error)[:300]}
    result["id"] = request["id"]
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
"""


def gold_text(gold: str) -> str:
    """Dataset answers are bare LaTeX ("\\frac{1}{2}"); math-verify wants it delimited."""
    text = gold.strip()
    if any(mark in text for mark in ("$", "\\boxed", "\\(", "\\[")):
        return text
    return f"${text}$"


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class VerifierTimeout(Exception):
    """A check missed its deadline; its worker has been killed."""


class _Worker:
    """One math-verify process speaking JSON lines over pipes (read without blocking)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "HOME")},
            start_new_session=True,
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.fd = self.proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.buffer = b""
        self.ready = False

    async def read_line(self, timeout: float) -> bytes:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while b"\n" not in self.buffer:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise VerifierTimeout
            readable = loop.create_future()
            loop.add_reader(self.fd, _resolve, readable)
            try:
                await asyncio.wait_for(readable, remaining)
            except TimeoutError:
                raise VerifierTimeout from None
            finally:
                loop.remove_reader(self.fd)
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                raise EOFError("math-verify worker exited")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    async def ask(self, request: dict[str, object], timeout: float) -> dict[str, object]:
        if not self.ready:  # a worker that cannot start is a broken install, not a 0 score
            try:
                json.loads(await self.read_line(_STARTUP_TIMEOUT_S))
            except (EOFError, VerifierTimeout, ValueError) as error:
                raise RuntimeError(
                    f"math-verify worker did not start ({error!r}); is math-verify installed?"
                ) from None
            self.ready = True
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        return json.loads(await self.read_line(timeout))

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:  # pipes, as the pool opens them
                with contextlib.suppress(OSError):
                    stream.close()


class VerifierPool:
    """Up to `size` checks at once per event loop; idle workers are shared and kept warm."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    def _take(self, fresh: bool = False) -> _Worker:
        """An idle live worker, else a new one (`fresh`: always a new one)."""
        while not fresh:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            if worker is None:
                break
            if worker.proc.poll() is None:
                return worker
            self._discard(worker)
        worker = _Worker()
        with self._lock:
            self._all.add(worker)
        return worker

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            self._idle.append(worker)

    def _discard(self, worker: _Worker) -> None:
        with self._lock:
            self._all.discard(worker)
        worker.kill()

    async def check(self, gold: str, pred: str, timeout: float) -> dict[str, object]:
        """math-verify's verdict, or VerifierTimeout; a crashed worker is retried once."""
        gate = self._gates.setdefault(asyncio.get_running_loop(), asyncio.Semaphore(self.size))
        async with gate:
            for attempt in (1, 2):
                worker = self._take(fresh=attempt == 2)
                try:
                    answer = await worker.ask(
                        {"id": next(self._ids), "gold": gold, "pred": pred}, timeout
                    )
                except (EOFError, OSError, ValueError) as error:
                    self._discard(worker)
                    if attempt == 2:
                        return {"ok": False, "parsed": False, "error": f"worker died: {error}"}
                    continue
                except BaseException:  # timeout or cancellation: its state is unknown
                    self._discard(worker)
                    raise
                self._give_back(worker)
                return answer
        raise AssertionError("unreachable")

    async def warm_up(self) -> None:
        """Start every worker now (each imports sympy, ~1-2 s) so timings exclude that."""
        await asyncio.gather(
            *(self.check("$1$", "$1$", _STARTUP_TIMEOUT_S) for _ in range(self.size))
        )

    def close(self) -> None:
        with self._lock:
            workers, self._all, self._idle = list(self._all), set(), []
        for worker in workers:
            worker.kill()


_pools: dict[int, VerifierPool] = {}


def verifier_pool(size: int) -> VerifierPool:
    if size not in _pools:
        _pools[size] = VerifierPool(size)
    return _pools[size]


@atexit.register
def _close_pools() -> None:
    for pool in _pools.values():
        pool.close()


class MathReward(BaseModel):
    """Reward 1 when the completion's final answer is mathematically equal to the gold."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    answer_field: str = "answer"
    timeout_s: float = Field(default=5.0, gt=0, le=120)
    workers: int = Field(default_factory=lambda: max(2, os.cpu_count() or 2), ge=1, le=64)
    reveal_answer_in_feedback: bool = True

    async def __call__(self, x: Record, y: str) -> Score:
        y = y if isinstance(y, str) else ""
        gold = str(x[self.answer_field])
        boxed = float("\\boxed" in y)
        if not y.strip():
            return _score(0.0, "empty answer", parsed=0.0, fmt=0.0)
        pool = verifier_pool(self.workers)
        try:
            verdict = await pool.check(gold_text(gold), y[-_MAX_ANSWER_CHARS:], self.timeout_s)
        except VerifierTimeout:
            return _score(
                0.0,
                f"verifier timed out after {self.timeout_s:g} s; scored 0",
                parsed=0.0,
                fmt=boxed,
                timeout=1.0,
            )
        expected = f", expected {gold}" if self.reveal_answer_in_feedback else ""
        if "error" in verdict:
            return _score(0.0, f"verifier error: {verdict['error']}", 0.0, boxed, error=1.0)
        if not verdict["parsed"]:
            return _score(0.0, "no final answer found (give it as \\boxed{...})", 0.0, boxed)
        if verdict["ok"]:
            return _score(1.0, f"correct: read the answer as {verdict['pred']}", 1.0, boxed)
        return _score(0.0, f"wrong: read the answer as {verdict['pred']}{expected}", 1.0, boxed)


def _score(
    reward: float,
    feedback: str,
    parsed: float,
    fmt: float,
    timeout: float = 0.0,
    error: float = 0.0,
) -> Score:
    return Score(
        reward=reward,
        feedback=feedback,
        metrics={
            "correct": float(reward >= 1.0),
            "parsed": parsed,
            "format": fmt,
            "timeout": timeout,
            "verifier_error": error,
        },
    )


def math(**params) -> MathReward:
    try:
        return MathReward(**params)
    except ValidationError as error:
        raise RewardConfigError(f"bad parameters for reward 'math': {first_error(error)}") from None
