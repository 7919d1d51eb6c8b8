"""How many threads the engine's forwards use: chosen by timing its own decode steps.

On an idle machine every core helps; beside another busy process (a browser, an IDE, a second
run) a decode step's many small parallel regions each wait at a barrier for a thread the OS has
descheduled, and one thread can be faster than two. The load cannot be read cheaply and
reliably, so the engine measures: now and then two steps run at the other thread count, and
the count whose steps are faster (a running mean of the steps' time ratio, the switch's own
step left out) is kept.

Only the engine's own thread changes (OpenMP's thread count is per calling thread), but torch
also keeps the last count set as the default of threads that have not used torch yet: the
trainer therefore sets its own (`in_threads`) rather than inherit the engine's.

Switching must not change a result, or seeded runs would depend on timing: the engine checks
at start that a prefill and a decode step give the same bits at 1 thread and at the most
(`ThreadTuner.verify`) and keeps a fixed count where they do not (`tests/backend/test_threads.py`
checks the engine's tokens and logprobs at 1 and 2 threads too).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable

import torch

__all__ = [
    "OwnThreads",
    "ThreadTuner",
    "in_own_thread",
    "in_threads",
    "set_threads",
    "usable_cores",
]

log = logging.getLogger(__name__)


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask), capped by torch's thread count (so
    OMP_NUM_THREADS or `torch.set_num_threads` still set the most the engine uses)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, torch.get_num_threads()))


class ThreadTuner:
    """Picks the engine thread's intra-op thread count between 1 and `most`.

    Every `explore_every` steps (more often while the two are close) two steps run at the other
    count. The first pays for the switch (a sleeping OpenMP thread wakes, caches refill): timed
    against the current count it made two threads look no faster than one on an idle machine,
    and the engine stayed at one thread, 18 % slower. The second step's time over the last step
    at the current count (same rows) updates a running mean of the log time ratio, and the
    other count takes over once it is the faster by `margin` over at least `min_samples`
    comparisons. Steps whose row count differs from that step's are not compared.
    """

    def __init__(
        self,
        most: int,
        *,
        fixed: bool = False,
        explore_every: int = 24,
        margin: float = 0.05,
        smoothing: float = 0.3,
        min_samples: int = 3,
    ) -> None:
        self.most = max(1, most)
        self.fixed = fixed
        self.current = self.most
        self.explore_every = explore_every
        self.margin = math.log1p(margin)
        self.smoothing = smoothing
        self.min_samples = min_samples
        self.log_ratio = 0.0  # running mean of log(other's step time / current's)
        self.switches = 0
        self._steps = 0
        self._samples = 0  # comparisons since the last switch
        self._previous: int | None = None  # the last step's thread count
        self._baseline: tuple[int, float] | None = None  # (rows, seconds) at the current count

    @property
    def other(self) -> int:
        return 1 if self.current != 1 else self.most

    def threads_for_next_step(self) -> int:
        """The count the next decode step runs at (set it in the engine's thread)."""
        if self.fixed or self.most == 1:
            return self.current
        self._steps += 1
        close = abs(self.log_ratio) < 2 * self.margin
        every = max(3, self.explore_every // 3 if close else self.explore_every)
        return self.other if self._steps % every in (0, 1) else self.current

    def verify(self, compute: Callable[[], torch.Tensor]) -> None:
        """Fix the count unless `compute` (a forward on the engine's path, run in the engine's
        thread) gives the same bits at 1 thread and at the most."""
        if self.fixed or self.most == 1:
            return
        results = []
        for threads in (1, self.most):
            set_threads(threads)
            results.append(compute())
        set_threads(self.current)
        if not torch.equal(results[0], results[1]):
            self.fixed = True
            log.warning(
                "the model's logits differ at 1 and %d threads here: the engine keeps %d",
                self.most,
                self.current,
            )

    def record(self, threads: int, rows: int, seconds: float) -> None:
        """One decode step's wall time; may switch the current count."""
        previous, self._previous = self._previous, threads
        if threads == self.current:
            self._baseline = (rows, seconds)
            return
        if threads != self.other or previous != threads:  # the switch's own step
            return
        if self._baseline is None or self._baseline[0] != rows:
            return
        ratio = math.log(max(seconds, 1e-9) / max(self._baseline[1], 1e-9))
        self.log_ratio += self.smoothing * (ratio - self.log_ratio)
        self._samples += 1
        if self.log_ratio < -self.margin and self._samples >= self.min_samples:
            self.current = self.other
            self.log_ratio = -self.log_ratio  # the same evidence, seen from the new count
            self.switches += 1
            self._samples = 0
            self._baseline = (rows, seconds)


def set_threads(threads: int) -> None:
    """The calling thread's intra-op thread count (a no-op if it is already that)."""
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def in_threads[T](threads: int, work: Callable[..., T], *args: object) -> T:
    """`work(*args)` at `threads` threads (for a pool thread, whose torch default may be the
    count the engine set last)."""
    set_threads(threads)
    return work(*args)


class OwnThreads:
    """Threads that end with their work (`run`), remembered until they end so that a backend's
    `close` can wait for them (`join`): one still in torch when the interpreter exits (its
    caller cancelled, say) runs while C++ tears down, and the process can abort (`terminate
    called without an active exception`, exit 134).

    libgomp gives every thread that runs a parallel region a pool of worker threads for that
    thread's lifetime, and while a process holds more of them than it has cores it cuts every
    wait's spinning to 100 (GOMP_SPINCOUNT's documented throttle). `asyncio.to_thread`'s
    long-lived pool threads each kept a pool, so a run was always throttled: a decode step at
    36 rows took 1.6x its unthrottled time (`docs/results.md`, 2026-11-25 12:00). A thread
    that ends frees its pool."""

    def __init__(self) -> None:
        self._alive: set[threading.Thread] = set()
        self._lock = threading.Lock()

    async def run[T](self, work: Callable[..., T], *args: object, **kwargs: object) -> T:
        """`work(*args, **kwargs)` on a thread of its own; a caller cancelled while it runs
        leaves it to finish (it is then ignored, even once the caller's loop has closed)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def settle(result: T | None, error: BaseException | None) -> None:
            if future.done():  # the caller was cancelled; the work still ran to its end
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)  # type: ignore[arg-type]

        def body() -> None:
            try:
                result, error = work(*args, **kwargs), None
            except BaseException as caught:  # handed to the awaiting caller
                result, error = None, caught
            finally:
                with self._lock:
                    self._alive.discard(threading.current_thread())
            with contextlib.suppress(RuntimeError):  # the caller's loop has closed
                loop.call_soon_threadsafe(settle, result, error)

        thread = threading.Thread(target=body, name="art-rlvr-torch", daemon=True)
        with self._lock:
            self._alive.add(thread)
        thread.start()
        return await future

    @property
    def alive(self) -> int:
        with self._lock:
            return len(self._alive)

    def join(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` in all for the threads still running; True if none is."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            threads = list(self._alive)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return self.alive == 0


async def in_own_thread[T](work: Callable[..., T], *args: object, **kwargs: object) -> T:
    """`work(*args, **kwargs)` on a thread that ends with it, not waited for at close (see
    `OwnThreads`, which a backend keeps for its own)."""
    return await OwnThreads().run(work, *args, **kwargs)
