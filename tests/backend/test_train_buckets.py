"""Length-bucketed microbatches: fewer padded positions, the same loss and gradient."""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from art_rlvr.backend import steps
from art_rlvr.backend import train as T


def samples(seed: int) -> list[T.Sample]:
    rng = random.Random(seed)
    return [
        T.Sample(
            prompt_ids=[rng.randrange(100, 5000) for _ in range(rng.randint(8, 60))],
            completion_ids=[rng.randrange(100, 5000) for _ in range(rng.randint(2, 30))],
            old_logprobs=None,
            advantage=rng.choice([-1.0, 0.5, 1.0]),
        )
        for _ in range(12)
    ]


def summed_loss(model, chunks: list[list[T.Sample]], pad: int) -> torch.Tensor:
    total = torch.zeros(())
    for chunk in chunks:
        new, mask = T.completion_logprobs(
            model, [s.prompt_ids for s in chunk], [s.completion_ids for s in chunk], pad
        )
        # ratio 1.35, beyond the clip: the clipped branch is exercised too
        old = new.detach() - 0.3
        advantages = torch.tensor([s.advantage for s in chunk])
        loss, _ = T.policy_loss(
            new, old, advantages, mask, loss_fn="ppo", epsilon=0.2, epsilon_high=0.2
        )
        total = total + loss
    return total


def test_length_buckets_pad_less_and_keep_every_item() -> None:
    items = samples(0)
    buckets = T.length_buckets(items, 4, steps.sample_length)
    in_order = [items[i : i + 4] for i in range(0, len(items), 4)]
    assert sorted(map(id, (s for b in buckets for s in b))) == sorted(map(id, items))
    real, padded = T.padded_tokens([[steps.sample_length(s) for s in b] for b in buckets])
    _, padded_in_order = T.padded_tokens([[steps.sample_length(s) for s in b] for b in in_order])
    assert real <= padded < padded_in_order


async def test_bucketed_microbatches_give_the_unbucketed_loss_and_gradient(backend, model) -> None:
    """fp32: the summed policy loss over length buckets equals the arrival-order one to 1e-5,
    and so do the LoRA gradients (relative to their norm)."""
    base, adapter, params = trained_parts(backend, model)
    items = samples(1)
    with base.lock:
        base.model.set_adapter(adapter)
        results = []
        for chunks in (
            [items[i : i + 4] for i in range(0, len(items), 4)],
            T.length_buckets(items, 4, steps.sample_length),
        ):
            loss = summed_loss(base.model, chunks, pad=2)
            results.append((loss.detach(), torch.autograd.grad(loss, params)))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert torch.allclose(loss_a, loss_b, rtol=1e-5, atol=1e-5)
    flat_a, flat_b = (
        torch.cat([g.flatten() for g in grads_a]),
        torch.cat([g.flatten() for g in grads_b]),
    )
    assert float((flat_a - flat_b).norm() / flat_a.norm()) < 1e-4


def trained_parts(backend, model) -> tuple:
    """The shared model's base, its adapter's name and the LoRA parameters its optimizer
    trains."""
    trainee = backend._trainees[model.name]
    params = [p for g in trainee.optimizer.param_groups for p in g["params"]]
    return trainee.base, trainee.adapter, params


def groups(seed: int) -> list[T.Sample]:
    """Three GRPO-like groups (one prompt, completions of different lengths) and two samples
    whose prompts nobody shares."""
    rng = random.Random(seed)
    out: list[T.Sample] = []
    for size in (5, 3, 1, 1, 2):
        prompt = [rng.randrange(100, 5000) for _ in range(rng.randint(8, 40))]
        out += [
            T.Sample(
                prompt_ids=prompt,
                completion_ids=[rng.randrange(100, 5000) for _ in range(rng.randint(1, 20))],
                old_logprobs=None,
                advantage=rng.choice([-1.0, 0.5, 1.0]),
            )
            for _ in range(size)
        ]
    return out


@pytest.mark.parametrize("size", [2, 4, 8])
def test_microbatches_put_a_group_together_and_keep_every_item(size: int) -> None:
    items = groups(0)
    chunks = steps.microbatches(items, size)
    assert sorted(id(s) for _, c in chunks for s in c) == sorted(map(id, items))
    assert all(len(c) <= size for _, c in chunks)
    for shared, chunk in chunks:
        if shared:
            assert len({tuple(s.prompt_ids) for s in chunk}) == 1
    alone = [s for shared, c in chunks if not shared for s in c]
    assert len(alone) == 2  # the two prompts of group size 1
    costs = [max(map(steps.sample_length, c)) for _, c in chunks]
    assert costs == sorted(costs, reverse=True)


async def test_a_shared_prompt_gives_the_per_sample_logprobs_loss_and_gradient(
    backend, model
) -> None:
    """fp32: a group's prompt run once and shared by its rows gives each completion's
    logprobs, the mask, the loss and the LoRA gradients of running every sequence in full."""
    base, adapter, params = trained_parts(backend, model)
    items = groups(1)
    results = []
    with base.lock:
        base.model.set_adapter(adapter)
        group = items[:5]
        full, full_mask = T.completion_logprobs(
            base.model, [s.prompt_ids for s in group], [s.completion_ids for s in group], 2
        )
        shared, shared_mask = T.shared_prompt_logprobs(
            base.model, group[0].prompt_ids, [s.completion_ids for s in group], 2
        )
        assert torch.equal(full_mask, shared_mask)
        assert torch.allclose(full[full_mask], shared[shared_mask], atol=1e-4)
        for chunks in ([(False, items)], steps.microbatches(items, 4)):
            total = torch.zeros(())
            for is_shared, chunk in chunks:
                new, mask = steps.chunk_logprobs(base.model, chunk, is_shared, pad=2)
                old = new.detach() - 0.3
                advantages = torch.tensor([s.advantage for s in chunk])
                loss, _ = T.policy_loss(
                    new, old, advantages, mask, loss_fn="ppo", epsilon=0.2, epsilon_high=0.2
                )
                total = total + loss
            results.append((total.detach(), torch.autograd.grad(total, params)))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert torch.allclose(loss_a, loss_b, rtol=1e-5, atol=1e-5)
    flat_a, flat_b = (torch.cat([g.flatten() for g in grads]) for grads in (grads_a, grads_b))
    assert float((flat_a - flat_b).norm() / flat_a.norm()) < 1e-4


async def test_a_group_runs_as_one_sequence_without_padding(backend, model) -> None:
    """A group's forward sees its prompt once and each completion's own tokens, nothing
    padded (in the first RL steps a third of the positions were padding)."""
    trainee = backend._trainees[model.name]
    base = trainee.base
    group = groups(2)[:5]
    seen: list[torch.Size] = []
    hook = base.model.register_forward_pre_hook(
        lambda _m, _args, kwargs: seen.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    try:
        with base.lock, torch.no_grad():
            base.model.set_adapter(trainee.adapter)
            logps, mask = T.shared_prompt_logprobs(
                base.model, group[0].prompt_ids, [s.completion_ids for s in group], 2
            )
    finally:
        hook.remove()
    lengths = [len(s.completion_ids) for s in group]
    assert len(set(lengths)) > 1  # padding would have been needed
    assert seen == [torch.Size([1, len(group[0].prompt_ids) + sum(lengths)])]
    assert mask.sum(1).tolist() == lengths and logps.shape == (5, max(lengths))


class AccumulatingScatters(TorchDispatchMode):
    """Records every op that adds several values into one element: CPU torch sums those in
    the order its threads happen to reach them, so the result's last bits vary run to run."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in ("index_put", "index_put_", "_index_put_impl_"):
            accumulate = kwargs.get("accumulate", args[3] if len(args) > 3 else False)
            indices = [i for i in args[1] if i is not None]
            if accumulate and _repeats(torch.stack(torch.broadcast_tensors(*indices), -1)):
                self.found.append(name)
        elif name in ("index_add", "index_add_") and _repeats(args[2][:, None]):
            self.found.append(name)
        elif name in ("scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_"):
            index, dim = args[2], args[1] % args[2].dim()
            coords = torch.stack(
                torch.meshgrid(*[torch.arange(n) for n in index.shape], indexing="ij"), -1
            )
            coords[..., dim] = index
            if _repeats(coords):
                self.found.append(name)
        return func(*args, **kwargs)


def _repeats(coordinates: torch.Tensor) -> bool:
    flat = coordinates.reshape(-1, coordinates.shape[-1])
    return len(torch.unique(flat, dim=0)) < len(flat)


async def test_a_training_backward_adds_nothing_in_thread_order(backend, model) -> None:
    """A group's gradient never adds several values into one element through a scatter, whose
    order CPU torch leaves to its threads: with the prompt's last position kept once per
    completion, a seeded run's gradients differed between two runs (docs/results.md,
    2026-11-27)."""
    base, adapter, params = trained_parts(backend, model)
    items = groups(3)
    with base.lock:
        base.model.set_adapter(adapter)
        chunks = steps.microbatches(items, 8)
        assert any(shared and len(c) > 2 for shared, c in chunks)
        total = torch.zeros(())
        for is_shared, chunk in chunks:
            new, mask = steps.chunk_logprobs(base.model, chunk, is_shared, pad=2)
            advantages = torch.tensor([s.advantage for s in chunk])
            loss, _ = T.policy_loss(
                new, new.detach(), advantages, mask, loss_fn="cispo", epsilon=0.2, epsilon_high=0.2
            )
            total = total + loss
        with AccumulatingScatters() as seen:
            torch.autograd.grad(total, params)
    assert seen.found == []
