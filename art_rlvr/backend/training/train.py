"""The token math of the policy-gradient and SFT losses, and how samples are grouped into
microbatches. The data (trajectories to `Sample`s) lives in `train_data`; its names are
re-exported here.

Logits are computed only at the positions that predict completion tokens (`logits_to_keep`),
because fp32 logits over the 49k vocabulary at every prompt position would dominate the
backward pass. Microbatches are length-bucketed (`length_buckets`): the loss is a sum over
tokens divided by the step's token count, so which samples share a microbatch does not change
it, while grouping similar lengths removes most padded positions from forward and backward.
A GRPO group's samples share their prompt: `shared_prompt_logprobs` packs the group into one
sequence, the prompt once and no completion padded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch

from art_rlvr.backend.engine.types import embedding_weight
from art_rlvr.backend.training.train_data import (
    AssistantTurns,
    GroupStats,
    Sample,
    SFTSample,
    TrainingDataError,
    Turn,
    TurnCounts,
    TurnPolicy,
    UnmatchedTurnError,
    assemble,
    choice_logprobs,
    choice_turn,
    exchange_turns,
    group_advantages,
    histories,
    history_turns,
    render_prompt,
    rendered_reply,
    samples_from_groups,
    sequence_sample,
    sft_samples,
    trajectory_samples,
)
from art_rlvr.core.types import Loss

__all__ = [
    "AssistantTurns",
    "GroupStats",
    "SFTSample",
    "Sample",
    "TrainingDataError",
    "Turn",
    "TurnCounts",
    "TurnPolicy",
    "UnmatchedTurnError",
    "assemble",
    "choice_logprobs",
    "choice_turn",
    "completion_logprobs",
    "exchange_turns",
    "group_advantages",
    "histories",
    "history_turns",
    "kl_k3",
    "length_buckets",
    "padded_causal_bias",
    "policy_loss",
    "render_prompt",
    "rendered_reply",
    "samples_from_groups",
    "sequence_sample",
    "sft_loss",
    "sft_samples",
    "shared_prompt_logprobs",
    "trajectory_samples",
]


def length_buckets[S](items: Sequence[S], size: int, length: Callable[[S], int]) -> list[list[S]]:
    """Microbatches of at most `size` items of similar `length` (longest first, so the peak
    memory shows in the first one): each is padded to its own longest item only."""
    ordered = sorted(items, key=length, reverse=True)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def padded_tokens(batches: Iterable[Sequence[int]]) -> tuple[int, int]:
    """(real, padded) positions over microbatches given as lists of sequence lengths."""
    batches = [list(b) for b in batches]
    return sum(map(sum, batches)), sum(max(b) * len(b) for b in batches if b)


def _left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def padded_causal_bias(attention: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive 4D mask [B, 1, N, N]: causal, pad keys hidden, and every position allowed to
    see itself. With a plain 2D mask a left-pad query sees nothing; SDPA's CUDA backward then
    returns NaN gradients for some batch shapes (1 in 150 random bf16 batches on an H100, 0
    with this mask or eager attention), which stopped a GPU run at a non-finite step."""
    n = attention.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool, device=attention.device).tril()
    allowed = causal[None, None] & attention.bool()[:, None, None, :]
    allowed |= torch.eye(n, dtype=torch.bool, device=attention.device)[None, None]
    bias = torch.zeros(allowed.shape, dtype=dtype, device=attention.device)
    return bias.masked_fill(~allowed, torch.finfo(dtype).min)


def completion_logprobs(
    model: torch.nn.Module, prompts: list[list[int]], completions: list[list[int]], pad: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each completion token under `model`: ([B, K], mask [B, K]), right-aligned."""
    weights = embedding_weight(model, "input")
    ids, attention = _left_pad([p + c for p, c in zip(prompts, completions, strict=True)], pad)
    ids, attention = ids.to(weights.device), attention.to(weights.device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    k = max(len(c) for c in completions)
    logits = model(
        input_ids=ids,
        attention_mask=padded_causal_bias(attention, weights.dtype),
        position_ids=positions,
        logits_to_keep=k + 1,
    ).logits[:, :-1, :]
    targets = ids[:, -k:]
    logps = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[..., None])[..., 0]
    mask = [[0] * (k - len(c)) + [1] * len(c) for c in completions]
    return logps, torch.tensor(mask, device=weights.device).bool()


def shared_prompt_logprobs(
    model: torch.nn.Module, prompt: list[int], completions: list[list[int]], pad: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`completion_logprobs` for completions of one prompt (a GRPO group), packed into one
    sequence: the prompt once, then every completion after it at the positions it was sampled
    at, each seeing the prompt and itself only (a block mask). The prompt's positions are
    computed once per group and no completion is padded to the longest: a third of a step's
    positions were padding (docs/results.md, 2026-11-27). The result is right-aligned, [B, K];
    `pad` is unused (nothing is padded)."""
    del pad
    device = embedding_weight(model, "input").device
    start = len(prompt)
    lengths = [len(c) for c in completions]
    segment = torch.tensor(
        [0] * start + [i + 1 for i, n in enumerate(lengths) for _ in range(n)], device=device
    )
    total = len(segment)
    positions = torch.cat(
        [torch.arange(start, device=device)]
        + [torch.arange(start, start + n, device=device) for n in lengths]
    )
    causal = torch.ones(total, total, dtype=torch.bool, device=device).tril()
    allowed = causal & ((segment[None, :] == 0) | (segment[None, :] == segment[:, None]))
    weights = embedding_weight(model, "input")
    bias = torch.zeros(allowed.shape, dtype=weights.dtype, device=device)
    bias = bias.masked_fill(~allowed, torch.finfo(weights.dtype).min)[None, None]
    offsets = [start + sum(lengths[:i]) for i in range(len(lengths))]
    # the positions whose logits predict a completion token, each kept once: the prompt's last
    # (it predicts every completion's first token), then each completion's own but its last.
    # Kept once per completion, the prompt's last made the backward an accumulating scatter
    # over repeated indices, which CPU torch sums in thread-timing order: a seeded run's
    # gradients then changed from run to run in the last bits (docs/results.md, 2026-11-27).
    predicting = [start - 1] + [
        p for o, n in zip(offsets, lengths, strict=True) for p in range(o, o + n - 1)
    ]
    ids = torch.tensor([prompt + [t for c in completions for t in c]], device=device)
    logits = model(
        input_ids=ids,
        attention_mask=bias,
        position_ids=positions[None],
        logits_to_keep=torch.tensor(predicting, device=device),
    ).logits[0]
    logps_kept = torch.log_softmax(logits.float(), dim=-1)
    rows, k = len(completions), max(lengths)
    # every completion's first token from the one prompt row, through an expand (its backward
    # is a sum over rows in a fixed order); the other tokens from their own rows, one each
    firsts = torch.tensor([c[0] for c in completions], device=device).view(-1, 1)
    first = logps_kept[0].expand(rows, -1).gather(-1, firsts)[:, 0]
    others = torch.tensor([t for c in completions for t in c[1:]], dtype=torch.long, device=device)
    rest = logps_kept[1:].gather(-1, others.view(-1, 1))[:, 0]
    row = torch.tensor([i for i, n in enumerate(lengths) for _ in range(n)], device=device)
    column = torch.tensor([k - n + j for n in lengths for j in range(n)], device=device)
    is_first = torch.tensor([j == 0 for n in lengths for j in range(n)], device=device)
    logps = logps_kept.new_zeros(rows, k)
    logps = logps.index_put((row[is_first], column[is_first]), first)
    logps = logps.index_put((row[~is_first], column[~is_first]), rest)
    mask = torch.zeros(rows, k, dtype=torch.bool, device=device)
    mask[row, column] = True
    return logps, mask


def policy_loss(
    new: torch.Tensor,
    old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_fn: Loss,
    epsilon: float,
    epsilon_high: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Summed token loss (the caller divides by the batch's token count) and diagnostics."""
    ratio = torch.exp(new - old)
    adv = advantages[:, None].expand_as(new)
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high)
    if loss_fn == "cispo":
        per_token = -(clipped.detach() * adv * new)
    else:
        per_token = -torch.minimum(ratio * adv, clipped * adv)
    per_token = per_token * mask
    ratio = ratio.detach()
    clip_frac = ((ratio < 1 - epsilon) | (ratio > 1 + epsilon_high)) & mask
    tokens = mask.sum().clamp(min=1)
    diagnostics = {
        "ratio_mean": float((ratio * mask).sum() / tokens),
        "clip_fraction": float(clip_frac.sum() / tokens),
    }
    return per_token.sum(), diagnostics


def kl_k3(new: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(new || ref), summed over masked tokens."""
    delta = ref - new
    return ((torch.exp(delta) - delta - 1) * mask).sum()


def sft_loss(model: torch.nn.Module, batch: list[SFTSample], pad: int) -> tuple[torch.Tensor, int]:
    """Summed next-token loss over assistant tokens, and how many such tokens there were."""
    device = next(model.parameters()).device
    width = max(len(s.input_ids) for s in batch)
    ids = torch.tensor([s.input_ids + [pad] * (width - len(s.input_ids)) for s in batch])
    attention = torch.tensor(
        [[1] * len(s.input_ids) + [0] * (width - len(s.input_ids)) for s in batch]
    )
    labels_mask = torch.tensor([s.loss_mask + [False] * (width - len(s.loss_mask)) for s in batch])
    ids, attention, labels_mask = ids.to(device), attention.to(device), labels_mask.to(device)
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1, :]
    targets = ids[:, 1:]
    mask = labels_mask[:, 1:]
    logps = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[..., None])[..., 0]
    tokens = int(mask.sum())
    return -(logps * mask).sum(), tokens
