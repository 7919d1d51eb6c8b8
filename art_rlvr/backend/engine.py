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
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import DynamicCache

from art_rlvr.backend.constrained import Grammars


class SamplingParams(BaseModel):
    """Per-request sampling settings, validated at the HTTP edge."""

    model_config = ConfigDict(frozen=True)

    max_tokens: int = Field(default=256, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=10.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False  # vLLM's option: keep sampling past end-of-sequence (benchmarks)
    grammar: str | None = None  # an xgrammar structural tag (JSON text): constrained decoding


@dataclass
class Completion:
    """One generated sequence: exact tokens, their logprobs, and the visible text."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" | "length"


@dataclass(frozen=True)
class TokenEvent:
    """One sampled token of choice `index`, reported as soon as it is sampled (streaming)."""

    index: int
    token_id: int
    logprob: float


@dataclass
class _Request:
    adapter: str | None
    prompt_ids: list[int]
    params: SamplingParams
    n: int
    done: Callable[[list[Completion] | BaseException], None]
    grammar: Any = None  # xgrammar.CompiledGrammar
    on_token: Callable[[TokenEvent], None] | None = None
    arrived: float = field(default_factory=time.monotonic)


@dataclass
class _Row:
    request: _Request
    index: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    generator: torch.Generator | None = None
    matcher: Any = None  # xgrammar.GrammarMatcher for a constrained row
    result: Completion | None = None


@dataclass
class _Batch:
    """The running batch: its rows, their shared KV cache, masks, positions and next logits."""

    adapter: str | None
    stack: contextlib.ExitStack
    rows: list[_Row] = field(default_factory=list)
    cache: DynamicCache | None = None
    attention: torch.Tensor | None = None
    next_pos: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    remaining: dict[int, int] = field(default_factory=dict)
    finished: dict[int, list[_Row]] = field(default_factory=dict)


def _left_pad_cache(cache: DynamicCache, width: int) -> None:
    for layer in cache.layers:
        if layer.keys is None or layer.keys.numel() == 0:
            continue
        missing = width - layer.keys.shape[-2]
        if missing > 0:
            pad = layer.keys.new_zeros((*layer.keys.shape[:-2], missing, layer.keys.shape[-1]))
            layer.keys = torch.cat([pad, layer.keys], dim=-2)
            layer.values = torch.cat([pad.clone(), layer.values], dim=-2)


def _left_pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - mask.shape[1]
    return mask if missing <= 0 else torch.cat([mask.new_zeros((mask.shape[0], missing)), mask], 1)


def _join(
    batch: _Batch,
    rows: list[_Row],
    cache: DynamicCache,
    attention: torch.Tensor,
    next_pos: torch.Tensor,
    logits: torch.Tensor,
) -> None:
    """Append freshly prefilled rows to the running batch (left-padding the shorter side)."""
    if batch.cache is None or not batch.rows:
        batch.rows, batch.cache, batch.attention = list(rows), cache, attention
        batch.next_pos, batch.logits = next_pos, logits
        return
    assert batch.attention is not None and batch.next_pos is not None and batch.logits is not None
    width = max(batch.attention.shape[1], attention.shape[1])
    _left_pad_cache(batch.cache, width)
    _left_pad_cache(cache, width)
    for old, new in zip(batch.cache.layers, cache.layers, strict=True):
        old.keys = torch.cat([old.keys, new.keys], dim=0)
        old.values = torch.cat([old.values, new.values], dim=0)
    batch.attention = torch.cat(
        [_left_pad_mask(batch.attention, width), _left_pad_mask(attention, width)], dim=0
    )
    batch.next_pos = torch.cat([batch.next_pos, next_pos])
    batch.logits = torch.cat([batch.logits, logits])
    batch.rows.extend(rows)


def _select(batch: _Batch, keep: list[int]) -> None:
    """Keep only rows `keep`; drop leading columns that no remaining row attends to."""
    batch.rows = [batch.rows[k] for k in keep]
    if not keep:
        batch.cache = batch.attention = batch.next_pos = batch.logits = None
        return
    assert batch.cache is not None and batch.attention is not None
    index = torch.tensor(keep, device=batch.attention.device)
    batch.cache.batch_select_indices(index)
    batch.attention = batch.attention[index]
    assert batch.next_pos is not None
    batch.next_pos = batch.next_pos[index]
    used = batch.attention.any(dim=0).nonzero()
    first = int(used[0]) if len(used) else 0
    if first > 0:
        batch.attention = batch.attention[:, first:]
        for layer in batch.cache.layers:
            if layer.keys is not None and layer.keys.numel():
                layer.keys = layer.keys[..., first:, :]
                layer.values = layer.values[..., first:, :]


@dataclass
class EngineStats:
    batches: int = 0
    sequences: int = 0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    max_batch_rows: int = 0
    prefix_tokens_saved: int = 0  # prompt tokens not recomputed thanks to a shared prefix


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
        coalesce_seconds: float = 0.004,
        seed: int = 0,
        max_context: int = 2048,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.model_lock = model_lock
        self.select_adapter = select_adapter
        self.max_batch_rows = max_batch_rows
        self.coalesce_seconds = coalesce_seconds
        self.max_context = max_context
        self.device = next(model.parameters()).device
        self.eos_ids = _eos_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.stats = EngineStats()
        vocab_size = model.get_output_embeddings().weight.shape[0]
        self.grammars = Grammars(tokenizer, vocab_size, self.eos_ids)
        self._generator = torch.Generator(device="cpu").manual_seed(seed)
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._pending: list[_Request] = []
        self._draining = threading.Event()
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

            loop.call_soon_threadsafe(settle)

        await self._submit(prompt_ids, params, n, adapter, done, None)
        return await future

    async def stream(
        self, prompt_ids: list[int], params: SamplingParams, *, n: int = 1, adapter: str | None
    ) -> AsyncIterator[TokenEvent | list[Completion]]:
        """Each token as it is sampled, then the finished completions (the same ones
        `generate` returns). A bad request raises at the first `anext`, before any token."""
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[TokenEvent | list[Completion] | BaseException] = asyncio.Queue()

        def push(item: TokenEvent | list[Completion] | BaseException) -> None:
            loop.call_soon_threadsafe(items.put_nowait, item)

        await self._submit(prompt_ids, params, n, adapter, push, push)
        while True:
            item = await items.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if isinstance(item, list):
                return

    async def _submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        n: int,
        adapter: str | None,
        done: Callable[[list[Completion] | BaseException], None],
        on_token: Callable[[TokenEvent], None] | None,
    ) -> None:
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
        self._queue.put(_Request(adapter, list(prompt_ids), params, n, done, grammar, on_token))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)

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
        batch: _Batch | None = None
        while True:
            try:
                if batch is None and not self._pending:
                    item = self._queue.get()
                    if item is None:
                        return
                    self._pending.append(item)
                    self._coalesce()
                elif not self._drain_queue():
                    self._fail(batch, RuntimeError("engine closed"))
                    return
                if batch is None:
                    batch = self._open(self._pending[0].adapter)
                if not self._draining.is_set():
                    admitted = self._admit(batch)
                    if admitted:
                        self._prefill(batch, admitted)
                if batch.rows:
                    self._step(batch)
                if not batch.rows:
                    batch.stack.close()
                    batch = None
            except Exception as error:  # a bad batch must not kill the server
                if batch is None and self._pending:  # could not even open: fail its requests
                    adapter = self._pending[0].adapter
                    doomed = [r for r in self._pending if r.adapter == adapter]
                    self._pending = [r for r in self._pending if r.adapter != adapter]
                    for request in doomed:
                        request.done(error)
                self._fail(batch, error)
                batch = None

    def _coalesce(self) -> None:
        """Let a burst of requests arrive so they share the first prefill."""
        deadline = time.monotonic() + self.coalesce_seconds
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return
            if item is None:
                self._queue.put(None)
                return
            self._pending.append(item)
            deadline = time.monotonic() + self.coalesce_seconds

    def _drain_queue(self) -> bool:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return True
            if item is None:
                return False
            self._pending.append(item)

    def _fail(self, batch: _Batch | None, error: BaseException) -> None:
        requests = {id(r.request): r.request for r in batch.rows} if batch else {}
        if batch is not None:
            batch.stack.close()
        if isinstance(error, RuntimeError) and str(error) == "engine closed":
            requests |= {id(r): r for r in self._pending}
            self._pending.clear()
        for request in requests.values():
            request.done(error)

    def _open(self, adapter: str | None) -> _Batch:
        stack = contextlib.ExitStack()
        stack.enter_context(self.model_lock)
        try:
            stack.enter_context(self.select_adapter(adapter))
        except BaseException:
            stack.close()
            raise
        return _Batch(adapter=adapter, stack=stack)

    def _admit(self, batch: _Batch) -> list[_Request]:
        """Pending requests for this batch's adapter, oldest first, while rows are free.

        A request for another adapter blocks younger ones, so it is served when the batch
        drains instead of waiting forever under constant load.
        """
        room = self.max_batch_rows - len(batch.rows)
        admitted: list[_Request] = []
        rest: list[_Request] = []
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
    def _prefill(self, batch: _Batch, requests: list[_Request]) -> None:
        """Prefill each distinct prompt once, copy its KV cache to its rows, join the batch.

        GRPO sends `group_size` copies of each prompt (and `n > 1` asks for the same), so
        sharing the prefill removes most of its cost without changing any sampled token.
        """
        rows = [
            _Row(
                request,
                i,
                generator=(
                    torch.Generator().manual_seed(request.params.seed + i)
                    if request.params.seed is not None
                    else None
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
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor(
            [[self.pad_id] * (width - len(p)) + p for p in prompts], device=self.device
        )
        attention = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device
        )
        self.stats.prompt_tokens += sum(len(p) for p in prompts)
        shared = _shared_prefix(prompts) if len(prompts) > 1 else 0
        cache = DynamicCache()
        if shared >= MIN_SHARED_PREFIX:
            self._prefill_prefix(prompts[0][:shared], len(prompts), cache)
            self.stats.prefix_tokens_saved += shared * (len(prompts) - 1)
        else:
            shared = 0
        suffixes = [p[shared:] for p in prompts]
        width = max(len(p) for p in suffixes)
        input_ids = torch.tensor(
            [[self.pad_id] * (width - len(p)) + p for p in suffixes], device=self.device
        )
        attention = torch.tensor(
            [[1] * shared + [0] * (width - len(p)) + [1] * len(p) for p in suffixes],
            device=self.device,
        )
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions[:, shared:],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        cache.batch_select_indices(owner)
        logits = out.logits[owner, -1, :].float()
        _join(batch, rows, cache, attention[owner], positions[owner][:, -1] + 1, logits)
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
    def _step(self, batch: _Batch) -> None:
        """Sample one token for every row, retire finished rows, run the model once."""
        assert batch.logits is not None and batch.attention is not None
        tokens, logps = self._sample(batch.logits, batch.rows)
        keep: list[int] = []
        for slot, row in enumerate(batch.rows):
            row.tokens.append(tokens[slot])
            row.logprobs.append(logps[slot])
            if row.matcher is not None and not row.matcher.accept_token(tokens[slot]):
                raise RuntimeError(f"grammar rejected its own token {tokens[slot]}")
            if row.request.on_token is not None:
                row.request.on_token(TokenEvent(row.index, tokens[slot], logps[slot]))
            if self._finish(row):
                self._retire(batch, row)
            else:
                keep.append(slot)
        self.stats.completion_tokens += len(batch.rows)
        if len(keep) < len(batch.rows):
            _select(batch, keep)
            tokens = [tokens[k] for k in keep]
        if not batch.rows:
            return
        assert batch.attention is not None and batch.next_pos is not None
        batch.attention = torch.cat(
            [batch.attention, batch.attention.new_ones((len(batch.rows), 1))], dim=1
        )
        out = self.model(
            input_ids=torch.tensor(tokens, device=self.device)[:, None],
            attention_mask=batch.attention,
            position_ids=batch.next_pos[:, None],
            past_key_values=batch.cache,
            use_cache=True,
        )
        batch.logits = out.logits[:, -1, :].float()
        batch.next_pos = batch.next_pos + 1

    def _retire(self, batch: _Batch, row: _Row) -> None:
        request = row.request
        batch.finished.setdefault(id(request), []).append(row)
        batch.remaining[id(request)] -= 1
        if batch.remaining[id(request)] == 0:
            done = sorted(batch.finished.pop(id(request)), key=lambda r: r.index)
            del batch.remaining[id(request)]
            self.stats.sequences += len(done)
            request.done([r.result for r in done if r.result is not None])

    def _sample(self, logits: torch.Tensor, rows: list[_Row]) -> tuple[list[int], list[float]]:
        self.grammars.mask(logits, [r.matcher for r in rows])
        uniform = torch.empty(len(rows), dtype=torch.float64)
        shared = [i for i, r in enumerate(rows) if r.generator is None]
        if shared:
            draws = torch.rand(len(shared), generator=self._generator, dtype=torch.float64)
            uniform[shared] = draws
        for i, row in enumerate(rows):
            if row.generator is not None:
                uniform[i] = torch.rand(1, generator=row.generator, dtype=torch.float64)
        choice = sample_tokens(
            logits,
            temperature=torch.tensor([r.request.params.temperature for r in rows]),
            top_p=torch.tensor([r.request.params.top_p for r in rows]),
            uniform=uniform,
        )
        chosen = torch.log_softmax(logits, dim=-1).gather(-1, choice[:, None])[:, 0]
        return choice.tolist(), chosen.tolist()

    def _finish(self, row: _Row) -> bool:
        params = row.request.params
        token = row.tokens[-1]
        if row.matcher is not None and row.matcher.is_terminated():
            row.result = self._complete(row, "stop", include_last=token not in self.eos_ids)
            return True
        if token in self.eos_ids and not params.ignore_eos:
            row.result = self._complete(row, "stop", include_last=False)
            return True
        if params.stop:
            text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
            cut = min((text.find(s) for s in params.stop if s in text), default=-1)
            if cut >= 0:
                row.result = Completion(row.tokens, row.logprobs, text[:cut], "stop")
                return True
        if len(row.tokens) >= params.max_tokens:
            row.result = self._complete(row, "length", include_last=True)
            return True
        return False

    def _complete(self, row: _Row, reason: str, *, include_last: bool) -> Completion:
        visible = row.tokens if include_last else row.tokens[:-1]
        text = self.tokenizer.decode(visible, skip_special_tokens=True)
        return Completion(list(row.tokens), list(row.logprobs), text, reason)


class ContextLengthError(ValueError):
    """The request cannot fit in the model's context window."""


def sample_tokens(
    logits: torch.Tensor, *, temperature: torch.Tensor, top_p: torch.Tensor, uniform: torch.Tensor
) -> torch.Tensor:
    """One token per row: argmax where the temperature is 0, else inverse-CDF sampling from
    the tempered, top-p-filtered distribution with the row's uniform draw in [0, 1).

    One uniform per row, not a Gumbel draw per vocabulary entry: 4x cheaper at 32 rows x 49k
    tokens. `1 - u` lies in (0, 1], so the search never lands on a token with zero mass."""
    temperature, top_p = temperature.to(logits.device), top_p.to(logits.device)
    scaled = logits / temperature.clamp(min=1e-5)[:, None]
    if bool((top_p < 1).any()):
        scaled = _top_p_filter(scaled, top_p)
    cdf = torch.softmax(scaled, dim=-1).double().cumsum(dim=-1)
    target = ((1.0 - uniform.to(cdf.device)) * cdf[:, -1])[:, None]
    sampled = torch.searchsorted(cdf, target)[:, 0].clamp(max=cdf.shape[-1] - 1)
    return torch.where(temperature == 0, logits.argmax(-1), sampled)


def _top_p_filter(scaled: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    cumulative = sorted_logits.softmax(-1).cumsum(-1)
    remove = cumulative - sorted_logits.softmax(-1) > top_p[:, None]
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logits)


MIN_SHARED_PREFIX = 8  # below this, a separate prefix pass costs more than it saves


def _shared_prefix(prompts: list[list[int]]) -> int:
    """Tokens all prompts start with, leaving each at least one of its own (for its logits)."""
    limit = min(len(p) for p in prompts) - 1
    n = 0
    while n < limit and all(p[n] == prompts[0][n] for p in prompts):
        n += 1
    return n


def _eos_ids(model: torch.nn.Module, tokenizer) -> set[int]:
    ids: set[int] = set()
    config = getattr(model, "generation_config", None)
    for value in (getattr(config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(value)
    return ids
