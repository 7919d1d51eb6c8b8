"""Length-bucketed microbatches: fewer padded positions, the same loss and gradient."""

from __future__ import annotations

import copy
import functools
import random
import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from art_rlvr.backend.training import steps
from art_rlvr.backend.training import train as T


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


def sft_batch(seed: int) -> list[T.SFTSample]:
    rng = random.Random(seed)
    out = []
    for _ in range(10):
        prompt, reply = rng.randint(8, 40), rng.randint(2, 24)
        ids = [rng.randrange(100, 5000) for _ in range(prompt + reply)]
        out.append(T.SFTSample(input_ids=ids, loss_mask=[False] * prompt + [True] * reply))
    return out


RL = steps.RLSettings(
    learning_rate=2e-4,
    loss_fn="cispo",
    epsilon=1.0,
    epsilon_high=4.0,
    kl_coef=0.0,
    max_grad_norm=1.0,
    microbatch_size=4,
)


@pytest.mark.parametrize(
    "step",
    [
        pytest.param(lambda t, w: steps.rl_step(t, groups(4), RL, workers=w), id="rl"),
        pytest.param(
            lambda t, w: steps.rl_step(
                t, groups(5), RL.model_copy(update={"kl_coef": 0.1}), workers=w
            ),
            id="rl_with_kl",
        ),
        pytest.param(lambda t, w: steps.sft_step(t, sft_batch(6), 1e-3, 4, workers=w), id="sft"),
    ],
)
async def test_microbatches_on_two_threads_step_to_the_one_thread_bits(
    backend, make_model, step
) -> None:
    """A step whose microbatches run on two threads (the CPU default) leaves the adapter, the
    optimizer and every metric with the bits of the same step run one microbatch after the
    other: each microbatch's ops run on one thread and the gradients add in order. Its
    threads end with it."""
    model = await make_model("threads")
    trainee = backend._trainees[model.name]
    assert steps.parallel_workers(trainee.base.model, 2) == 2  # CPU, no dropout drawn
    params = steps.trained_params(trainee)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # B factors non-zero, as after training, so every factor learns
        for param in params:
            param.add_(torch.randn(param.shape, generator=generator) * 0.01)
    start = [p.detach().clone() for p in params]
    state = copy.deepcopy(trainee.optimizer.state_dict())
    results = []
    for workers in (1, 2, 2):
        with torch.no_grad():
            for param, value in zip(params, start, strict=True):
                param.copy_(value)
        trainee.optimizer.load_state_dict(copy.deepcopy(state))
        metrics = await backend._torch(trainee.base, functools.partial(step, trainee, workers))
        assert not [t for t in threading.enumerate() if t.name.startswith("art-rlvr-chunk")]
        moments = [v for s in trainee.optimizer.state.values() for v in s.values()]
        results.append(
            (
                [p.detach().clone() for p in params],
                [m.clone() if isinstance(m, torch.Tensor) else m for m in moments],
                {k: v for k, v in metrics.items() if k != "seconds"},
            )
        )
    (one_params, one_moments, one_metrics), *others = results
    assert not all(torch.equal(a, b) for a, b in zip(one_params, start, strict=True))
    for params_after, moments, metrics in others:
        assert metrics == one_metrics
        assert all(torch.equal(a, b) for a, b in zip(params_after, one_params, strict=True))
        assert all(
            torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
            for a, b in zip(moments, one_moments, strict=True)
        )


async def test_a_failing_microbatch_on_a_thread_fails_the_step_and_its_threads_end(
    backend, make_model
) -> None:
    """A microbatch that raises (a token id past the vocabulary) fails the whole step with its
    own error, the weights untouched, and no microbatch thread outlives it."""
    model = await make_model("fails")
    trainee = backend._trainees[model.name]
    params = steps.trained_params(trainee)
    before = [p.detach().clone() for p in params]
    items = groups(7)
    items[-1] = T.Sample(
        prompt_ids=[10**7], completion_ids=[5, 6], old_logprobs=None, advantage=1.0
    )
    with pytest.raises(IndexError):
        await backend._torch(
            trainee.base, functools.partial(steps.rl_step, trainee, items, RL, workers=2)
        )
    assert not [t for t in threading.enumerate() if t.name.startswith("art-rlvr-chunk")]
    assert all(torch.equal(a, b) for a, b in zip(params, before, strict=True))
