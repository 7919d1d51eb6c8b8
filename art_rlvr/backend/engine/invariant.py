"""Batch-invariant decoding on CPU: a row's logits do not depend on what it is batched with.

The engine decodes whatever requests are in flight together, and in fp32 on CPU a row's logits
move by ~1e-5 with the row count of each matrix product and with the row's left padding
(`benchmarks/batch_invariance.py`), so a seeded run could part from itself at a near-tie token
when two requests happened to share a step. Two rules remove both causes in the engine's
forwards (training forwards are untouched, bit for bit):

- every linear layer sees a row count padded to a multiple of `ROW_MULTIPLE` (measured on the
  model's shapes: a row's output is then bit-identical whatever the count and its place);
- attention sees only a row's own keys (padding and join gaps dropped): rows that see the same
  key positions in the same way (in decoding: the rows whose prompts padded alike) attend
  together in batched matmuls and a softmax whose per-row result does not depend on how many
  rows share the call (sdpa's CPU kernel does not have that property at one query: measured).

The cost is a few calls per layer instead of one, and no shared-prefix prefill (a prompt's
cache must not depend on which prompts arrived beside it).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

__all__ = ["ATTENTION", "FLAG", "ROW_MULTIPLE", "hook_linears", "install"]

ATTENTION = "art_rlvr_rowwise"  # the attention implementation's registered name
FLAG = "row_invariant"  # the forward keyword that turns the row-wise path on
ROW_MULTIPLE = 4


def install(model: torch.nn.Module) -> bool:
    """Route `model`'s attention through `row_invariant_attention` and pad its linears' rows.

    False (and nothing changed) where the model does not use transformers' attention
    interface, so the engine falls back to ordinary batching.
    """
    get_base = getattr(model, "get_base_model", None)  # a peft wrapper's
    base = get_base() if get_base is not None else model
    if not isinstance(base, PreTrainedModel) or not base._can_set_attn_implementation():
        return False
    if base.config._attn_implementation not in ("sdpa", ATTENTION):
        return False  # eager, flash or a custom kernel: not ours to replace
    AttentionInterface.register(ATTENTION, row_invariant_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)
    base.set_attn_implementation(ATTENTION)
    hook_linears(model)
    return True


def hook_linears(model: torch.nn.Module) -> None:
    """Pad the rows of every linear layer (LoRA's included) in inference-mode forwards.

    Called again when adapters add layers; a layer is hooked once.
    """
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and not getattr(module, HOOKED, False):
            padded: dict[int, tuple[torch.Tensor, torch.Size]] = {}
            module.register_forward_pre_hook(_pad_rows(padded))
            module.register_forward_hook(_unpad_rows(padded))
            setattr(module, HOOKED, True)


HOOKED = "_art_rlvr_rows_padded"


def _pad_rows(padded: dict[int, tuple[torch.Tensor, torch.Size]]):
    def hook(_module: torch.nn.Module, args: tuple) -> tuple | None:
        (x,) = args
        rows = math.prod(x.shape[:-1])
        if not torch.is_inference_mode_enabled() or rows % ROW_MULTIPLE == 0:
            return None
        flat = x.reshape(rows, x.shape[-1])
        wide = torch.cat([flat, flat.new_zeros(-rows % ROW_MULTIPLE, x.shape[-1])])
        padded[id(wide)] = (wide, x.shape[:-1])
        return (wide,)

    return hook


def _unpad_rows(padded: dict[int, tuple[torch.Tensor, torch.Size]]):
    def hook(_module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
        entry = padded.pop(id(args[0]), None)
        if entry is None or entry[0] is not args[0]:
            return None
        lead = entry[1]
        return output[: math.prod(lead)].reshape(*lead, output.shape[-1])

    return hook


def row_invariant_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Each group of rows that see the same keys in the same way attends in one call of
    `_attend`; plain sdpa unless the caller passed `row_invariant=True` (the engine does;
    training never does)."""
    if not kwargs.pop(FLAG, False) or any(
        kwargs.get(k) is not None for k in ("sliding_window", "softcap", "position_bias")
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    batch, heads, q_len, dim = query.shape
    scale = scaling if scaling is not None else dim**-0.5
    out = query.new_zeros(batch, q_len, heads, dim)
    for group in _plan(attention_mask, query, key.shape[2]):
        result = _attend(
            _take(query, group.batch)[:, :, group.rows],
            _take(key, group.batch)[:, :, group.keys],
            _take(value, group.batch)[:, :, group.keys],
            group.mask,
            scale,
        )
        out[_cell(group.batch, group.rows)] = result.transpose(1, 2)
    return out, None


def _attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Softmax attention in three batched ops whose per-row result does not depend on the
    batch count (sdpa's CPU flash kernel splits differently with the batch: measured).

    Query heads are grouped onto their key head (GQA, as `repeat_interleave` would pair them)
    so keys and values are never copied; `mask` is [q, k], True where a query sees a key.
    """
    rows, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    grouped = query.reshape(rows, kv_heads, heads // kv_heads * q_len, dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)).mul_(scale)
    if mask is not None:
        scores.masked_fill_(~mask.repeat(heads // kv_heads, 1), float("-inf"))
    return torch.matmul(scores.softmax(-1), value).reshape(rows, heads, q_len, dim)


Index = slice | torch.Tensor


class Group(NamedTuple):
    """Batch rows that attend alike: their queries `rows` see keys `keys` through `mask`."""

    batch: Index  # which batch rows (`index` would shadow tuple.index)
    rows: Index
    keys: Index
    mask: torch.Tensor | None


PLAN = "_art_rlvr_invariant_plan"


def _take(tensor: torch.Tensor, index: Index) -> torch.Tensor:
    return tensor[index] if isinstance(index, slice) else tensor.index_select(0, index)


def _cell(index: Index, rows: Index) -> tuple[Index, Index]:
    """`out[index, rows]` as a [group, rows] block, also where both are index tensors."""
    if isinstance(index, torch.Tensor) and isinstance(rows, torch.Tensor):
        return index[:, None], rows[None, :]
    return index, rows


def _plan(mask: torch.Tensor | None, query: torch.Tensor, kv_len: int) -> list[Group]:
    """The groups of one forward, worked out once (every layer gets the same mask)."""
    batch, _, q_len, _ = query.shape
    if mask is None:  # no padding anywhere: causal, queries at the end, every row alike
        full = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device)
        entry = _row(full.tril(kv_len - q_len))
        return _groups([(b, entry) for b in range(batch)], query.device)
    plan = getattr(mask, PLAN, None)
    if plan is None:
        visible = mask[:, 0] if mask.dtype == torch.bool else mask[:, 0] == 0
        plan = _groups([(b, _row(visible[b])) for b in range(batch)], query.device)
        setattr(mask, PLAN, plan)
    return plan


Signature = tuple[tuple[int, ...], tuple[int, ...], bytes | None]


def _row(visible: torch.Tensor) -> tuple[Signature, Group] | None:
    """What one row attends with (`index` left to `_groups`), and its hashable signature."""
    rows = visible.any(1).nonzero().squeeze(-1)
    keys = visible.any(0).nonzero().squeeze(-1)
    if rows.numel() == 0 or keys.numel() == 0:
        return None
    seen = visible[rows][:, keys]
    mask = None if bool(seen.all()) else seen
    signature = (
        tuple(rows.tolist()),
        tuple(keys.tolist()),
        None if mask is None else mask.cpu().numpy().tobytes(),
    )
    return signature, Group(slice(0), _span(rows), _span(keys), mask)


def _groups(
    rows: list[tuple[int, tuple[Signature, Group] | None]], device: torch.device
) -> list[Group]:
    """Rows with one signature become one group (its batch rows as a slice where contiguous)."""
    members: dict[Signature, list[int]] = {}
    first: dict[Signature, Group] = {}
    for b, entry in rows:
        if entry is not None:
            members.setdefault(entry[0], []).append(b)
            first.setdefault(entry[0], entry[1])
    return [
        first[s]._replace(batch=_span(torch.tensor(batch_rows, device=device)))
        for s, batch_rows in members.items()
    ]


def _span(index: torch.Tensor) -> slice | torch.Tensor:
    """A contiguous index as a slice (a view: no copy), else the index."""
    first, last = int(index[0]), int(index[-1])
    return slice(first, last + 1) if last - first + 1 == index.numel() else index
