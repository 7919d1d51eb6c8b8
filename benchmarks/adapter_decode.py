"""Decoding a GRPO step's batch through a trained adapter: the engine as it is against the
engine through peft's LoRA layers, and against an earlier engine module, side by side.

The batch is what the default RL run sends: 6 arith prompts x 6 samples, group by group,
32 forced tokens a row, through the trainee's adapter (its B factors set non-zero, as after
training; peft starts them at zero). Settings, each on the same weights and prompts,
interleaved within every repeat:

- `folded`: the engine of `TorchBackend()` (the default: the adapter folded into a copy of
  the weights it adapts, `art_rlvr/backend/adapters/merged.py`);
- `peft`: the same engine decoding through peft's LoRA layers (`adapters.select`, what
  `TorchBackend(fold_adapters=False)` does);
- `before` (with `--before FILE`, an engine module, e.g.
  `git show a7a0423:./art_rlvr/backend/engine.py > /tmp/engine_before.py`): that module's engine
  through peft's layers, i.e. the engine before both changes;
- `no_adapter`: the engine on the bare base model (what an adapter could at best cost nothing).

Prints tokens/s (medians over repeats) and each setting over `peft` (median of per-repeat
ratios). Also checks that `folded` and `peft` sample the same tokens on most rows (they differ
by float rounding, so a near-tie can go either way).

    uv run python benchmarks/adapter_decode.py [--repeats 5] [--before /tmp/engine_before.py]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict

import art
import torch

from art_rlvr import DEFAULT_BASE_MODEL, TorchBackend
from art_rlvr.backend.adapters import registry as A
from art_rlvr.backend.engine.generation import GenerationEngine, SamplingParams

PROMPTS = [(3, "+", 17), (12, "-", 4), (9, "+", 8), (20, "-", 11), (6, "+", 15), (18, "-", 2)]
SYSTEM = "You are a careful calculator. Reply with only the final number."


def prompt_ids(tokenizer, group_size: int) -> list[list[int]]:
    """Group by group, as ART's `gather_trajectory_groups` starts them."""
    rendered = [
        tokenizer.apply_chat_template(
            [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"What is {a} {op} {b}? Answer with just the number."},
            ],
            add_generation_prompt=True,
            tokenize=False,
        )
        for a, op, b in PROMPTS
    ]
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in rendered]
    return [p for p in ids for _ in range(group_size)]


async def decode(engine, adapter: str | None, prompts: list[list[int]], tokens: int):
    started = time.perf_counter()
    done = await asyncio.gather(
        *[
            engine.generate(
                p,
                SamplingParams(max_tokens=tokens, temperature=1.0, seed=i, ignore_eos=True),
                adapter=adapter,
            )
            for i, p in enumerate(prompts)
        ]
    )
    rate = sum(len(c[0].token_ids) for c in done) / (time.perf_counter() - started)
    return rate, [c[0].token_ids for c in done]


def load_engine_module(path: str):
    spec = importlib.util.spec_from_file_location("engine_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=6)
    parser.add_argument("--before", help="an earlier engine module to compare with")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, load {os.getloadavg()[0]:.2f}, {time.strftime('%F %T')}")
    with tempfile.TemporaryDirectory() as tmp:
        backend = TorchBackend(path=tmp, seed=0)
        model = art.TrainableModel(
            name="bench", project="bench", run_name="bench", base_model=DEFAULT_BASE_MODEL
        )
        await model.register(backend)
        trainee = backend._trainees[model.name]
        base, adapter = trainee.base, trainee.adapter
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, param in base.model.named_parameters():
                if f"lora_B.{adapter}." in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.01)
        prompts = prompt_ids(base.tokenizer, args.group_size)
        folded = base.engine

        def engine(module, select) -> GenerationEngine:
            return module.GenerationEngine(
                base.model, base.tokenizer, model_lock=base.lock, select_adapter=select, seed=0
            )

        peft = engine(sys.modules[GenerationEngine.__module__], lambda a: A.select(base, a))
        runs = {
            "folded": lambda: decode(folded, adapter, prompts, args.tokens),
            "peft": lambda: decode(peft, adapter, prompts, args.tokens),
            "no_adapter": lambda: decode(folded, None, prompts, args.tokens),
        }
        others = [peft]
        if args.before:
            before = engine(load_engine_module(args.before), lambda a: A.select(base, a))
            others.append(before)
            runs["before"] = lambda: decode(before, adapter, prompts, args.tokens)
        for run in runs.values():  # warm-up (and the thread tuners' first choices)
            await run()
        rates: dict[str, list[float]] = defaultdict(list)
        tokens: dict[str, list[list[int]]] = {}
        for _ in range(args.repeats):
            for name, run in runs.items():
                rate, tokens[name] = await run()
                rates[name].append(rate)
        rows = len(prompts)
        print(f"{rows} rows ({len(PROMPTS)} prompts x {args.group_size}), {args.tokens} tokens:")
        for name in runs:
            ratio = statistics.median(
                v / p for v, p in zip(rates[name], rates["peft"], strict=True)
            )
            print(f"{name:>11}: {statistics.median(rates[name]):7.1f} tok/s ({ratio:.2f}x peft)")
        same = sum(a == b for a, b in zip(tokens["folded"], tokens["peft"], strict=True))
        print(f"rows whose tokens folded and peft agree on: {same}/{rows}")
        for other in others:
            other.close()
        await backend.close()


if __name__ == "__main__":
    asyncio.run(main())
