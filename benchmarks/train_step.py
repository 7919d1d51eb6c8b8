"""Cost of one GRPO step and one SFT step on the embedded model, and what the
completion-only logits buy: the same policy-gradient loss computed with full-vocabulary logits
at every position (the naive way), measured side by side in one process.

    uv run python benchmarks/train_step.py [--repeats 3] [--groups 6] [--group-size 6]

Prints one line per result: medians over repeats, tokens/s through forward+backward, peak RSS.
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


def timed_backward(model, samples, pad, logprob_fn) -> float:
    prompts = [s.prompt_ids for s in samples]
    comps = [s.completion_ids for s in samples]
    started = time.perf_counter()
    for start in range(0, len(samples), 8):
        new, mask = logprob_fn(model, prompts[start : start + 8], comps[start : start + 8], pad)
        adv = torch.tensor([s.advantage for s in samples[start : start + 8]])
        loss, _ = T.policy_loss(
            new, new.detach(), adv, mask, loss_fn="cispo", epsilon=1.0, epsilon_high=4.0
        )
        loss.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - started


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
