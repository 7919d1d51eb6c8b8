"""Aggregate completion tokens/s of TorchBackend over HTTP at 1, 8, 32 concurrent requests,
next to plain transformers `generate` at batch 1 on the same weights, in the same process.

    uv run python benchmarks/generation_throughput.py [--tokens 48] [--repeats 3]

With `--llama-python PATH` (an interpreter that has llama-cpp-python, which is optional), also
llama.cpp's single-stream rate on the same GGUF file, measured after the rest.

Prints one line per setting: the median rate over repeats and the median of the per-repeat
ratios to HF batch-1 (each repeat measures the baseline next to the runs it divides).
Every request is forced to produce exactly `--tokens` tokens (no early stop), so tokens/s
compare like with like.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import art
import torch

from art_rlvr import DEFAULT_BASE_MODEL, TorchBackend
from art_rlvr.backend.adapters.model_source import embedded_gguf_path

SUBJECTS = ["a lighthouse keeper", "a baker", "a lost cat", "a robot", "a river", "a violinist",
            "a glacier", "a chess player", "a kite", "a miner", "an owl", "a ferry", "a comet",
            "a gardener", "a clockmaker", "a desert", "a tailor", "a whale", "a librarian",
            "a volcano", "a beekeeper", "a train", "a fox", "a painter", "a storm", "a monk",
            "a pilot", "a forest", "a sailor", "a lantern", "a bridge", "a snowman"]  # fmt: skip
PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


def prompt(i: int, shared: bool) -> list[dict[str, str]]:
    if shared:
        return PROMPT
    return [
        {"role": "user", "content": f"Write a short story about {SUBJECTS[i % len(SUBJECTS)]}."}
    ]


async def http_rate(
    model: art.TrainableModel, concurrency: int, tokens: int, shared: bool = False
) -> float:
    client = model.openai_client()

    async def one(i: int) -> int:
        response = await client.chat.completions.create(
            model=model.get_inference_name(), messages=prompt(i, shared), max_tokens=tokens,
            temperature=1.0, seed=i, extra_body={"ignore_eos": True},
        )  # fmt: skip
        return response.usage.completion_tokens

    started = time.perf_counter()
    counts = await asyncio.gather(*[one(i) for i in range(concurrency)])
    return sum(counts) / (time.perf_counter() - started)


LLAMA_CPP = """
import json, statistics, sys, time
from llama_cpp import Llama
path, tokens, repeats, threads, prompt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
llm = Llama(model_path=path, n_ctx=512, n_threads=threads, verbose=False)
rates = []
for i in range(repeats):
    started = time.perf_counter()
    out = llm.create_chat_completion(messages=prompt, max_tokens=tokens, temperature=1.0, seed=i,
                                     logit_bias={2: -100.0})  # no end-of-sequence: `tokens` exactly
    rates.append(out["usage"]["completion_tokens"] / (time.perf_counter() - started))
print(statistics.median(rates))
"""


def llama_cpp_rate(python: str, tokens: int, repeats: int) -> float | None:
    """llama.cpp's single-stream rate on the same GGUF file (Q4_1), run by `python`: an
    interpreter with llama-cpp-python, which the project does not install (it is optional and
    compiles in ~5 min; e.g. `uv venv /tmp/llama && uv pip install --python /tmp/llama/bin/python
    llama-cpp-python`). None when that interpreter cannot import it."""
    path = embedded_gguf_path(DEFAULT_BASE_MODEL.removeprefix("embedded:"))
    args = [str(path), str(tokens), str(repeats), str(os.cpu_count()), json.dumps(PROMPT)]
    done = subprocess.run([python, "-c", LLAMA_CPP, *args], capture_output=True, text=True)
    if done.returncode != 0:
        if "No module named 'llama_cpp'" in done.stderr:
            return None
        raise RuntimeError(f"llama.cpp run failed: {done.stderr[-2000:]}")
    return float(done.stdout.split()[-1])


def hf_rate(backend: TorchBackend, tokens: int) -> float:
    base = next(iter(backend._bases.values()))
    ids = base.tokenizer.apply_chat_template(
        PROMPT, add_generation_prompt=True, return_tensors="pt"
    )
    ids = (ids["input_ids"] if hasattr(ids, "keys") else ids).to(base.model.device)
    with base.lock, torch.inference_mode(), base.model.disable_adapter():
        started = time.perf_counter()
        out = base.model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
            min_new_tokens=tokens, do_sample=True, pad_token_id=base.tokenizer.pad_token_id,
        )  # fmt: skip
        elapsed = time.perf_counter() - started
    return (out.shape[1] - ids.shape[1]) / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument(
        "--llama-python", default=sys.executable, help="an interpreter with llama-cpp-python"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        backend = TorchBackend(path=tmp)
        model = art.TrainableModel(
            name="bench", project="bench", run_name="bench", base_model=DEFAULT_BASE_MODEL
        )
        await model.register(backend)
        print(f"device: {backend.device} ({backend.dtype})")
        await http_rate(model, 2, 8)  # warm-up
        settings = [(c, False) for c in args.concurrency] + [(max(args.concurrency), True)]
        rates: dict[tuple[int, bool], list[float]] = {k: [] for k in settings}
        ratios: dict[tuple[int, bool], list[float]] = {k: [] for k in settings}
        hf_rates = []
        for _ in range(args.repeats):  # interleaved: each ratio is against its own baseline
            hf = hf_rate(backend, args.tokens)
            hf_rates.append(hf)
            for c, shared in settings:
                rate = await http_rate(model, c, args.tokens, shared=shared)
                rates[(c, shared)].append(rate)
                ratios[(c, shared)].append(rate / hf)
        print(
            f"hf_generate batch=1: {statistics.median(hf_rates):.1f} tokens/s "
            f"(median of {args.repeats}, each repeat measured next to the runs it divides)"
        )
        for (c, shared), values in rates.items():
            what = "one shared prompt (a GRPO group)" if shared else "distinct prompts"
            print(
                f"torch_backend http concurrency={c} {what}: "
                f"{statistics.median(values):.1f} tokens/s, ratio vs hf batch-1 "
                f"{statistics.median(ratios[(c, shared)]):.2f}x "
                f"(repeats {', '.join(f'{r:.2f}' for r in ratios[(c, shared)])})"
            )
        await backend.close()
    llama = llama_cpp_rate(args.llama_python, args.tokens, args.repeats)
    best = statistics.median(rates[(max(args.concurrency), False)])
    if llama is None:
        print(f"llama.cpp: {args.llama_python} cannot import llama_cpp; comparison skipped")
    else:
        print(
            f"llama.cpp single stream on the same GGUF: {llama:.1f} tokens/s; torch_backend at "
            f"concurrency={max(args.concurrency)} / llama.cpp: {best / llama:.2f}x "
            "(measured after, not interleaved: llama.cpp needs the cores to itself)"
        )


if __name__ == "__main__":
    asyncio.run(main())
