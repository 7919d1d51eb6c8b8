"""The engine's running batch: its requests' rows, their shared KV cache and masks, and the
per-row settings kept as CPU tensors so that one sampling call serves every row.

Rows join after a prefill (left-padding the shorter side) and leave when they finish (leading
columns no remaining row attends to are dropped), so the batch shrinks as it goes. Row state
is plain Python (token lists, a `random.Random` for the uniform draw): the hot loop does no
tensor work per row.

On the batch-invariant path a finished row may stay in the tensors as padding (`Batch.slots`),
so that every forward keeps a row count the linears need no padding for and the cache is
copied once per `multiple` rows that leave, not once per row (`retire`).
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin, DummyLayer, DynamicLayer

from art_rlvr.backend.engine.types import Completion, SamplingParams, TokenEvent

if TYPE_CHECKING:
    import xgrammar as xgr


@dataclass
class Request:
    adapter: str | None
    prompt_ids: list[int]
    params: SamplingParams
    n: int
    done: Callable[[list[Completion] | BaseException], None]
    grammar: xgr.CompiledGrammar | None = None
    on_token: Callable[[TokenEvent], None] | None = None
    arrived: float = field(default_factory=time.monotonic)
    cancelled: bool = False  # set from the server's loop when its client went away


@dataclass
class Job:
    """Torch work outside decoding (a training step, a save) for the engine's own thread:
    `done` gets its result or its exception."""

    work: Callable[[], Any]
    done: Callable[[Any, BaseException | None], None]
    threads: int | None = None  # its intra-op thread count; None: the engine's current one
    cancelled: bool = False  # its caller gave up before it started: skipped


@dataclass
class Row:
    request: Request
    index: int
    rng: random.Random  # the row's uniform draws: seeded per request and index, or shared
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)  # when top_logprobs > 0
    matcher: xgr.GrammarMatcher | None = None  # for a constrained row
    result: Completion | None = None

    @property
    def stop_window(self) -> int:
        """Tokens whose text must hold any stop string that the newest token completes: a
        character takes at most 4 byte-level tokens, plus a margin for merges."""
        return 4 * max(len(s) for s in self.request.params.stop) + 8


@dataclass
class Batch:
    """The running batch: its rows, their shared KV cache, masks, positions and next logits."""

    adapter: str | None
    stack: contextlib.ExitStack
    rows: list[Row] = field(default_factory=list)
    cache: DynamicCache | None = None
    attention: torch.Tensor | None = None
    next_pos: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    temperature: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    top_p: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    remaining: dict[int, int] = field(default_factory=dict)
    finished: dict[int, list[Row]] = field(default_factory=dict)
    # the tensor row of each of `rows` where finished rows stay as padding between them;
    # None: row i is tensor row i
    slots: list[int] | None = None

    def tensor_rows(self) -> list[int]:
        return self.slots if self.slots is not None else list(range(len(self.rows)))

    def live_logits(self) -> torch.Tensor:
        """The next logits of `rows` (padding rows' dropped)."""
        assert self.logits is not None
        if self.slots is None:
            return self.logits
        return self.logits[torch.tensor(self.slots, device=self.logits.device)]

    def forward_ids(self, chosen: torch.Tensor) -> torch.Tensor:
        """The next forward's input ids: `rows`' chosen tokens, padding rows fed token 0."""
        if self.slots is None:
            return chosen
        assert self.attention is not None
        ids = chosen.new_zeros(self.attention.shape[0])
        ids[torch.tensor(self.slots, device=chosen.device)] = chosen
        return ids

    def settings_changed(self) -> None:
        """Rebuild the per-row sampling settings after rows joined or left."""
        params = [r.request.params for r in self.rows]
        self.temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)
        self.top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)

    def uniforms(self) -> torch.Tensor:
        return torch.tensor([r.rng.random() for r in self.rows], dtype=torch.float64)


class SpareLayer(DynamicLayer):
    """A key/value layer whose tensors are views into buffers with spare positions, so a decode
    step writes its token in place: transformers' layer concatenates, copying the whole cache
    at every layer of every step (a 36-row decode step 0.94x the time with this layer,
    docs/results.md 2026-11-27). A retired row and dropped leading positions keep the buffers;
    whatever else replaces `keys` (a join, left padding) is copied into new buffers at the next
    write. The values read are the same either way."""

    SPARE = 32  # positions a buffer keeps free beyond what it holds (and a quarter more)

    _key_buffer: torch.Tensor | None = None
    _value_buffer: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys, values = self.keys, self.values
        assert keys is not None and values is not None
        held = keys.shape[-2] if keys.numel() else 0
        end = held + key_states.shape[-2]
        key_buffer, value_buffer = self._key_buffer, self._value_buffer
        if (
            key_buffer is None
            or value_buffer is None
            or not _prefix_of(keys, key_buffer, end)
            or not _prefix_of(values, value_buffer, end)
        ):
            key_buffer = self._key_buffer = _spare(keys, key_states, held, end)
            value_buffer = self._value_buffer = _spare(values, value_states, held, end)
        key_buffer[..., held:end, :] = key_states
        value_buffer[..., held:end, :] = value_states
        self.keys, self.values = key_buffer[..., :end, :], value_buffer[..., :end, :]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows `indices` (a retired row leaves): one copy of the buffers' rows, spare
        room included, so the next write stays in place (rows retire at most decode steps)."""
        if not self._holds_buffers():
            super().batch_select_indices(indices)
            return
        assert self._key_buffer is not None and self._value_buffer is not None
        held = self.get_seq_length()
        self._key_buffer = self._key_buffer[indices]
        self._value_buffer = self._value_buffer[indices]
        self.keys, self.values = self._key_buffer[..., :held, :], self._value_buffer[..., :held, :]

    def drop_leading(self, first: int) -> None:
        """Forget the first `first` positions (no row attends to them any more): a view of the
        buffers, no copy."""
        if self._holds_buffers():
            assert self._key_buffer is not None and self._value_buffer is not None
            self._key_buffer = self._key_buffer[..., first:, :]
            self._value_buffer = self._value_buffer[..., first:, :]
        if self.keys is not None and self.values is not None and self.keys.numel():
            self.keys, self.values = self.keys[..., first:, :], self.values[..., first:, :]

    def _holds_buffers(self) -> bool:
        keys, values = self.keys, self.values
        return (
            keys is not None
            and values is not None
            and self._key_buffer is not None
            and self._value_buffer is not None
            and _prefix_of(keys, self._key_buffer, keys.shape[-2])
            and _prefix_of(values, self._value_buffer, values.shape[-2])
        )


def _prefix_of(held: torch.Tensor, buffer: torch.Tensor, end: int) -> bool:
    """Whether `held` is still `buffer`'s leading positions and the buffer reaches `end`
    (a join, a retired row or a dropped column replaces `held` with a new tensor)."""
    return (
        held.numel() > 0
        and buffer.shape[-2] >= end
        and held.shape[:-2] == buffer.shape[:-2]
        and held.data_ptr() == buffer.data_ptr()
        and held.stride() == buffer.stride()
    )


def _spare(held: torch.Tensor, new: torch.Tensor, count: int, end: int) -> torch.Tensor:
    """A buffer for `end` positions and `SpareLayer.SPARE` (and a quarter) more, holding
    `held`'s `count`. Zeroed, not empty: writes into untouched pages fault, and made the
    in-place write cost nearly what the copy it replaces did."""
    size = end + SpareLayer.SPARE + end // 4
    buffer = new.new_zeros((*new.shape[:-2], size, new.shape[-1]))
    if count:
        buffer[..., :count, :] = held
    return buffer


def spare_cache() -> DynamicCache:
    """A DynamicCache whose layers keep spare positions (`SpareLayer`)."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = SpareLayer
    return cache


def kv_layers(cache: DynamicCache) -> list[CacheLayerMixin | DummyLayer]:
    """The cache's layers as key/value layers (a `DummyLayer` holds None): a linear-attention
    state cannot be padded or joined row by row, so a model with one is refused by name."""
    layers: list[CacheLayerMixin | DummyLayer] = []
    for layer in cache.layers:
        if not isinstance(layer, CacheLayerMixin | DummyLayer):
            raise TypeError(f"the decode batch handles key/value caches, not {type(layer)}")
        layers.append(layer)
    return layers


def left_pad_cache(cache: DynamicCache, width: int) -> None:
    for layer in kv_layers(cache):
        if layer.keys is None or layer.values is None or layer.keys.numel() == 0:
            continue
        missing = width - layer.keys.shape[-2]
        if missing > 0:
            pad = layer.keys.new_zeros((*layer.keys.shape[:-2], missing, layer.keys.shape[-1]))
            layer.keys = torch.cat([pad, layer.keys], dim=-2)
            layer.values = torch.cat([pad.clone(), layer.values], dim=-2)


def left_pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - mask.shape[1]
    return mask if missing <= 0 else torch.cat([mask.new_zeros((mask.shape[0], missing)), mask], 1)


def join(
    batch: Batch,
    rows: list[Row],
    cache: DynamicCache,
    attention: torch.Tensor,
    next_pos: torch.Tensor,
    logits: torch.Tensor,
) -> None:
    """Append freshly prefilled rows to the running batch (left-padding the shorter side)."""
    if batch.cache is None or not batch.rows:
        batch.rows, batch.cache, batch.attention = list(rows), cache, attention
        batch.next_pos, batch.logits, batch.slots = next_pos, logits, None
        batch.settings_changed()
        return
    assert batch.attention is not None and batch.next_pos is not None and batch.logits is not None
    if batch.slots is not None:
        held = batch.attention.shape[0]
        batch.slots = [*batch.slots, *range(held, held + len(rows))]
    width = max(batch.attention.shape[1], attention.shape[1])
    left_pad_cache(batch.cache, width)
    left_pad_cache(cache, width)
    for old, new in zip(kv_layers(batch.cache), kv_layers(cache), strict=True):
        if old.keys is None or old.values is None or new.keys is None or new.values is None:
            continue  # a layer that stores nothing
        old.keys = torch.cat([old.keys, new.keys], dim=0)
        old.values = torch.cat([old.values, new.values], dim=0)
    batch.attention = torch.cat(
        [left_pad_mask(batch.attention, width), left_pad_mask(attention, width)], dim=0
    )
    batch.next_pos = torch.cat([batch.next_pos, next_pos])
    batch.logits = torch.cat([batch.logits, logits])
    batch.rows.extend(rows)
    batch.settings_changed()


def retire(batch: Batch, keep: list[int], multiple: int = 1) -> list[int] | None:
    """Keep rows `keep` (indices into `batch.rows`). Up to `multiple - 1` of the rows that
    leave stay in the tensors as padding, so the forward's row count stays a multiple of
    `multiple` (the batch-invariant linears' `ROW_MULTIPLE`: then they pad nothing) and the
    cache is copied only when a whole `multiple` of rows has left: a copy of every row's cache
    per finished row cost about a fifth of a 36-row decode step. Padding rows alike in
    attention to a remaining row are kept first, so they add no attention group. The tensor
    rows kept where some were dropped, else None."""
    held = batch.tensor_rows()
    live = [held[k] for k in keep]
    batch.rows = [batch.rows[k] for k in keep]
    if not keep:
        batch.slots = None
        _select(batch, [])
        return []
    assert batch.attention is not None
    total = batch.attention.shape[0]
    target = min(total, -(-len(keep) // multiple) * multiple)
    if target > len(live):
        masks = [tuple(row) for row in batch.attention.tolist()]
        taken = set(live)
        alike = {masks[s] for s in live}
        spare = [s for s in range(total) if s not in taken]
        spare.sort(key=lambda s: masks[s] not in alike)
        kept = sorted(live + spare[: target - len(live)])
    else:
        kept = live
    if len(kept) < total:
        _select(batch, kept)
    position = {s: i for i, s in enumerate(kept)}
    slots = [position[s] for s in live]
    batch.slots = None if slots == list(range(len(kept))) else slots
    batch.settings_changed()
    return kept if len(kept) < total else None


def _select(batch: Batch, kept: list[int]) -> None:
    """Keep only tensor rows `kept`; drop leading columns that no remaining row attends to."""
    if not kept:
        batch.cache = batch.attention = batch.next_pos = batch.logits = None
        return
    assert batch.cache is not None and batch.attention is not None
    index = torch.tensor(kept, device=batch.attention.device)
    batch.cache.batch_select_indices(index)
    batch.attention = batch.attention[index]
    assert batch.next_pos is not None
    batch.next_pos = batch.next_pos[index]
    used = batch.attention.any(dim=0).nonzero()
    first = int(used[0]) if len(used) else 0
    if first > 0:
        batch.attention = batch.attention[:, first:]
        for layer in kv_layers(batch.cache):
            if isinstance(layer, SpareLayer):
                layer.drop_leading(first)
            elif layer.keys is not None and layer.values is not None and layer.keys.numel():
                layer.keys = layer.keys[..., first:, :]
                layer.values = layer.values[..., first:, :]


def drop_cancelled(batch: Batch, multiple: int = 1) -> list[Request]:
    """Remove the rows of cancelled requests (their logits too: they are dropped before the
    batch samples); the requests that lost rows."""
    keep = [i for i, r in enumerate(batch.rows) if not r.request.cancelled]
    if len(keep) == len(batch.rows):
        return []
    gone = {id(r.request): r.request for r in batch.rows if r.request.cancelled}
    for key in gone:
        batch.remaining.pop(key, None)
        batch.finished.pop(key, None)
    logits = batch.logits
    kept = retire(batch, keep, multiple)
    if keep and logits is not None and kept is not None:
        batch.logits = logits[torch.tensor(kept, device=logits.device)]
    return list(gone.values())


MIN_SHARED_PREFIX = 8  # below this, a separate prefix pass costs more than it saves


def shared_prefix(prompts: list[list[int]]) -> int:
    """Tokens all prompts start with, leaving each at least one of its own (for its logits)."""
    limit = min(len(p) for p in prompts) - 1
    n = 0
    while n < limit and all(p[n] == prompts[0][n] for p in prompts):
        n += 1
    return n


def left_padded(prompts: list[list[int]], pad: int, shared: int = 0) -> tuple[list, list]:
    """Input ids and attention mask rows, left-padded; `shared` attended columns in front
    stand for a prefix already in the cache."""
    width = max(len(p) for p in prompts)
    ids = [[pad] * (width - len(p)) + p for p in prompts]
    mask = [[1] * shared + [0] * (width - len(p)) + [1] * len(p) for p in prompts]
    return ids, mask


def finish(row: Row, tokenizer, eos_ids: set[int]) -> bool:
    """Whether the row is done; if so its `result` is set."""
    params = row.request.params
    token = row.tokens[-1]
    if row.matcher is not None and row.matcher.is_terminated():
        row.result = _complete(tokenizer, row, "stop", include_last=token not in eos_ids)
        return True
    if token in eos_ids and not params.ignore_eos:
        row.result = _complete(tokenizer, row, "stop", include_last=False)
        return True
    if params.stop and _stopped(row, tokenizer):
        return True
    if len(row.tokens) >= params.max_tokens:
        row.result = _complete(tokenizer, row, "length", include_last=True)
        return True
    return False


def _stopped(row: Row, tokenizer) -> bool:
    """Whether the text now holds a stop string (then the result is cut before it).

    A stop string the newest token completes lies in the text of the last few tokens, so
    only those are decoded each step; the whole text only when one shows up there."""
    stop = row.request.params.stop
    tail = tokenizer.decode(row.tokens[-row.stop_window :], skip_special_tokens=True)
    if not any(s in tail for s in stop):
        return False
    text = tokenizer.decode(row.tokens, skip_special_tokens=True)
    cut = min((text.find(s) for s in stop if s in text), default=-1)
    if cut < 0:
        return False
    row.result = Completion(row.tokens, row.logprobs, text[:cut], "stop", row.top or None)
    return True


def _complete(tokenizer, row: Row, reason: str, *, include_last: bool) -> Completion:
    visible = row.tokens if include_last else row.tokens[:-1]
    text = tokenizer.decode(visible, skip_special_tokens=True)
    return Completion(list(row.tokens), list(row.logprobs), text, reason, row.top or None)
