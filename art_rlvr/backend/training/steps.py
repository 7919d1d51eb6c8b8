"""One optimizer step of RL (policy gradient) or SFT on a trainee's adapter, and scoring.

Each function takes the model to itself (`adapters.exclusive`), selects the trainee's adapter,
and returns the step's metrics. The token math lives in `train`.

A step's microbatches are independent until their gradients are summed, so on CPU they run on
`workers` threads of one intra-op thread each (`accumulate`): a microbatch's Python and small
ops no longer leave the other core idle at each of its hundreds of parallel regions. The
gradients are summed in microbatch order, as `backward()` one after the other would, and each
microbatch's ops run on one thread, so a seeded step gives the same bits at any worker count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import torch
from pydantic import BaseModel, ConfigDict

from art_rlvr.backend.adapters.registry import Trainee, exclusive
from art_rlvr.backend.training import train as T
from art_rlvr.core.types import Loss


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


class ChunkStats(NamedTuple):
    """One microbatch's share of a step's metrics (sums over its trained tokens)."""

    loss: float
    kl: float
    tokens: float
    ratio_sum: float
    clip_sum: float


def rl_step(
    trainee: Trainee, samples: list[T.Sample], cfg: RLSettings, *, workers: int = 1
) -> dict[str, float]:
    """One policy-gradient step; the loss is divided by the number of trained tokens."""
    started = time.perf_counter()
    tokens = sum(s.trained_count for s in samples)
    out = {
        "loss": 0.0,
        "grad_norm": 0.0,
        "learning_rate": cfg.learning_rate,  # as the step trained it (a run's lr_schedule)
        "tokens": float(tokens),
        "kl": 0.0,
        "ratio_mean": 1.0,
        "clip_fraction": 0.0,
    }
    if not tokens:
        return out | {"seconds": time.perf_counter() - started}
    base = trainee.base
    pad = base.tokenizer.pad_token_id or 0
    with exclusive(base):
        base.model.set_adapter(trainee.adapter)
        set_lr(trainee.optimizer, cfg.learning_rate)
        trainee.optimizer.zero_grad(set_to_none=True)
        chunks = microbatches(samples, cfg.microbatch_size)
        refs = reference_logprobs(base.model, chunks, pad) if cfg.kl_coef > 0 else None

        def chunk_loss(index: int) -> tuple[torch.Tensor, ChunkStats]:
            shared, chunk = chunks[index]
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
            kl = 0.0
            if refs is not None:
                kl_sum = T.kl_k3(new, refs[index], mask)
                loss = loss + cfg.kl_coef * kl_sum
                kl = float(kl_sum.detach()) / tokens
            chunk_tokens = float(mask.sum())
            stats = ChunkStats(
                loss=float(loss.detach()) / tokens,
                kl=kl,
                tokens=chunk_tokens,
                ratio_sum=diag["ratio_mean"] * chunk_tokens,
                clip_sum=diag["clip_fraction"] * chunk_tokens,
            )
            return loss / tokens, stats

        workers = parallel_workers(base.model, workers)
        done = list(accumulate(chunk_loss, len(chunks), trained_params(trainee), workers))
        norm = _clip(trainee, cfg.max_grad_norm)
        if not torch.isfinite(norm):
            trainee.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError("non-finite gradient norm; step not applied")
        trainee.optimizer.step()
        trainee.optimizer.zero_grad(set_to_none=True)
    return out | {
        "loss": running_sum(c.loss for c in done),
        "kl": running_sum(c.kl for c in done),
        "grad_norm": float(norm),
        "ratio_mean": running_sum(c.ratio_sum for c in done) / tokens,
        "clip_fraction": running_sum(c.clip_sum for c in done) / tokens,
        "seconds": time.perf_counter() - started,
    }


def reference_logprobs(
    model: torch.nn.Module, chunks: list[tuple[bool, list[T.Sample]]], pad: int
) -> list[torch.Tensor]:
    """Each microbatch's log-probs under the base model (adapter off), before any microbatch
    trains: turning the adapter off is a switch on the shared model, which no other thread
    may be using at the time."""
    with torch.no_grad(), model.disable_adapter():  # type: ignore[operator]
        return [chunk_logprobs(model, chunk, shared, pad)[0] for shared, chunk in chunks]


def accumulate[S](
    chunk_loss: Callable[[int], tuple[torch.Tensor, S]],
    count: int,
    params: list[torch.nn.Parameter],
    workers: int,
) -> Iterator[S]:
    """Backpropagate `chunk_loss(i)` for i in 0..count-1 into `params`' `.grad`, yielding each
    microbatch's side results in order.

    With `workers` > 1, microbatches run on that many threads of one intra-op thread each
    and their gradients are added in index order: `backward()` one after the other adds the
    same gradients in the same order. The threads end with the step (libgomp keeps a pool for
    every thread that runs a parallel region; see `threads.in_own_thread`)."""
    if workers <= 1 or count <= 1:
        for index in range(count):
            loss, side = chunk_loss(index)
            loss.backward()
            yield side
        return

    def gradients(index: int) -> tuple[tuple[torch.Tensor | None, ...], S]:
        torch.set_num_threads(1)  # this thread's own count (torch keeps it per thread)
        loss, side = chunk_loss(index)
        return torch.autograd.grad(loss, params, allow_unused=True), side

    pool = ThreadPoolExecutor(min(workers, count), thread_name_prefix="art-rlvr-chunk")
    try:
        for grads, side in pool.map(gradients, range(count)):
            with torch.no_grad():
                for param, grad in zip(params, grads, strict=True):
                    if grad is None:
                        continue
                    if param.grad is None:
                        param.grad = grad
                    else:
                        param.grad.add_(grad)
            yield side
    finally:  # after a failure, microbatches not yet started do not start
        pool.shutdown(wait=True, cancel_futures=True)


def parallel_workers(model: torch.nn.Module, workers: int) -> int:
    """Microbatch threads for a step: `workers` on CPU, one elsewhere (a GPU runs one
    microbatch's kernels faster than two threads can feed it), and one where a forward draws
    random numbers (dropout in training mode), whose order threads would make vary."""
    device = next(model.parameters()).device
    draws = model.training and any(
        isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()
    )
    return workers if device.type == "cpu" and not draws else 1


def running_sum(values: Iterable[float]) -> float:
    """Left to right, one rounding per term: Python's `sum` compensates float rounding since
    3.12, which moved the reported loss's last digit from what earlier steps reported."""
    total = 0.0
    for value in values:
        total += value
    return total


def trained_params(trainee: Trainee) -> list[torch.nn.Parameter]:
    return [p for group in trainee.optimizer.param_groups for p in group["params"]]


def sft_step(
    trainee: Trainee,
    batch: list[T.SFTSample],
    lr: float,
    microbatch_size: int,
    *,
    workers: int = 1,
) -> dict[str, float]:
    started = time.perf_counter()
    base = trainee.base
    pad = base.tokenizer.pad_token_id or 0
    with exclusive(base):
        base.model.set_adapter(trainee.adapter)
        set_lr(trainee.optimizer, lr)
        trainee.optimizer.zero_grad(set_to_none=True)
        total = sum(sum(s.loss_mask) for s in batch)
        chunks = T.length_buckets(batch, microbatch_size, lambda s: len(s.input_ids))

        def chunk_loss(index: int) -> tuple[torch.Tensor, float]:
            loss, _ = T.sft_loss(base.model, chunks[index], pad)
            return loss / max(total, 1), float(loss.detach())

        workers = parallel_workers(base.model, workers)
        loss_sum = running_sum(
            accumulate(chunk_loss, len(chunks), trained_params(trainee), workers)
        )
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
    return torch.nn.utils.clip_grad_norm_(trained_params(trainee), max_norm)


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
