"""Batched sampling on one transformers model: where CPU throughput comes from.

Concurrent requests are coalesced into one left-padded batch, prefilled together and decoded
step by step with a shared KV cache; finished rows are dropped from the cache so the batch
shrinks as it goes. Each row keeps its own temperature, top-p, stop strings, token budget,
(optionally) seed and grammar. Sampling log-probabilities are those of the untempered model
distribution, the same quantity the trainer recomputes, so importance ratios compare like with
like. Under a grammar (constrained decoding) the forbidden tokens' logits are -inf before both
sampling and the logprob, so a row's logprob is that of the untempered distribution
renormalised over the allowed tokens (a forced token gets 0.0): what vLLM V1 reports too, as it
applies the grammar bitmask to the logits its sampler takes raw logprobs from. The trainer
recomputes unmasked logprobs, so on constrained tokens the importance ratio is not 1 even on
policy; ART on vLLM has the same property.

The engine runs its own thread; torch releases the GIL in its kernels, so the asyncio server
stays responsive. The `model_lock` is shared with the trainer so that weights never change
under a running batch.

Other torch work on the same model (a training step, a checkpoint save) runs on that thread
too (`run`): between batches, with gradients on. libgomp gives each thread that runs a
parallel region its own pool of workers for the thread's lifetime, and while a process holds
more of them than it has cores it cuts every wait's spinning to 100; a training step on a
second thread, beside the engine's live pool, took 1.4x its time (docs/results.md,
2026-11-27). One torch thread keeps one pool.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import queue
import random
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import AbstractContextManager

import torch
from transformers import DynamicCache

from art_rlvr.backend.engine import invariant
from art_rlvr.backend.engine.constrained import Grammars
from art_rlvr.backend.engine.decode_batch import (
    MIN_SHARED_PREFIX,
    Batch,
    Job,
    Request,
    Row,
    drop_cancelled,
    finish,
    join,
    left_padded,
    retire,
    shared_prefix,
    spare_cache,
)
from art_rlvr.backend.engine.sampler import sample, sample_tokens
from art_rlvr.backend.engine.types import (
    Completion,
    ContextLengthError,
    EngineClosed,
    EngineStats,
    SamplingParams,
    TokenEvent,
    embedding_weight,
    eos_ids,
)
from art_rlvr.backend.runtime.malloc import release_free_memory
from art_rlvr.backend.runtime.threads import ThreadTuner, set_threads, usable_cores

__all__ = [
    "Completion",
    "ContextLengthError",
    "EngineClosed",
    "GenerationEngine",
    "SamplingParams",
    "TokenEvent",
    "sample_tokens",
]

log = logging.getLogger(__name__)

# how long `close` waits for a running job (a train step on a loaded CPU can take minutes)
CLOSE_WAIT_S = 600.0


class GenerationEngine:
    """Owns a causal LM (possibly a peft model) and serves batched sampling requests."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        model_lock: threading.RLock,
        select_adapter: Callable[[str | None], AbstractContextManager[None]],
        max_batch_rows: int = 64,
        coalesce_seconds: float = 0.03,
        seed: int = 0,
        max_context: int = 2048,
        batch_invariant: bool | None = None,
        threads: int | None = None,
        max_threads: int | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.model_lock = model_lock
        self.select_adapter = select_adapter
        self.max_batch_rows = max_batch_rows
        self.coalesce_seconds = coalesce_seconds
        self.max_context = max_context
        self.device = next(model.parameters()).device
        # a row's tokens independent of its batch: on CPU by default (see invariant.py)
        wanted = self.device.type == "cpu" if batch_invariant is None else batch_invariant
        self.batch_invariant = wanted and invariant.install(model)
        self._flags = {invariant.FLAG: True} if self.batch_invariant else {}
        # finished rows kept as padding up to this multiple (decode_batch.retire)
        self._multiple = invariant.ROW_MULTIPLE if self.batch_invariant else 1
        self.eos_ids = eos_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.stats = EngineStats()
        vocab_size = embedding_weight(model, "output").shape[0]
        self.grammars = Grammars(tokenizer, vocab_size, self.eos_ids)
        self._rng = random.Random(seed)  # the uniform draws of rows without a seed
        # the engine thread's thread count: `threads`, or chosen by timing its steps (on CPU)
        self.tuner = ThreadTuner(
            threads or max_threads or usable_cores(),
            fixed=threads is not None or self.device.type != "cpu",
        )
        self._queue: queue.Queue[Request | Job | None] = queue.Queue()
        self._pending: list[Request] = []
        self._jobs: collections.deque[Job] = collections.deque()
        self._draining = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._worker, name="art-rlvr-engine", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- public API
    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, n: int = 1, adapter: str | None
    ) -> list[Completion]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Completion]] = loop.create_future()

        def done(result: list[Completion] | BaseException) -> None:
            def settle() -> None:
                if future.done():
                    return
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)

            with contextlib.suppress(RuntimeError):  # the caller's loop has closed
                loop.call_soon_threadsafe(settle)

        request = await self._submit(prompt_ids, params, n, adapter, done, None)
        try:
            return await future
        except asyncio.CancelledError:
            request.cancelled = True  # its rows leave the batch before the next step
            raise

    async def stream(
        self, prompt_ids: list[int], params: SamplingParams, *, n: int = 1, adapter: str | None
    ) -> AsyncGenerator[TokenEvent | list[Completion], None]:
        """Each token as it is sampled, then the finished completions (the same ones
        `generate` returns). A bad request raises at the first `anext`, before any token."""
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[TokenEvent | list[Completion] | BaseException] = asyncio.Queue()

        def push(item: TokenEvent | list[Completion] | BaseException) -> None:
            with contextlib.suppress(RuntimeError):  # the reader's loop has closed
                loop.call_soon_threadsafe(items.put_nowait, item)

        request = await self._submit(prompt_ids, params, n, adapter, push, push)
        try:
            while True:
                item = await items.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, list):
                    return
        finally:  # cancelled, closed or done: an abandoned stream stops generating
            request.cancelled = True

    async def _submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        n: int,
        adapter: str | None,
        done: Callable[[list[Completion] | BaseException], None],
        on_token: Callable[[TokenEvent], None] | None,
    ) -> Request:
        if self._closed:  # nothing would take it off the queue
            raise EngineClosed("engine closed")
        if not prompt_ids:
            raise ValueError("empty prompt")
        if len(prompt_ids) + params.max_tokens > self.max_context:
            raise ContextLengthError(
                f"prompt of {len(prompt_ids)} tokens + max_tokens {params.max_tokens} exceeds "
                f"the context length {self.max_context}"
            )
        grammar = (
            await asyncio.to_thread(self.grammars.compile, params.grammar)
            if params.grammar is not None
            else None
        )
        request = Request(adapter, list(prompt_ids), params, n, done, grammar, on_token)
        self._queue.put(request)
        return request

    async def run[T](self, work: Callable[..., T], *args: object, threads: int | None = None) -> T:
        """`work(*args)` on the engine's thread with the model to itself: the running batch
        finishes first and no new rows start until it returns; gradients are on, at `threads`
        threads (None: the engine's). A caller cancelled before it starts skips it; once
        started it runs to its end."""
        if self._closed:
            raise EngineClosed("engine closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def settle(result: T, error: BaseException | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        def done(result: T, error: BaseException | None) -> None:
            with contextlib.suppress(RuntimeError):  # the caller's loop has closed
                loop.call_soon_threadsafe(settle, result, error)

        job = Job(functools.partial(work, *args), done, threads)
        self._queue.put(job)
        try:
            return await future
        except asyncio.CancelledError:
            job.cancelled = True
            raise

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Stop the engine: requests fail, a job already running (a train step) finishes
        first; waits up to `wait_s` for its thread, which must not be in torch when the
        interpreter exits (a process can abort then: exit 134)."""
        self._closed = True
        self._queue.put(None)
        deadline = time.monotonic() + wait_s
        while self._thread.is_alive() and (left := deadline - time.monotonic()) > 0:
            self._thread.join(timeout=min(left, 30))
            if self._thread.is_alive():
                log.warning("engine close: waiting for the job it runs (%.0f s left)", left)
        if not self._thread.is_alive():  # whatever was queued after the worker stopped
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    self._take(item)
            self._fail(None, EngineClosed("engine closed"))

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the model for training: running sequences finish, no new ones start."""
        self._draining.set()
        try:
            with self.model_lock:
                yield
        finally:
            self._draining.clear()

    # ---------------------------------------------------------------- worker
    def _worker(self) -> None:
        torch.set_grad_enabled(False)
        with self.model_lock:
            self.tuner.verify(self._probe_logits)
        set_threads(self.tuner.current)
        batch: Batch | None = None
        while True:
            try:
                if batch is None and self._jobs:
                    self._run_job(self._jobs.popleft())
                    continue
                if batch is None and not self._pending:
                    item = self._queue.get()
                    if item is None:
                        return
                    self._take(item)
                    if self._jobs:
                        continue
                    self._coalesce()
                elif not self._drain_queue():
                    self._fail(batch, EngineClosed("engine closed"))
                    return
                if batch is None:
                    if self._jobs or not self._pending:
                        continue
                    batch = self._open(self._pending[0].adapter)
                if not self._draining.is_set() and not self._jobs:
                    admitted = self._admit(batch)
                    if admitted:
                        try:
                            self._prefill(batch, admitted)
                        except Exception as error:  # not yet rows of the batch: fail them here
                            for request in admitted:
                                request.done(error)
                            raise
                self.stats.cancelled_requests += len(drop_cancelled(batch, self._multiple))
                if batch.rows:
                    self._timed_step(batch)
                self.stats.running_rows = len(batch.rows)
                if not batch.rows:
                    batch.stack.close()
                    batch = None
                    if not self._pending and self._queue.empty():
                        release_free_memory()  # idle: give the batch's freed memory back
            except Exception as error:  # a bad batch must not kill the server
                if batch is None and self._pending:  # could not even open: fail its requests
                    adapter = self._pending[0].adapter
                    doomed = [r for r in self._pending if r.adapter == adapter]
                    self._pending = [r for r in self._pending if r.adapter != adapter]
                    for request in doomed:
                        request.done(error)
                self._fail(batch, error)
                batch = None
                self.stats.running_rows = 0

    def _coalesce(self) -> None:
        """Let a burst of requests arrive so they share the first prefill: until no request
        has come for `coalesce_seconds`, the batch is full, or eight windows have passed.

        A GRPO step's 36 requests come through HTTP a few milliseconds apart; with a 4 ms
        window the first prefill took 3 to 7 of them and the rest joined a prefill and a
        decode step later, so the step ran one more decode step and one more prefill
        (docs/results.md 2026-11-27). The cap keeps a steady stream of arrivals from holding
        the first prefill back.
        """
        started = time.monotonic()
        last = started + 8 * self.coalesce_seconds
        deadline = min(started + self.coalesce_seconds, last)
        while sum(r.n for r in self._pending) < self.max_batch_rows:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return
            if item is None:
                self._queue.put(None)
                return
            self._take(item)
            deadline = min(time.monotonic() + self.coalesce_seconds, last)

    def _drain_queue(self) -> bool:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return True
            if item is None:
                return False
            self._take(item)

    def _take(self, item: Request | Job) -> None:
        if isinstance(item, Job):
            self._jobs.append(item)
        else:
            self._pending.append(item)

    def _run_job(self, job: Job) -> None:
        if job.cancelled:
            return
        set_threads(job.threads or self.tuner.current)
        try:
            with self.model_lock, torch.enable_grad():
                result = job.work()
        except Exception as error:  # the caller's to handle, not the engine's
            job.done(None, error)
        else:
            job.done(result, None)
        finally:
            set_threads(self.tuner.current)

    def _fail(self, batch: Batch | None, error: BaseException) -> None:
        requests = {id(r.request): r.request for r in batch.rows} if batch else {}
        if batch is not None:
            batch.stack.close()
        if isinstance(error, EngineClosed):
            requests |= {id(r): r for r in self._pending}
            self._pending.clear()
            while self._jobs:
                self._jobs.popleft().done(None, error)
        for request in requests.values():
            request.done(error)

    def _open(self, adapter: str | None) -> Batch:
        stack = contextlib.ExitStack()
        stack.enter_context(self.model_lock)
        if self.batch_invariant:
            invariant.hook_linears(self.model)  # LoRA layers added since the last batch
        try:
            stack.enter_context(self.select_adapter(adapter))
        except BaseException:
            stack.close()
            raise
        return Batch(adapter=adapter, stack=stack)

    def _admit(self, batch: Batch) -> list[Request]:
        """Pending requests for this batch's adapter, oldest first, while rows are free.

        A request for another adapter blocks younger ones, so it is served when the batch
        drains instead of waiting forever under constant load.
        """
        self._pending = [r for r in self._pending if not r.cancelled]
        room = self.max_batch_rows - len(batch.rows)
        admitted: list[Request] = []
        rest: list[Request] = []
        blocked = False
        for request in self._pending:
            if blocked or request.adapter != batch.adapter:
                blocked = True
                rest.append(request)
            elif request.n <= room or not (batch.rows or admitted):
                admitted.append(request)
                room -= request.n
            else:
                rest.append(request)
        self._pending = rest
        return admitted

    @torch.inference_mode()
    def _prefill(self, batch: Batch, requests: list[Request]) -> None:
        """Prefill each distinct prompt once, copy its KV cache to its rows, join the batch.

        GRPO sends `group_size` copies of each prompt (and `n > 1` asks for the same), so
        sharing the prefill removes most of its cost without changing any sampled token.
        Rows are ordered by prompt length: prompts of one length pad alike, so on the
        batch-invariant path each group of rows that attend alike is a contiguous slice of the
        batch, which attention reads in place instead of gathering its keys and values at every
        layer of every step (a 36-row decode step about 8 % faster, docs/results.md 2026-11-27).
        """
        requests = sorted(requests, key=lambda r: len(r.prompt_ids))
        rows = [
            Row(
                request,
                i,
                rng=(
                    random.Random(f"{request.params.seed}:{i}")
                    if request.params.seed is not None
                    else self._rng
                ),
                matcher=self.grammars.matcher(request.grammar) if request.grammar else None,
            )
            for request in requests
            for i in range(request.n)
        ]
        for request in requests:
            batch.remaining[id(request)] = request.n
        unique: dict[tuple[int, ...], int] = {}
        for row in rows:
            unique.setdefault(tuple(row.request.prompt_ids), len(unique))
        prompts = [list(p) for p in unique]
        owner = torch.tensor(
            [unique[tuple(r.request.prompt_ids)] for r in rows], device=self.device
        )
        self.stats.prompt_tokens += sum(len(p) for p in prompts)
        self.stats.prefills += 1
        shared = shared_prefix(prompts) if len(prompts) > 1 else 0
        cache = spare_cache()
        if shared >= MIN_SHARED_PREFIX and not self.batch_invariant:
            self._prefill_prefix(prompts[0][:shared], len(prompts), cache)
            self.stats.prefix_tokens_saved += shared * (len(prompts) - 1)
        else:
            shared = 0
        ids, mask = left_padded([p[shared:] for p in prompts], self.pad_id, shared)
        input_ids = torch.tensor(ids, device=self.device)
        attention = torch.tensor(mask, device=self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions[:, shared:],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
            **self._flags,
        )
        cache.batch_select_indices(owner)
        logits = out.logits[owner, -1, :].float()
        join(batch, rows, cache, attention[owner], positions[owner][:, -1] + 1, logits)
        self.stats.max_batch_rows = max(self.stats.max_batch_rows, len(batch.rows))

    def _prefill_prefix(self, prefix: list[int], rows: int, cache: DynamicCache) -> None:
        """Run the prompts' common prefix (the chat template, the system prompt) once and copy
        its KV cache to every row; the suffixes then attend to it across a masked gap."""
        ids = torch.tensor([prefix], device=self.device)
        self.model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            position_ids=torch.arange(len(prefix), device=self.device)[None],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        cache.batch_select_indices(torch.zeros(rows, dtype=torch.long, device=self.device))

    @torch.inference_mode()
    def _probe_logits(self) -> torch.Tensor:
        """A prefill of six left-padded prompts and one decode step on the engine's path: what
        the tuner compares across thread counts."""
        prompts = [[10 + (7 * i + 13 * j) % 500 for j in range(3 + 2 * i)] for i in range(6)]
        ids, mask = left_padded(prompts, self.pad_id)
        attention = torch.tensor(mask, device=self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        cache, rows = spare_cache(), len(prompts)
        common = {"past_key_values": cache, "use_cache": True, **self._flags}
        first = self.model(
            input_ids=torch.tensor(ids, device=self.device),
            attention_mask=attention,
            position_ids=positions,
            logits_to_keep=1,
            **common,
        ).logits[:, -1]
        following = self.model(
            input_ids=first.argmax(-1)[:, None],
            attention_mask=torch.cat([attention, attention.new_ones((rows, 1))], dim=1),
            position_ids=positions[:, -1:] + 1,
            **common,
        ).logits[:, -1]
        return torch.cat([first, following])

    def _timed_step(self, batch: Batch) -> None:
        """One step at the thread count the tuner picks, timed for it."""
        threads = self.tuner.threads_for_next_step()
        set_threads(threads)
        started = time.perf_counter()
        rows = self._step(batch)
        if rows:  # the step that retires the last rows runs no forward: a tenth of a step
            self.tuner.record(threads, rows, time.perf_counter() - started)
        set_threads(self.tuner.current)  # what a prefill or the next batch starts with

    @torch.inference_mode()
    def _step(self, batch: Batch) -> int:
        """Sample one token for every row, retire finished rows, run the model once over the
        rest (and the padding rows `retire` keeps); how many rows that forward had (0: none
        left, no forward)."""
        assert batch.logits is not None and batch.attention is not None
        chosen, tokens, logps, tops = self._sample(batch)
        keep = self._record(batch, tokens, logps, tops)
        self.stats.completion_tokens += len(batch.rows)
        if len(keep) < len(batch.rows):
            retire(batch, keep, self._multiple)
            if not batch.rows:  # before indexing with an empty (float) tensor, which raises
                return 0
            chosen = chosen[torch.tensor(keep, device=chosen.device)]
        assert batch.attention is not None and batch.next_pos is not None
        batch.attention = torch.cat(
            [batch.attention, batch.attention.new_ones((batch.attention.shape[0], 1))], dim=1
        )
        out = self.model(
            input_ids=batch.forward_ids(chosen)[:, None],
            attention_mask=batch.attention,
            position_ids=batch.next_pos[:, None],
            past_key_values=batch.cache,
            use_cache=True,
            **self._flags,
        )
        batch.logits = out.logits[:, -1, :].float()
        batch.next_pos = batch.next_pos + 1
        return batch.attention.shape[0]

    def _sample(
        self, batch: Batch
    ) -> tuple[torch.Tensor, list[int], list[float], list[list[tuple[int, float]]] | None]:
        """Every row's token in one call (its own temperature, top-p and uniform draw), as a
        tensor for the next forward and as ints, with logprobs (and the most likely tokens
        where a row asked for them), for the rows."""
        logits = batch.live_logits()
        self.grammars.mask(logits, [r.matcher for r in batch.rows])
        top_k = max(r.request.params.top_logprobs for r in batch.rows)
        chosen, logps, top = sample(
            logits,
            temperature=batch.temperature,
            top_p=batch.top_p,
            uniform=batch.uniforms(),
            top_k=top_k,
        )
        tops = None
        if top is not None:
            values, ids = top[0].tolist(), top[1].tolist()
            tops = [list(zip(i, v, strict=True)) for i, v in zip(ids, values, strict=True)]
        return chosen, chosen.tolist(), logps.tolist(), tops

    def _record(
        self,
        batch: Batch,
        tokens: list[int],
        logps: list[float],
        tops: list[list[tuple[int, float]]] | None = None,
    ) -> list[int]:
        """Append each row's token; retire finished rows; the slots of the rows that go on."""
        keep: list[int] = []
        for slot, (row, token, logp) in enumerate(zip(batch.rows, tokens, logps, strict=True)):
            row.tokens.append(token)
            row.logprobs.append(logp)
            top: tuple[tuple[int, float], ...] = ()
            if tops is not None and (wanted := row.request.params.top_logprobs):
                top = tuple(tops[slot][:wanted])
                row.top.append(list(top))
            if row.matcher is not None and not row.matcher.accept_token(token):
                raise RuntimeError(f"grammar rejected its own token {token}")
            if row.request.on_token is not None:
                row.request.on_token(TokenEvent(row.index, token, logp, top))
            if finish(row, self.tokenizer, self.eos_ids):
                self._retire(batch, row)
            else:
                keep.append(slot)
        return keep

    def _retire(self, batch: Batch, row: Row) -> None:
        request = row.request
        batch.finished.setdefault(id(request), []).append(row)
        batch.remaining[id(request)] -= 1
        if batch.remaining[id(request)] == 0:
            done = sorted(batch.finished.pop(id(request)), key=lambda r: r.index)
            del batch.remaining[id(request)]
            self.stats.sequences += len(done)
            request.done([r.result for r in done if r.result is not None])
