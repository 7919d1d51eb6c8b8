"""One optimizer step of RL (policy gradient) or SFT on a trainee's adapter, and scoring.

Each function takes the model to itself (`adapters.exclusive`), selects the trainee's adapter,
and returns the step's metrics. The token math lives in `train`.
"""

from __future__ import annotations

import time

import torch
from pydantic import BaseModel, ConfigDict

from art_rlvr.backend import train as T
from art_rlvr.backend.adapters import Trainee, exclusive
from art_rlvr.core import Loss


class RLSettings(BaseModel):
    """The loss settings of one RL step, resolved from ART's `train(...)` arguments."""

    model_config = ConfigDict(frozen=True)

    learning_rate: float
    loss_fn: Loss
    epsilon: float
    epsilon_high: float
    kl_coef: float
    max_grad_norm: float
    microbatch_size: int


def rl_step(trainee: Trainee, samples: list[T.Sample], cfg: RLSettings) -> dict[str, float]:
    """One policy-gradient step; the loss is divided by the number of trained tokens."""
    started = time.perf_counter()
    tokens = sum(s.trained_count for s in samples)
    out = {
        "loss": 0.0,
        "grad_norm": 0.0,
        "tokens": float(tokens),
        "kl": 0.0,
        "ratio_mean": 1.0,
        "clip_fraction": 0.0,
    }
    if not tokens:
        return out | {"seconds": time.perf_counter() - started}
    base = trainee.base
    pad = base.tokenizer.pad_token_id or 0
    ratio_sum = clip_sum = 0.0
    with exclusive(base):
        base.model.set_adapter(trainee.adapter)
        set_lr(trainee.optimizer, cfg.learning_rate)
        trainee.optimizer.zero_grad(set_to_none=True)
        for shared, chunk in microbatches(samples, cfg.microbatch_size):
            new, mask = chunk_logprobs(base.model, chunk, shared, pad)
            mask = mask & trained_mask(chunk, new.shape[1], new.device)
            old = old_logprobs(chunk, new)
            adv = torch.tensor([s.advantage for s in chunk], device=new.device)
            loss, diag = T.policy_loss(
                new,
                old,
                adv,
                mask,
                loss_fn=cfg.loss_fn,
                epsilon=cfg.epsilon,
                epsilon_high=cfg.epsilon_high,
            )
            if cfg.kl_coef > 0:
                with torch.no_grad(), base.model.disable_adapter():
                    ref, _ = chunk_logprobs(base.model, chunk, shared, pad)
                kl = T.kl_k3(new, ref, mask)
                loss = loss + cfg.kl_coef * kl
                out["kl"] += float(kl) / tokens
            (loss / tokens).backward()
            out["loss"] += float(loss.detach()) / tokens
            chunk_tokens = float(mask.sum())
            ratio_sum += diag["ratio_mean"] * chunk_tokens
            clip_sum += diag["clip_fraction"] * chunk_tokens
        norm = _clip(trainee, cfg.max_grad_norm)
        if not torch.isfinite(norm):
            trainee.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError("non-finite gradient norm; step not applied")
        trainee.optimizer.step()
        trainee.optimizer.zero_grad(set_to_none=True)
    return out | {
        "grad_norm": float(norm),
        "ratio_mean": ratio_sum / tokens,
        "clip_fraction": clip_sum / tokens,
        "seconds": time.perf_counter() - started,
    }


def sft_step(
    trainee: Trainee, batch: list[T.SFTSample], lr: float, microbatch_size: int
) -> dict[str, float]:
    started = time.perf_counter()
    base = trainee.base
    pad = base.tokenizer.pad_token_id or 0
    with exclusive(base):
        base.model.set_adapter(trainee.adapter)
        set_lr(trainee.optimizer, lr)
        trainee.optimizer.zero_grad(set_to_none=True)
        total = sum(sum(s.loss_mask) for s in batch)
        loss_sum = 0.0
        for chunk in T.length_buckets(batch, microbatch_size, lambda s: len(s.input_ids)):
            loss, _ = T.sft_loss(base.model, chunk, pad)
            (loss / max(total, 1)).backward()
            loss_sum += float(loss.detach())
        norm = _clip(trainee, 1.0)
        trainee.optimizer.step()
        trainee.optimizer.zero_grad(set_to_none=True)
    return {
        "loss": loss_sum / max(total, 1),
        "grad_norm": float(norm),
        "learning_rate": lr,
        "tokens": float(total),
        "seconds": time.perf_counter() - started,
    }


def score(
    trainee: Trainee,
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    microbatch_size: int,
) -> list[float]:
    """Summed log p(completion | prompt) under the trainee's current adapter, per pair."""
    base = trainee.base
    pad = base.tokenizer.pad_token_id or 0
    out: list[float] = []
    with exclusive(base), torch.no_grad():
        base.model.set_adapter(trainee.adapter)
        for start in range(0, len(prompt_ids), microbatch_size):
            end = start + microbatch_size
            logps, mask = T.completion_logprobs(
                base.model, prompt_ids[start:end], completion_ids[start:end], pad
            )
            out.extend(float(v) for v in (logps * mask).sum(-1))
    return out


def microbatches(samples: list[T.Sample], size: int) -> list[tuple[bool, list[T.Sample]]]:
    """(shared, chunk) pairs: samples with the same prompt (a group's) go together, at most
    `size` a chunk, and share its prefill; the others are length-bucketed. Longest first."""
    by_prompt: dict[tuple[int, ...], list[T.Sample]] = {}
    for sample in samples:
        by_prompt.setdefault(tuple(sample.prompt_ids), []).append(sample)
    groups = [g for g in by_prompt.values() if len(g) > 1]
    alone = [g[0] for g in by_prompt.values() if len(g) == 1]
    chunks = [(True, g[i : i + size]) for g in groups for i in range(0, len(g), size)]
    chunks += [(False, c) for c in T.length_buckets(alone, size, sample_length)]
    return sorted(chunks, key=lambda c: max(map(sample_length, c[1])), reverse=True)


def chunk_logprobs(
    model: torch.nn.Module, chunk: list[T.Sample], shared: bool, pad: int
) -> tuple[torch.Tensor, torch.Tensor]:
    completions = [s.completion_ids for s in chunk]
    if shared:
        return T.shared_prompt_logprobs(model, chunk[0].prompt_ids, completions, pad)
    return T.completion_logprobs(model, [s.prompt_ids for s in chunk], completions, pad)


def sample_length(sample: T.Sample) -> int:
    """What a sample costs in a microbatch: every row is padded to the longest sequence."""
    return len(sample.prompt_ids) + len(sample.completion_ids)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _clip(trainee: Trainee, max_norm: float) -> torch.Tensor:
    params = [p for group in trainee.optimizer.param_groups for p in group["params"]]
    return torch.nn.utils.clip_grad_norm_(params, max_norm)


def trained_mask(chunk: list[T.Sample], k: int, device: torch.device) -> torch.Tensor:
    """[B, K] right-aligned like `completion_logprobs`: True where a token is in the loss."""
    rows = [
        [False] * (k - len(s.completion_ids))
        + (list(s.trained) if s.trained is not None else [True] * len(s.completion_ids))
        for s in chunk
    ]
    return torch.tensor(rows, dtype=torch.bool, device=device)


def old_logprobs(chunk: list[T.Sample], new: torch.Tensor) -> torch.Tensor:
    """Sampling logprobs right-aligned like `new`; on-policy (detached new) where unknown
    (no logprobs recorded, or NaN at context positions of a multi-turn sequence)."""
    old = new.detach().clone()
    k = new.shape[1]
    for row, sample in enumerate(chunk):
        if sample.old_logprobs is not None:
            values = torch.tensor(sample.old_logprobs, device=new.device, dtype=new.dtype)
            known = old[row, k - len(values) :]
            old[row, k - len(values) :] = torch.where(values.isnan(), known, values)
    return old
