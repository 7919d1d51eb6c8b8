"""Cost of one GRPO step and one SFT step on the embedded model, and what the
completion-only logits buy: the same policy-gradient loss computed with full-vocabulary logits
at every position (the naive way), measured side by side in one process; then what
length-bucketed microbatches buy over arrival-order ones (padded positions, seconds), and the
user / kernel (sys) CPU time of the backward pass at 1 and 2 torch threads.

    uv run python benchmarks/train_step.py [--repeats 3] [--groups 6] [--group-size 6]

Prints one line per result: medians over repeats, tokens/s through forward+backward, the
GFLOP/s that implies (about 4 x 107 M non-embedding parameters x positions, plus the kept
logits: the frozen base needs input gradients only) next to a 2-core AVX2 fp32 peak of about
160 GFLOP/s, and peak RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import tempfile
import time

import art
import torch

from art_rlvr import DEFAULT_BASE_MODEL, SamplingConfig, TorchBackend, gather_groups, load_task
from art_rlvr.backend import train as T
from art_rlvr.backend.steps import sample_length

NON_EMBEDDING_PARAMS, HIDDEN, VOCAB = 106_700_000, 576, 49_152  # SmolLM2-135M


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def naive_logprobs(model, prompts, completions, pad):
    """Full-vocabulary logits at every position, then pick the completion positions."""
    ids, attention = T._left_pad([p + c for p, c in zip(prompts, completions, strict=True)], pad)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits
    logps = torch.log_softmax(logits.float(), dim=-1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
    k = max(len(c) for c in completions)
    mask = torch.tensor([[0] * (k - len(c)) + [1] * len(c) for c in completions]).bool()
    return logps[:, -k:], mask


def in_order(samples: list[T.Sample], size: int = 8) -> list[list[T.Sample]]:
    return [samples[i : i + size] for i in range(0, len(samples), size)]


def bucketed(samples: list[T.Sample], size: int = 8) -> list[list[T.Sample]]:
    return T.length_buckets(samples, size, sample_length)


def timed_backward(model, samples, pad, logprob_fn, chunks=in_order) -> float:
    started = time.perf_counter()
    for chunk in chunks(samples):
        prompts = [s.prompt_ids for s in chunk]
        comps = [s.completion_ids for s in chunk]
        new, mask = logprob_fn(model, prompts, comps, pad)
        adv = torch.tensor([s.advantage for s in chunk])
        loss, _ = T.policy_loss(
            new, new.detach(), adv, mask, loss_fn="cispo", epsilon=1.0, epsilon_high=4.0
        )
        loss.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def gflops(samples_chunks: list[list[T.Sample]], seconds: float) -> float:
    """Forward + input-gradient backward FLOPs of the padded microbatches, per second."""
    positions = sum(max(sample_length(s) for s in c) * len(c) for c in samples_chunks)
    kept = sum(max(len(s.completion_ids) for s in c) * len(c) for c in samples_chunks)
    return 4 * (NON_EMBEDDING_PARAMS * positions + HIDDEN * VOCAB * kept) / seconds / 1e9


def buckets_report(model, samples: list[T.Sample], pad: int, repeats: int) -> None:
    """Arrival-order vs length-bucketed microbatches of 8, and the backward pass's user and
    kernel CPU time at 1 and 2 torch threads (interleaved repeats, medians)."""
    lengths = {
        name: [[sample_length(s) for s in c] for c in chunks(samples)]
        for name, chunks in (("in order", in_order), ("bucketed", bucketed))
    }
    threads = torch.get_num_threads()
    times: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    for _ in range(repeats):
        for name, chunks in (("in order", in_order), ("bucketed", bucketed)):
            for n in sorted({1, 2}):
                torch.set_num_threads(n)
                before = resource.getrusage(resource.RUSAGE_SELF)
                wall = timed_backward(model, samples, pad, T.completion_logprobs, chunks)
                after = resource.getrusage(resource.RUSAGE_SELF)
                times.setdefault((name, n), []).append(
                    (wall, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime)
                )
    torch.set_num_threads(threads)
    tokens = sum(s.trained_count for s in samples)
    for (name, n), values in times.items():
        wall, user, sys_ = (statistics.median(v[i] for v in values) for i in range(3))
        real, padded = T.padded_tokens(lengths[name])
        chunks = in_order(samples) if name == "in order" else bucketed(samples)
        print(
            f"backward {name:>8}, {n} thread(s): {wall:.2f} s, {tokens / wall:.0f} trained "
            f"tokens/s, {gflops(chunks, wall):.1f} GFLOP/s (peak ~160); positions {real} real / "
            f"{padded} padded ({padded / real - 1:.0%} padding); CPU user {user:.2f} s sys "
            f"{sys_:.2f} s"
        )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--groups", type=int, default=6)
    parser.add_argument("--group-size", type=int, default=6)
    args = parser.parse_args()
    task = load_task("arith", seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        backend = TorchBackend(path=tmp)
        model = art.TrainableModel(
            name="bench", project="bench", run_name="bench", base_model=DEFAULT_BASE_MODEL
        )
        await model.register(backend)
        rl_seconds, tokens = [], 0
        for r in range(args.repeats):
            groups = await gather_groups(
                model,
                task.splits["train"][r * args.groups : (r + 1) * args.groups],
                args.group_size,
                sampling=SamplingConfig(max_tokens=32),
                seed=r,
                description="rollouts",
            )
            for g in groups:  # force signal so every group trains: the cost we want to see
                for i, t in enumerate(g.trajectories):
                    t.reward = float(i % 2)
            result = await backend.train(model, groups, learning_rate=1e-5)
            rl_seconds.append(result.metrics["seconds"])
            tokens = int(result.metrics["tokens"])
        rl = statistics.median(rl_seconds)
        print(
            f"grpo_step {args.groups}x{args.group_size} rollouts: {rl:.2f} s median, {tokens / rl:.0f} completion tokens/s through forward+backward"
        )
        trainee = next(iter(backend._trainees.values()))
        base = trainee.base
        samples, _ = T.samples_from_groups(groups, base.tokenizer, scale_rewards=True)
        pad = base.tokenizer.pad_token_id
        ours, naive = [], []
        with base.lock:
            for _ in range(args.repeats):
                ours.append(timed_backward(base.model, samples, pad, T.completion_logprobs))
                naive.append(timed_backward(base.model, samples, pad, naive_logprobs))
        o, n = statistics.median(ours), statistics.median(naive)
        print(
            f"policy_loss backward, completion-only logits: {o:.2f} s; full-vocabulary logits: {n:.2f} s; speed-up {n / o:.2f}x"
        )
        with base.lock:
            buckets_report(base.model, samples, pad, args.repeats)
        sft = [
            art.Trajectory(
                messages_and_choices=[
                    *sc.messages(),
                    {"role": "assistant", "content": str(sc.x["answer"])},
                ]
            )
            for sc in task.splits["train"][:32]
        ]
        sft_seconds = []
        for _ in range(args.repeats):
            async for m in backend._train_sft(
                model, sft[:8], art.TrainSFTConfig(learning_rate=1e-5, batch_size=8)
            ):
                sft_seconds.append(m["seconds"])
        print(f"sft_step batch 8: {statistics.median(sft_seconds):.2f} s median")
        print(f"peak_rss: {peak_rss_mb():.0f} MB")
        await backend.close()


if __name__ == "__main__":
    asyncio.run(main())
