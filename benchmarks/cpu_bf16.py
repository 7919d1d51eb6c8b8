"""bf16 against fp32 on this CPU, side by side: the lever left for generation and training speed.

TorchBackend runs fp32 on CPU (bf16 on CUDA). Cores with AMX (`amx_bf16` in /proc/cpuinfo:
Sapphire Rapids and later) multiply bf16 matrices on tile units that fp32 does not use. This
times, in one process and interleaved, each dtype on

- the embedded model's linear shapes (576 -> 1536, 1536 -> 576, 576 -> 576, the 49,152-row
  head) at 1 / 6 / 36 / 270 rows: one decode row, a group's prompts, a GRPO step's 36 decoding
  rows, a packed training group;
- the whole model: one decode step of 36 rows behind a 48-token cache, and the prefill of 6
  prompts of 48 tokens;

and prints bf16's speed-up (fp32 time / bf16 time). It measures speed only: whether the default
run learns as well in bf16 on CPU, and what batch invariance costs there, are not measured here.

    uv run python benchmarks/cpu_bf16.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from transformers import AutoModelForCausalLM

from art_rlvr import DEFAULT_BASE_MODEL
from art_rlvr.backend.adapters.model_source import resolve_base_model

DTYPES = (torch.float32, torch.bfloat16)
SHAPES = ((576, 1536), (1536, 576), (576, 576), (576, 49152))
ROWS = (1, 6, 36, 270)


def seconds(work: Callable[[], object], calls: int) -> float:
    """Mean seconds a call, after two warm-up calls."""
    for _ in range(2):
        work()
    started = time.perf_counter()
    for _ in range(calls):
        work()
    return (time.perf_counter() - started) / calls


def linear_times(rows: int, k: int, n: int, generator: torch.Generator) -> dict[torch.dtype, float]:
    x = torch.randn(rows, k, generator=generator)
    w = torch.randn(n, k, generator=generator)
    calls = max(5, 2_000_000_000 // (2 * rows * k * n))
    pairs = {dtype: (x.to(dtype), w.to(dtype)) for dtype in DTYPES}  # converted before timing
    return {
        dtype: seconds(lambda a=a, b=b: torch.nn.functional.linear(a, b), calls)
        for dtype, (a, b) in pairs.items()
    }


def model_times(path: str, generator: torch.Generator) -> dict[str, dict[torch.dtype, float]]:
    ids = torch.randint(0, 40_000, (36, 48), generator=generator)
    step_ids = torch.randint(0, 40_000, (36, 1), generator=generator)
    out: dict[str, dict[torch.dtype, float]] = {"decode step, 36 rows": {}, "prefill 6 x 48": {}}
    for dtype in DTYPES:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
        with torch.inference_mode():
            cache = model(input_ids=ids, use_cache=True).past_key_values

            def decode_step(model=model, cache=cache) -> None:
                model(input_ids=step_ids, past_key_values=cache, use_cache=True)
                cache.crop(-1)  # back to the 48 prompt positions

            out["decode step, 36 rows"][dtype] = seconds(decode_step, 10)
            out["prefill 6 x 48"][dtype] = seconds(
                lambda m=model: m(input_ids=ids[:6], logits_to_keep=1), 5
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    flags = open("/proc/cpuinfo").read().split()  # noqa: SIM115 (read once)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"amx_bf16: {'amx_bf16' in flags}, avx512_bf16: {'avx512_bf16' in flags}"
    )
    generator = torch.Generator().manual_seed(0)
    speedups: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for rows in ROWS:
            for k, n in SHAPES:
                t = linear_times(rows, k, n, generator)
                key = f"linear {rows:>3} rows, {k} -> {n}"
                speedups.setdefault(key, []).append(t[torch.float32] / t[torch.bfloat16])
        for key, t in model_times(str(resolve_base_model(DEFAULT_BASE_MODEL)), generator).items():
            speedups.setdefault(key, []).append(t[torch.float32] / t[torch.bfloat16])
    print(f"bf16 speed-up (fp32 time / bf16 time), median of {args.repeats} interleaved repeats:")
    for key, values in speedups.items():
        print(f"  {key:<32} {statistics.median(values):.2f}x")


if __name__ == "__main__":
    main()
