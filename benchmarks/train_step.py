"""Cost of one GRPO step and one SFT step on the embedded model, and what the
completion-only logits buy: the same policy-gradient loss computed with full-vocabulary logits
at every position (the naive way), measured side by side in one process; then what the
microbatch layout buys: arrival order, length-bucketed, and a group packed into one sequence
(its prompt once, no completion padded: `rl_step`'s layout), in seconds and computed positions,
with the user / kernel (sys) CPU time of the backward pass at 1 and 2 torch threads.

`--before FILE` also times the group layout with the `shared_prompt_logprobs` of an earlier
`train` module (e.g. `git show 4674b04:./art_rlvr/backend/train.py > /tmp/train_before.py`: the
prompt's KV cache repeated to right-padded rows), on the same samples, interleaved.

Then where the step runs: `rl_step` on the engine's thread (`GenerationEngine.run`, what
`TorchBackend.train` does) and on a thread of its own beside the engine's live OpenMP pool (what
it did until 2026-11-27), the same samples, interleaved. Everything else runs on the engine's
thread too: a main thread that ran torch would hold a pool of its own and throttle both.

Then how the step's microbatches run: one after the other at the backend's thread count
(`workers=1`, what `rl_step` did until 2026-11-27 evening) and on one thread each, as many at
once as the backend has threads (`TorchBackend`'s default on CPU), from the same weights and
optimizer state, interleaved; idle, then beside a busy loop at nice 19 on the same cores (a
laptop's background work). Says whether both gave the same weights, bit for bit.

    uv run python benchmarks/train_step.py [--repeats 3] [--groups 6] [--group-size 6]
        [--before /tmp/train_before.py] [--workers-only]

Prints one line per result: medians over repeats, tokens/s through forward+backward, the
GFLOP/s that implies (about 4 x 107 M non-embedding parameters x positions, plus the kept
logits: the frozen base needs input gradients only) next to the fp32 peak of 2 cores (about
160 GFLOP/s on AVX2, 360 on AVX-512), and peak RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import functools
import importlib.util
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import art
import torch

from art_rlvr import DEFAULT_BASE_MODEL, SamplingConfig, TorchBackend, gather_groups, load_scenario
from art_rlvr.backend.runtime.threads import in_own_thread, in_threads
from art_rlvr.backend.training import steps
from art_rlvr.backend.training import train as T
from art_rlvr.backend.training.steps import sample_length

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


Layout = list[tuple[bool, list[T.Sample]]]  # (shares its prompt, microbatch)


def in_order(samples: list[T.Sample], size: int = 8) -> Layout:
    return [(False, samples[i : i + size]) for i in range(0, len(samples), size)]


def bucketed(samples: list[T.Sample], size: int = 8) -> Layout:
    return [(False, c) for c in T.length_buckets(samples, size, sample_length)]


def packed_groups(samples: list[T.Sample], size: int = 8) -> Layout:
    """What `rl_step` does: a group packed into one sequence, the rest bucketed."""
    return steps.microbatches(samples, size)


LAYOUTS = {"in order": in_order, "bucketed": bucketed, "packed group": packed_groups}


def timed_backward(model, layout: Layout, pad, logprob_fn=None) -> float:
    """Forward and backward of a CISPO loss over the microbatches; `logprob_fn` replaces the
    step's own (`steps.chunk_logprobs`) for per-sequence microbatches."""
    started = time.perf_counter()
    for shared, chunk in layout:
        if logprob_fn is None:
            new, mask = steps.chunk_logprobs(model, chunk, shared, pad)
        else:
            comps = [s.completion_ids for s in chunk]
            new, mask = logprob_fn(model, [s.prompt_ids for s in chunk], comps, pad)
        adv = torch.tensor([s.advantage for s in chunk])
        loss, _ = T.policy_loss(
            new, new.detach(), adv, mask, loss_fn="cispo", epsilon=1.0, epsilon_high=4.0
        )
        loss.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def computed(layout: Layout) -> tuple[int, int, int]:
    """(real, computed, kept-logit) positions: padded rows, and a packed group's prompt once
    and its completions unpadded."""
    real = sum(sample_length(s) for _, c in layout for s in c)
    done = kept = 0
    for shared, chunk in layout:
        k = max(len(s.completion_ids) for s in chunk)
        if shared:
            done += len(chunk[0].prompt_ids) + sum(len(s.completion_ids) for s in chunk)
            kept += sum(len(s.completion_ids) for s in chunk)
        else:
            done += max(sample_length(s) for s in chunk) * len(chunk)
            kept += k * len(chunk)
    return real, done, kept


def gflops(layout: Layout, seconds: float) -> float:
    """Forward + input-gradient backward FLOPs of the computed positions, per second."""
    _, positions, kept = computed(layout)
    return 4 * (NON_EMBEDDING_PARAMS * positions + HIDDEN * VOCAB * kept) / seconds / 1e9


def layouts_report(model, samples: list[T.Sample], pad: int, repeats: int) -> None:
    """Arrival-order, length-bucketed and shared-prompt microbatches of 8, with the backward
    pass's user and kernel CPU time at 1 and 2 torch threads (interleaved repeats, medians)."""
    threads = torch.get_num_threads()
    times: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    for _ in range(repeats):
        for name, make in LAYOUTS.items():
            for n in (1, 2):
                torch.set_num_threads(n)
                before = resource.getrusage(resource.RUSAGE_SELF)
                wall = timed_backward(model, make(samples), pad)
                after = resource.getrusage(resource.RUSAGE_SELF)
                times.setdefault((name, n), []).append(
                    (wall, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime)
                )
    torch.set_num_threads(threads)
    tokens = sum(s.trained_count for s in samples)
    medians = {key: statistics.median(v[0] for v in values) for key, values in times.items()}
    for (name, n), values in times.items():
        wall, user, sys_ = (statistics.median(v[i] for v in values) for i in range(3))
        real, done, _ = computed(LAYOUTS[name](samples))
        print(
            f"backward {name:>13}, {n} thread(s): {wall:.2f} s "
            f"({medians[('bucketed', n)] / wall:.2f}x bucketed), {tokens / wall:.0f} trained "
            f"tokens/s, {gflops(LAYOUTS[name](samples), wall):.1f} GFLOP/s (2-core fp32 peak: ~160 AVX2, ~360 AVX-512); "
            f"positions {real} real / {done} computed; CPU user {user:.2f} s sys {sys_:.2f} s"
        )


def before_report(model, samples: list[T.Sample], pad: int, repeats: int, path: str) -> None:
    """The group layout with an earlier `shared_prompt_logprobs`, beside the current one."""
    spec = importlib.util.spec_from_file_location("train_before", path)
    assert spec and spec.loader
    before = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(before)
    layout = [(shared, c) for shared, c in packed_groups(samples) if shared]
    now, then = [], []
    for _ in range(repeats):
        now.append(timed_backward(model, layout, pad))
        started = time.perf_counter()
        for _shared, chunk in layout:
            comps = [s.completion_ids for s in chunk]
            new, mask = before.shared_prompt_logprobs(model, chunk[0].prompt_ids, comps, pad)
            adv = torch.tensor([s.advantage for s in chunk])
            loss, _ = T.policy_loss(
                new, new.detach(), adv, mask, loss_fn="cispo", epsilon=1.0, epsilon_high=4.0
            )
            loss.backward()
        model.zero_grad(set_to_none=True)
        then.append(time.perf_counter() - started)
    a, b = statistics.median(now), statistics.median(then)
    print(
        f"groups' backward: packed {a:.2f} s, {path}'s {b:.2f} s: {b / a:.2f}x "
        f"({len(layout)} groups, medians of {repeats})"
    )


async def thread_report(backend, trainee, samples: list[T.Sample], repeats: int) -> None:
    """`rl_step` on the engine's thread and on a thread of its own beside the engine's pool."""
    settings = steps.RLSettings(
        learning_rate=1e-9, loss_fn="cispo", epsilon=1.0, epsilon_high=4.0, kl_coef=0.0,
        max_grad_norm=1.0, microbatch_size=backend.microbatch_size,
    )  # fmt: skip
    engine = trainee.base.engine
    times: dict[str, list[float]] = {"engine thread": [], "own thread": []}

    def timed() -> float:
        started = time.perf_counter()
        steps.rl_step(trainee, samples, settings)
        return time.perf_counter() - started

    for _ in range(repeats):
        times["engine thread"].append(await engine.run(timed, threads=backend.threads))
        times["own thread"].append(await in_own_thread(in_threads, backend.threads, timed))
    a, b = (statistics.median(times[k]) for k in ("engine thread", "own thread"))
    print(
        f"rl_step on the engine's thread {a:.2f} s; on its own thread beside the engine's "
        f"pool {b:.2f} s: {b / a:.2f}x (medians of {repeats})"
    )


async def workers_report(backend, trainee, samples: list[T.Sample], repeats: int) -> None:
    """`rl_step` with its microbatches one after the other and on `backend.threads` single-
    threaded workers, from the same weights and optimizer state; idle and beside a busy loop."""
    settings = steps.RLSettings(
        learning_rate=2e-4, loss_fn="cispo", epsilon=1.0, epsilon_high=4.0, kl_coef=0.0,
        max_grad_norm=1.0, microbatch_size=backend.microbatch_size,
    )  # fmt: skip
    params = steps.trained_params(trainee)
    start = [p.detach().clone() for p in params]
    state = copy.deepcopy(trainee.optimizer.state_dict())

    def timed(workers: int) -> tuple[float, list[torch.Tensor]]:
        with torch.no_grad():
            for param, value in zip(params, start, strict=True):
                param.copy_(value)
        trainee.optimizer.load_state_dict(copy.deepcopy(state))
        started = time.perf_counter()
        steps.rl_step(trainee, samples, settings, workers=workers)
        return time.perf_counter() - started, [p.detach().clone() for p in params]

    counts = (1, backend.threads)
    busy_loop = ["nice", "-n", "19", sys.executable, "-c", "while True: pass"]
    for condition in ("idle", "beside a busy loop at nice 19"):
        competitor = subprocess.Popen(busy_loop) if condition != "idle" else None
        try:
            times: dict[int, list[float]] = {n: [] for n in counts}
            weights: dict[int, list[torch.Tensor]] = {}
            for r in range(repeats):
                for n in counts if r % 2 == 0 else counts[::-1]:
                    seconds, weights[n] = await trainee.base.engine.run(
                        functools.partial(timed, n), threads=backend.threads
                    )
                    times[n].append(seconds)
        finally:
            if competitor is not None:
                competitor.kill()
                competitor.wait()
        one, many = (statistics.median(times[n]) for n in counts)
        same = all(torch.equal(a, b) for a, b in zip(weights[1], weights[counts[1]], strict=True))
        print(
            f"rl_step {condition}: microbatches one after the other {one:.2f} s, on "
            f"{counts[1]} single-threaded workers {many:.2f} s: {one / many:.2f}x "
            f"(medians of {repeats}); the same weights bit for bit: {same}"
        )
    with torch.no_grad():
        for param, value in zip(params, start, strict=True):
            param.copy_(value)
    trainee.optimizer.load_state_dict(state)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--groups", type=int, default=6)
    parser.add_argument("--group-size", type=int, default=6)
    parser.add_argument("--before", help="a train module whose shared_prompt_logprobs to time")
    parser.add_argument("--workers-only", action="store_true", help="only the workers report")
    args = parser.parse_args()
    scenario = load_scenario("arith", seed=0)
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
                scenario.splits["train"][r * args.groups : (r + 1) * args.groups],
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
        if args.workers_only:
            await workers_report(backend, trainee, samples, args.repeats)
            await backend.close()
            return
        ours, naive = [], []
        engine = base.engine  # all torch work on its thread: one OpenMP pool, as in a run

        def logits_report() -> None:
            for _ in range(args.repeats):
                layout = bucketed(samples)
                ours.append(timed_backward(base.model, layout, pad, T.completion_logprobs))
                naive.append(timed_backward(base.model, layout, pad, naive_logprobs))

        await engine.run(logits_report)
        o, n = statistics.median(ours), statistics.median(naive)
        print(
            f"policy_loss backward, completion-only logits: {o:.2f} s; full-vocabulary logits: {n:.2f} s; speed-up {n / o:.2f}x"
        )
        await engine.run(layouts_report, base.model, samples, pad, args.repeats)
        if args.before:
            await engine.run(before_report, base.model, samples, pad, args.repeats, args.before)
        await thread_report(backend, trainee, samples, args.repeats)
        await workers_report(backend, trainee, samples, args.repeats)
        sft = [
            art.Trajectory(
                messages_and_choices=[
                    *sc.messages(),
                    {"role": "assistant", "content": str(sc.x["answer"])},
                ]
            )
            for sc in scenario.splits["train"][:32]
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
