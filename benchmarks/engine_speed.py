"""Generation speed of TorchBackend's engine next to the baselines it is built on, at the SAME
batch, in one process, on the same weights, prompts and forced token count:

- `engine`: `GenerationEngine.generate`, `b` concurrent requests with distinct prompts;
- `engine_before`: the same, with the engine module at `--before` (e.g. the last commit's:
  `git show HEAD:art_rlvr/backend/engine/generation.py > /tmp/engine_before.py`), on the same model;
- `engine_fixed_threads` (with `--variants`): the same engine with its thread count fixed at
  every usable core (the engine picks its count by timing its own steps:
  `art_rlvr/backend/runtime/threads.py`);
- `engine_tuner_before`: the same engine with the `ThreadTuner` of the module at
  `--tuner-before` (e.g. `git show HEAD:art_rlvr/backend/runtime/threads.py > /tmp/threads_before.py`):
  two tuning policies side by side, each on its own engine, seeing the same conditions;
- `engine_not_invariant` (with `--variants`): the same engine with `batch_invariant=False` (on CPU the engine is
  batch-invariant by default: row-wise attention, no shared-prefix prefill), the price of it;
- `http`: the same requests through TorchBackend's OpenAI-compatible server (OpenAI SDK);
- `hf_generate`: transformers `model.generate` on the left-padded batch of the `b` prompts,
  sampling, `min_new_tokens = max_new_tokens` (the fair anchor: the same batch, not batch 1);
- `hf_generate_batch`: transformers' continuous batching (`generate_batch`, paged attention);
- llama.cpp's single stream on the same GGUF file, when `--llama-python` can import llama_cpp.

    uv run python benchmarks/engine_speed.py [--tokens 32] [--batches 1 8 32] [--repeats 2]
        [--variants] [--before /tmp/engine_before.py] [--tuner-before /tmp/threads_before.py]
        [--llama-python /tmp/llama/bin/python] [--profile]
        [--competitor nice|run] [--no-http] [--no-cb]

`--competitor` measures every setting twice per repeat, idle and beside a competing process on
the same cores (`nice`: a busy loop at nice 19; `run`: another art_rlvr process evaluating), and
prints the engine's ratio to `hf_generate` beside it over the idle ratio (1.0: unaffected). On a
shared machine "idle" only means "without our competitor": record the load average with it.

One OpenMP pool: libgomp gives each thread that runs torch its own pool of workers, and while a
process holds more of them than it has cores it throttles every wait's spinning, which slows
small ops (a training step beside the engine's pool took 1.4x its time, docs/results.md
2026-11-27). So `hf_generate` runs on the engine's own thread (`GenerationEngine.run`), and the
other engines, each on a thread of its own, run only when asked (`--variants`, `--before`,
`--tuner-before`; they throttle every setting of the process alike, as does
`hf_generate_batch`'s manager thread). Until 2026-11-27 two always ran and HF ran on the main
thread: every ratio before that date was measured throttled.

Settings are interleaved within each repeat, so every ratio divides rates measured next to each
other (the machine is shared: ratios, not absolute rates, are what carries). Prints the median
rate and the median of per-repeat ratios to `hf_generate` at the same batch. `--profile` then
prints where one decode step's time goes (phases of the engine, timed around its methods).
With `--before`, it first times one sampling call of each engine on the same random logits
(`--sampler-only` stops there). On a GPU use `--batches 1 32 128 256`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator

import art
import torch
from generation_throughput import SUBJECTS, llama_cpp_rate
from transformers import AutoModelForCausalLM, GenerationConfig

from art_rlvr import DEFAULT_BASE_MODEL, TorchBackend
from art_rlvr.backend.adapters import registry as A
from art_rlvr.backend.engine.generation import GenerationEngine, SamplingParams
from art_rlvr.backend.runtime.threads import usable_cores


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Write a short story about {SUBJECTS[i % 32]}."}]


def prompt_ids(tokenizer, b: int) -> list[list[int]]:
    rendered = [
        tokenizer.apply_chat_template(messages(i), add_generation_prompt=True, tokenize=False)
        for i in range(b)
    ]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in rendered]


def params(tokens: int, i: int) -> SamplingParams:
    return SamplingParams(max_tokens=tokens, temperature=1.0, seed=i, ignore_eos=True)


async def engine_rate(engine, prompts: list[list[int]], tokens: int) -> float:
    started = time.perf_counter()
    done = await asyncio.gather(
        *[engine.generate(p, params(tokens, i), adapter=None) for i, p in enumerate(prompts)]
    )
    return sum(len(c[0].token_ids) for c in done) / (time.perf_counter() - started)


async def http_rate(client, name: str, b: int, tokens: int) -> float:
    async def one(i: int) -> int:
        response = await client.chat.completions.create(
            model=name, messages=messages(i), max_tokens=tokens, temperature=1.0, seed=i,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        return response.usage.completion_tokens

    started = time.perf_counter()
    counts = await asyncio.gather(*[one(i) for i in range(b)])
    return sum(counts) / (time.perf_counter() - started)


def hf_rate(base: A.Base, prompts: list[list[int]], tokens: int) -> float:
    width = max(len(p) for p in prompts)
    pad = base.tokenizer.pad_token_id
    device = base.model.device  # the engine's device: CUDA where there is one
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    with base.lock, torch.inference_mode(), base.model.disable_adapter():
        started = time.perf_counter()
        out = base.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
            do_sample=True, temperature=1.0, top_p=1.0, top_k=0, pad_token_id=pad,
        )  # fmt: skip
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - started
    return (out.shape[1] - width) * len(prompts) / elapsed


def cb_rate(model, prompts: list[list[int]], tokens: int) -> float:
    config = GenerationConfig(
        max_new_tokens=tokens, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
        eos_token_id=None, pad_token_id=model.config.pad_token_id or 0,
    )  # fmt: skip
    started = time.perf_counter()  # no inference_mode: the manager's thread writes its tensors
    out = model.generate_batch(inputs=prompts, generation_config=config, progress_bar=False)
    elapsed = time.perf_counter() - started
    return sum(len(o.generated_tokens) for o in out.values()) / elapsed


COMPETITORS = {
    # a busy loop at the lowest priority: what a laptop's background work looks like
    "nice": ["nice", "-n", "19", sys.executable, "-c", "while True: pass"],
    # another art_rlvr process generating and scoring (an evaluation of the default task)
    "run": [sys.executable, "-m", "art_rlvr.run", "scenario=arith", "mode=eval",
            "eval_test=false", "val_limit=200"],
}  # fmt: skip


@contextlib.contextmanager
def competing(condition: str) -> Iterator[None]:
    """Run the block beside the competitor `condition` names (nothing for `idle`); a
    competitor that ends early is started again, so it competes for the whole block."""
    if condition == "idle":
        yield
        return
    stop = threading.Event()

    def keep_running() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            while not stop.is_set():
                command = [*COMPETITORS[condition], f"run_dir={tmp}/{time.time_ns()}"]
                if condition == "nice":
                    command = COMPETITORS[condition]
                proc = subprocess.Popen(
                    command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
                while proc.poll() is None and not stop.wait(0.2):
                    pass
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    thread = threading.Thread(target=keep_running, daemon=True)
    thread.start()
    time.sleep(0.5 if condition == "nice" else 20)  # a run loads its model first
    try:
        yield
    finally:
        stop.set()
        thread.join()


def load_tuner(path: str) -> type:
    """The `ThreadTuner` class of a threads module file (a tuner without `resume`, from before
    the engine called it, gets a no-op one)."""
    spec = importlib.util.spec_from_file_location("threads_before", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tuner = module.ThreadTuner
    if not hasattr(tuner, "resume"):
        tuner.resume = lambda self, idle_seconds: None
    return tuner


def load_engine_module(path: str):
    spec = importlib.util.spec_from_file_location("engine_before", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["engine_before"] = module
    spec.loader.exec_module(module)
    return module


class PhaseTimer:
    """Wall time spent inside named callables of the engine's thread (a benchmark-only probe,
    wrapped around the instance's attributes, so the engine's code is unchanged)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, owner: object, attribute: str, label: str) -> None:
        inner: Callable = getattr(owner, attribute)

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - started
                self.calls[label] += 1

        setattr(owner, attribute, timed)

    def report(self, steps: int, total: float) -> None:
        print(f"  {steps} decode steps, {total / steps * 1e3:.1f} ms a step (wall, engine thread)")
        for label, seconds in sorted(self.seconds.items(), key=lambda kv: -kv[1]):
            print(
                f"  {label:>34}: {seconds / steps * 1e3:7.2f} ms/step "
                f"{seconds / total:6.1%} ({self.calls[label]} calls)"
            )


async def profile(engine, base: A.Base, prompts: list[list[int]], tokens: int, label: str) -> None:
    timer = PhaseTimer()
    names = [
        n
        for n in ("_sample", "_finish", "_record", "_select_rows", "_prefill")
        if hasattr(engine, n)
    ]
    for name in names:
        timer.wrap(engine, name, name.strip("_"))
    timer.wrap(base.model, "forward", "model forward (prefill + decode)")
    timer.wrap(base.tokenizer, "decode", "tokenizer.decode")
    started = time.perf_counter()
    await engine_rate(engine, prompts, tokens)
    total = time.perf_counter() - started
    for name in names:
        delattr(engine, name)
    del base.model.forward, base.tokenizer.decode
    print(f"profile of {label}, batch {len(prompts)}, {tokens} tokens:")
    timer.report(tokens, total)


def sampler_report(before, rows: int, vocab: int, repeats: int) -> None:
    """One sampling call (token + untempered logprob per row) of the engine before and now,
    on the same random logits, for three settings; medians of interleaved calls."""
    from art_rlvr.backend.engine.sampler import sample

    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 4
    uniform = torch.rand(rows, dtype=torch.float64)

    def old(t, p):
        tokens = before.sample_tokens(logits, temperature=t, top_p=p, uniform=uniform)
        return torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None])

    for label, temperature, top_p in (
        ("T=1, top_p=1", 1.0, 1.0),
        ("T=0.7, top_p=1", 0.7, 1.0),
        ("T=1, top_p=0.9", 1.0, 0.9),
    ):
        t, p = torch.full((rows,), temperature), torch.full((rows,), top_p)
        times: dict[str, list[float]] = defaultdict(list)
        for _ in range(repeats):
            for name, run in (
                ("before", old),
                ("now", lambda t, p: sample(logits, temperature=t, top_p=p, uniform=uniform)),
            ):
                started = time.perf_counter()
                run(t, p)
                times[name].append(time.perf_counter() - started)
        b, n = statistics.median(times["before"]), statistics.median(times["now"])
        print(
            f"sampling {rows} rows x {vocab}, {label}: before {b * 1e3:.1f} ms, now {n * 1e3:.1f} ms ({b / n:.1f}x)"
        )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--before", help="an engine module file to compare with (same model)")
    parser.add_argument("--tuner-before", help="a threads module file whose tuner to compare")
    parser.add_argument("--llama-python", default=sys.executable)
    parser.add_argument("--no-cb", action="store_true", help="skip transformers generate_batch")
    parser.add_argument("--no-http", action="store_true", help="skip the requests over HTTP")
    parser.add_argument(
        "--variants",
        action="store_true",
        help="also the engine at fixed threads and without invariance (their threads throttle "
        "the process's OpenMP spinning: every setting is then measured throttled)",
    )
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sampler-only", action="store_true", help="with --before: sampling only")
    parser.add_argument(
        "--competitor",
        choices=sorted(COMPETITORS),
        help="also measure beside a competing process on the same cores (interleaved)",
    )
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {load[0]:.2f}")
    if args.before:
        sampler_report(load_engine_module(args.before), max(args.batches), 49_152, 5)
        if args.sampler_only:
            return
    with tempfile.TemporaryDirectory() as tmp:
        backend = TorchBackend(path=tmp)
        model = art.TrainableModel(
            name="bench", project="bench", run_name="bench", base_model=DEFAULT_BASE_MODEL
        )
        await model.register(backend)
        base_name, base = next(iter(backend._bases.items()))
        client = model.openai_client()
        engine = base.engine
        before = None
        if args.before:
            before = load_engine_module(args.before).GenerationEngine(
                base.model, base.tokenizer, model_lock=base.lock,
                select_adapter=lambda name: A.select(base, name), seed=0,
            )  # fmt: skip
        free = None
        if engine.batch_invariant and args.variants:  # the price of batch invariance
            free = GenerationEngine(
                base.model, base.tokenizer, model_lock=base.lock,
                select_adapter=lambda name: A.select(base, name), seed=0, batch_invariant=False,
            )  # fmt: skip
        fixed = None
        if args.variants:
            fixed = GenerationEngine(
                base.model, base.tokenizer, model_lock=base.lock,
                select_adapter=lambda name: A.select(base, name), seed=0, threads=usable_cores(),
            )  # fmt: skip
        tuner_before = None
        if args.tuner_before:
            tuner_before = GenerationEngine(
                base.model, base.tokenizer, model_lock=base.lock,
                select_adapter=lambda name: A.select(base, name), seed=0,
            )  # fmt: skip
            tuner_before.tuner = load_tuner(args.tuner_before)(usable_cores())
        cb_model = None
        if not args.no_cb:
            cb_model = AutoModelForCausalLM.from_pretrained(
                base.path, dtype=torch.float32, attn_implementation="paged|sdpa"
            ).eval()
        prompts = {b: prompt_ids(base.tokenizer, b) for b in args.batches}
        await engine_rate(engine, prompts[min(args.batches)], 4)  # warm-up
        runs: dict[str, Callable[[int], Awaitable[float] | float]] = {
            "hf_generate": lambda b: engine.run(
                hf_rate, base, prompts[b], args.tokens, threads=usable_cores()
            ),
            "engine": lambda b: engine_rate(engine, prompts[b], args.tokens),
        }
        if not args.no_http:
            runs["http"] = lambda b: http_rate(client, base_name, b, args.tokens)
        if fixed is not None:
            runs["engine_fixed_threads"] = lambda b: engine_rate(fixed, prompts[b], args.tokens)
        if before is not None:
            runs["engine_before"] = lambda b: engine_rate(before, prompts[b], args.tokens)
        if tuner_before is not None:
            runs["engine_tuner_before"] = lambda b: engine_rate(
                tuner_before, prompts[b], args.tokens
            )
        if free is not None:
            runs["engine_not_invariant"] = lambda b: engine_rate(free, prompts[b], args.tokens)
        if cb_model is not None:
            runs["hf_generate_batch"] = lambda b: cb_rate(cb_model, prompts[b], args.tokens)
        rates: dict[tuple[str, int, str], list[float]] = defaultdict(list)
        conditions = ["idle", *([args.competitor] if args.competitor else [])]
        tuned: list[str] = []
        tuned_before: list[str] = []
        for _ in range(args.repeats):
            for condition in conditions:
                with competing(condition):
                    for b in args.batches:
                        for name, run in runs.items():
                            value = run(b)
                            rate = await value if asyncio.iscoroutine(value) else value
                            rates[(name, b, condition)].append(rate)
                            if name == "engine":  # where the tuner stood after each run
                                tuned.append(f"{condition}:{engine.tuner.current}")
                            if name == "engine_tuner_before" and tuner_before is not None:
                                tuned_before.append(f"{condition}:{tuner_before.tuner.current}")
        print(f"tokens/s, {args.tokens} forced tokens a request, median of {args.repeats}; ratio")
        print("= median over repeats of rate / hf_generate at the same batch in that repeat")
        ratios: dict[tuple[str, int, str], float] = {}
        for condition in conditions:
            print(f"-- {condition}" + ("" if condition == "idle" else " (beside a competitor)"))
            for b in args.batches:
                hf = rates[("hf_generate", b, condition)]
                for name in runs:
                    values = rates[(name, b, condition)]
                    ratio = statistics.median(v / h for v, h in zip(values, hf, strict=True))
                    ratios[(name, b, condition)] = ratio
                    print(
                        f"batch {b:>3} {name:>18}: {statistics.median(values):7.1f} ({ratio:.2f}x)"
                    )
        if args.competitor:
            print(f"engine / hf_generate with the competitor ({args.competitor}) over idle:")
            for b in args.batches:
                busy, idle = ratios[("engine", b, args.competitor)], ratios[("engine", b, "idle")]
                print(f"batch {b:>3}: {busy:.2f}x / {idle:.2f}x = {busy / idle:.2f}")
        print(
            f"engine's thread tuner: {engine.tuner.switches} switches; threads after each run "
            f"(condition:threads): {' '.join(tuned)}"
        )
        if tuner_before is not None:
            print(
                f"the --tuner-before tuner: {tuner_before.tuner.switches} switches; threads after "
                f"each run: {' '.join(tuned_before)}"
            )
        if args.profile:
            b = max(args.batches)
            await profile(engine, base, prompts[b], args.tokens, "engine")
            if before is not None:
                await profile(before, base, prompts[b], args.tokens, "engine_before")
        for other in (before, free, fixed):
            if other is not None:
                other.close()
        await backend.close()
    llama = llama_cpp_rate(args.llama_python, args.tokens, args.repeats)
    if llama is None:
        print(f"llama.cpp: {args.llama_python} cannot import llama_cpp (optional); skipped")
    else:
        best = statistics.median(rates[("engine", max(args.batches), "idle")])
        print(
            f"llama.cpp single stream, same GGUF (Q4_1): {llama:.1f} tokens/s; engine at batch "
            f"{max(args.batches)} / llama.cpp = {best / llama:.2f}x (measured after, alone)"
        )
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
