"""Decoding a GRPO step's batch with finished rows kept as padding (the engine's default on the
batch-invariant path, `decode_batch.retire`) against finished rows leaving at once (what the
engine did before 2026-11-28), side by side on the same engine, weights and prompts.

The batch is what the default RL run sends: 6 arith prompts x 6 samples, group by group, at
temperature 1 with a 32-token budget, each row stopping where the model stops (rows finish
at different steps, so the batch shrinks: what this change is about). Settings, interleaved
within every repeat, on the same engine (a second engine would run a second OpenMP pool):

- `padding`: up to `ROW_MULTIPLE - 1` finished rows stay in the tensors, so every forward has
  a row count the linears do not pad and the cache is copied once per 4 rows that leave;
- `at_once`: every finished row leaves at once (the engine's `_multiple` set to 1): a cache
  copy for each step where a row finishes, linears padding the rows to a multiple of 4.

Prints each setting's seconds a batch and tokens/s (medians), `padding` over `at_once`
(median of per-repeat ratios), and checks that both sample the same tokens on every row
(seeded requests: finished rows kept as padding must not move a remaining row's bits). With
`--competitor nice` (or `run`) every setting is measured twice per repeat, idle and beside
that competing process on the same cores (`engine_speed.competing`).

    uv run python benchmarks/retire_padding.py [--repeats 5] [--competitor nice]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections import defaultdict

import art
import torch
from adapter_decode import prompt_ids
from engine_speed import COMPETITORS, competing

from art_rlvr import DEFAULT_BASE_MODEL, TorchBackend
from art_rlvr.backend.engine.generation import SamplingParams

SETTINGS = {"padding": None, "at_once": 1}  # the engine's retire multiple (None: its own)


async def decode(engine, prompts: list[list[int]], tokens: int):
    started = time.perf_counter()
    done = await asyncio.gather(
        *[
            engine.generate(
                p, SamplingParams(max_tokens=tokens, temperature=1.0, seed=i), adapter=None
            )
            for i, p in enumerate(prompts)
        ]
    )
    seconds = time.perf_counter() - started
    return seconds, [(c[0].token_ids, c[0].logprobs) for c in done]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=6)
    parser.add_argument("--competitor", choices=sorted(COMPETITORS))
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load {os.getloadavg()[0]:.2f}")  # fmt: skip
    conditions = ["idle", *([args.competitor] if args.competitor else [])]
    with tempfile.TemporaryDirectory() as tmp:
        backend = TorchBackend(path=tmp)
        model = art.TrainableModel(
            name="bench", project="bench", run_name="bench", base_model=DEFAULT_BASE_MODEL
        )
        await model.register(backend)
        base = next(iter(backend._bases.values()))
        engine = base.engine
        if not engine.batch_invariant:
            raise SystemExit("this engine is not batch-invariant: finished rows leave at once")
        own = engine._multiple
        prompts = prompt_ids(base.tokenizer, args.group_size)
        await decode(engine, prompts, args.tokens)  # warm-up
        seconds: dict[tuple[str, str], list[float]] = defaultdict(list)
        tokens: dict[tuple[str, str], list[int]] = defaultdict(list)
        sampled: dict[str, list] = {}
        try:
            for _ in range(args.repeats):
                for condition in conditions:
                    with competing(condition):
                        for name, multiple in SETTINGS.items():
                            engine._multiple = own if multiple is None else multiple
                            took, rows = await decode(engine, prompts, args.tokens)
                            seconds[condition, name].append(took)
                            tokens[condition, name].append(sum(len(t) for t, _ in rows))
                            sampled.setdefault(name, rows)
                            if rows != sampled[name]:
                                raise SystemExit(f"{name}: a repeat sampled other tokens")
        finally:
            engine._multiple = own
        await backend.close()
    same = sampled["padding"] == sampled["at_once"]
    print(f"batch: {len(prompts)} rows, {tokens['idle', 'padding'][0]} tokens sampled, "
          f"up to {args.tokens} a row; the same tokens and logprobs on every row in both "
          f"settings: {same}")  # fmt: skip
    for condition in conditions:
        for name in SETTINGS:
            s = statistics.median(seconds[condition, name])
            rate = statistics.median(
                n / t
                for n, t in zip(tokens[condition, name], seconds[condition, name], strict=True)
            )
            print(f"{condition:>6} {name:>8}: {s:6.3f} s a batch, {rate:6.1f} tok/s")
        ratio = statistics.median(
            a / p
            for a, p in zip(
                seconds[condition, "at_once"], seconds[condition, "padding"], strict=True
            )
        )
        print(f"{condition:>6} padding / at_once: {ratio:.2f}x (median of {args.repeats})")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    if not same:
        raise SystemExit("the two settings sampled different tokens")


if __name__ == "__main__":
    asyncio.run(main())
