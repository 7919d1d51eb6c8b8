"""Batch-invariant decoding on CPU: a row's logits do not depend on what it is batched with.

The engine decodes whatever requests are in flight together, and in fp32 on CPU a row's logits
move by ~1e-5 with the row count of each matrix product and with the row's left padding
(`benchmarks/batch_invariance.py`), so a seeded run could part from itself at a near-tie token
when two requests happened to share a step. Two rules remove both causes in the engine's
forwards (training forwards are untouched, bit for bit):

- every linear layer sees a row count padded to a multiple of `ROW_MULTIPLE` (measured on the
  model's shapes: a row's output is then bit-identical whatever the count and its place);
- attention runs one row at a time over that row's own keys (padding and join gaps dropped),
  with the same call for the same row whatever else is in flight.

The cost is a loop over rows in each attention layer, and no shared-prefix prefill (a prompt's
cache must not depend on which prompts arrived beside it).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

__all__ = ["ATTENTION", "FLAG", "ROW_MULTIPLE", "hook_linears", "install"]

ATTENTION = "art_rlvr_rowwise"  # the attention implementation's registered name
FLAG = "row_invariant"  # the forward keyword that turns the row-wise path on
ROW_MULTIPLE = 4


def install(model: torch.nn.Module) -> bool:
    """Route `model`'s attention through `rowwise_attention` and pad its linears' rows.

    False (and nothing changed) where the model does not use transformers' attention
    interface, so the engine falls back to ordinary batching.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not isinstance(base, PreTrainedModel) or not base._can_set_attn_implementation():
        return False
    if base.config._attn_implementation not in ("sdpa", ATTENTION):
        return False  # eager, flash or a custom kernel: not ours to replace
    AttentionInterface.register(ATTENTION, rowwise_attention)
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


def rowwise_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """sdpa, one batch row at a time over the keys that row may see; plain sdpa unless the
    caller passed `row_invariant=True` (the engine does; training never does)."""
    if not kwargs.pop(FLAG, False) or any(
        kwargs.get(k) is not None for k in ("sliding_window", "softcap", "position_bias")
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    batch, heads, q_len, dim = query.shape
    gqa = getattr(module, "num_key_value_groups", 1) > 1
    out = query.new_zeros(batch, q_len, heads, dim)
    for b, rows, keys, mask, causal in _plan(attention_mask, batch, q_len, key.shape[2]):
        result = F.scaled_dot_product_attention(
            query[b : b + 1, :, rows],
            key[b : b + 1, :, keys],
            value[b : b + 1, :, keys],
            attn_mask=mask,
            is_causal=causal,
            scale=scaling,
            enable_gqa=gqa,
        )
        out[b, rows] = result[0].transpose(0, 1)
    return out, None


Plan = list[tuple[int, slice | torch.Tensor, slice | torch.Tensor, torch.Tensor | None, bool]]
PLAN = "_art_rlvr_rowwise_plan"


def _plan(mask: torch.Tensor | None, batch: int, q_len: int, kv_len: int) -> Plan:
    """Per row: the queries that see something, the keys they see, and how (no mask, causal,
    or the explicit mask). Worked out once per forward: every layer gets the same mask."""
    if mask is None:  # no padding anywhere: causal, queries at the end
        full = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)
        return [_row(b, full) for b in range(batch)]
    plan = getattr(mask, PLAN, None)
    if plan is None:
        visible = mask[:, 0] if mask.dtype == torch.bool else mask[:, 0] == 0
        plan = [entry for b in range(batch) if (entry := _row(b, visible[b])) is not None]
        setattr(mask, PLAN, plan)
    return plan


def _row(b: int, visible: torch.Tensor):
    rows = _span(visible.any(1).nonzero().squeeze(-1))
    keys = _span(visible.any(0).nonzero().squeeze(-1))
    if rows is None or keys is None:
        return None
    seen = visible[rows][:, keys]
    if bool(seen.all()):
        return b, rows, keys, None, False
    if seen.shape[0] == seen.shape[1] and torch.equal(seen, torch.ones_like(seen).tril()):
        return b, rows, keys, None, True
    return b, rows, keys, seen.to(visible.device), False


def _span(index: torch.Tensor) -> slice | torch.Tensor | None:
    """A contiguous index as a slice (a view: no copy), else the index; None if empty."""
    if index.numel() == 0:
        return None
    first, last = int(index[0]), int(index[-1])
    return slice(first, last + 1) if last - first + 1 == index.numel() else index
