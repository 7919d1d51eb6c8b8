"""The agent side of TorchBackend's endpoint, measured side by side over real HTTP:

1. per-token cost of constrained decoding (a JSON-schema grammar) / unconstrained sampling,
2. streamed / non-streamed throughput (server-sent events read through the OpenAI SDK),
3. how often `tool_choice="auto"` calls a tool with the embedded model on fixed prompts,
4. with `--libraries`, the per-token mask cost of xgrammar (ours) next to llguidance on the same
   schema and tokens (`uv run --with llguidance ...`; llguidance is not a dependency).

    uv run python benchmarks/agent_endpoint.py [--tokens 32] [--repeats 3] [--concurrency 1 8]
    uv run --with llguidance python benchmarks/agent_endpoint.py --libraries --concurrency --auto-samples 0

Every timed request produces exactly `--tokens` tokens (no early stop: `ignore_eos` without a
grammar; a schema that cannot close within the budget with one), so wall time per token
compares like with like. The two sides of each ratio run back to back in every repeat, in
alternating order, and the printed ratio is the median of the per-repeat ratios: on a shared
machine the load drifts, and only what is measured next to each other is compared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("WEAVE_DISABLED", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import art

from art_rlvr import DEFAULT_BASE_MODEL, TorchBackend

SUBJECTS = ["a lighthouse", "a baker", "a cat", "a robot", "a river", "a violinist", "a glacier",
            "a chess player"]  # fmt: skip
LONG_SCHEMA = {  # cannot be closed within the token budget: every row runs to max_tokens
    "type": "object",
    "properties": {"notes": {"type": "array", "items": {"type": "string"}, "minItems": 200}},
    "required": ["notes"],
}


def function_tool(name: str, description: str, **properties: str) -> dict[str, object]:
    """An OpenAI function tool whose string/number properties are all required."""
    parameters = {
        "type": "object",
        "properties": {key: {"type": kind} for key, kind in properties.items()},
        "required": list(properties),
    }
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


TOOLS = [
    function_tool("get_weather", "Current weather in a city.", city="string"),
    function_tool("calculator", "Evaluate an arithmetic expression.", expression="string"),
]
AUTO_PROMPTS = [
    "What is the weather in Paris right now?",
    "Is it raining in London today? Use the tool.",
    "Compute 1234 * 5678 with the calculator.",
    "What is 17 + 25? Use a tool.",
    "Call get_weather for Tokyo.",
    "Tell me a joke about cats.",
    "What's the temperature in Berlin?",
    "Please calculate (3 + 4) * 12.",
]


def messages(i: int) -> list[dict[str, str]]:
    subject = SUBJECTS[i % len(SUBJECTS)]
    return [{"role": "user", "content": f"Describe {subject} in a few notes as JSON."}]


async def timed(model: art.TrainableModel, concurrency: int, tokens: int, mode: str) -> float:
    """Completion tokens per second of `concurrency` simultaneous requests."""
    client = model.openai_client()
    base = {"model": model.get_inference_name(), "max_tokens": tokens, "temperature": 1.0}

    async def one(i: int) -> int:
        kwargs = {**base, "messages": messages(i), "seed": i}
        if mode == "constrained":
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "notes", "schema": LONG_SCHEMA},
            }
        else:
            kwargs["extra_body"] = {"ignore_eos": True}
        if mode == "streamed":
            stream = await client.chat.completions.create(
                stream=True, stream_options={"include_usage": True}, **kwargs
            )
            usage = None
            async for chunk in stream:
                usage = chunk.usage or usage
            return usage.completion_tokens
        response = await client.chat.completions.create(**kwargs)
        return response.usage.completion_tokens

    started = time.perf_counter()
    counts = await asyncio.gather(*[one(i) for i in range(concurrency)])
    elapsed = time.perf_counter() - started
    assert all(c == tokens for c in counts), counts
    return sum(counts) / elapsed


async def ratio(
    model: art.TrainableModel, concurrency: int, tokens: int, repeats: int, a: str, b: str
) -> dict[str, object]:
    """Median over repeats of rate(a) / rate(b), each pair measured back to back."""
    rates: dict[str, list[float]] = {a: [], b: []}
    ratios = []
    for r in range(repeats):
        for mode in (a, b) if r % 2 == 0 else (b, a):
            rates[mode].append(await timed(model, concurrency, tokens, mode))
        ratios.append(rates[a][-1] / rates[b][-1])
    return {
        "concurrency": concurrency,
        f"{a}_tok_s": round(statistics.median(rates[a]), 1),
        f"{b}_tok_s": round(statistics.median(rates[b]), 1),
        "rate_ratio": round(statistics.median(ratios), 3),
        "per_token_cost_ratio": round(statistics.median(1 / x for x in ratios), 3),
    }


async def auto_rate(model: art.TrainableModel, samples: int) -> dict[str, object]:
    """How often `auto` calls a tool: greedy once and `samples` seeded draws per prompt."""
    client = model.openai_client()
    called = total = greedy_called = 0
    for prompt in AUTO_PROMPTS:
        kwargs = {
            "model": model.get_inference_name(),
            "messages": [{"role": "user", "content": prompt}],
            "tools": TOOLS,
            "max_tokens": 64,
        }
        greedy = await client.chat.completions.create(temperature=0, **kwargs)
        greedy_called += bool(greedy.choices[0].message.tool_calls)
        sampled = await client.chat.completions.create(n=samples, temperature=1.0, seed=0, **kwargs)
        called += sum(bool(c.message.tool_calls) for c in sampled.choices)
        total += len(sampled.choices)
    return {
        "prompts": len(AUTO_PROMPTS),
        "greedy_called": f"{greedy_called}/{len(AUTO_PROMPTS)}",
        "sampled_called": f"{called}/{total}",
        "sampled_rate": round(called / total, 3),
    }


MASK_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"enum": ["c", "f"]},
        "days": {"type": "array", "items": {"type": "integer"}},
        "opts": {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]},
    },
    "required": ["city", "unit", "days", "opts"],
}
MASK_TEXT = json.dumps(
    {"city": "Paris in spring", "unit": "c", "days": [1, 2, 30], "opts": {"a": True}}
)


def library_mask_cost(tokenizer, vocab_size: int, repeats: int) -> dict[str, object]:
    """Microseconds per token to compute the allowed-token bitmask along a forced JSON text."""
    import xgrammar as xgr

    ids = tokenizer(MASK_TEXT, add_special_tokens=False)["input_ids"]
    compiler = xgr.GrammarCompiler(
        xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    )
    compiled = compiler.compile_json_schema(json.dumps(MASK_SCHEMA))
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def xgrammar_run() -> None:
        matcher = xgr.GrammarMatcher(compiled)
        for token in ids:
            matcher.fill_next_token_bitmask(bitmask)
            assert matcher.accept_token(token)

    runs = {"xgrammar": xgrammar_run}
    try:
        import llguidance
        import llguidance.hf
        import llguidance.torch
    except ImportError:
        pass
    else:
        ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, vocab_size)
        grammar = llguidance.LLMatcher.grammar_from_json_schema(MASK_SCHEMA)
        ll_bitmask = llguidance.torch.allocate_token_bitmask(1, vocab_size)

        def llguidance_run() -> None:
            matcher = llguidance.LLMatcher(ll_tokenizer, grammar)
            for token in ids:
                llguidance.torch.fill_next_token_bitmask(matcher, ll_bitmask, 0)
                assert matcher.consume_token(token)

        runs["llguidance"] = llguidance_run
    out: dict[str, object] = {"tokens": len(ids)}
    for name, run in runs.items():
        run()  # warm-up
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            run()
            times.append((time.perf_counter() - started) / len(ids) * 1e6)
        out[f"{name}_us_per_token"] = round(min(times), 1)
    return out


async def main(args: argparse.Namespace) -> None:
    async with TorchBackend(path=tempfile.mkdtemp(prefix="agent-bench-"), seed=0) as backend:
        model = art.TrainableModel(
            name="bench", project="bench", run_name="agent", base_model=DEFAULT_BASE_MODEL
        )
        await model.register(backend)
        if args.libraries:
            base = next(iter(backend._bases.values()))
            vocab = base.model.get_output_embeddings().weight.shape[0]
            result = library_mask_cost(base.tokenizer, vocab, args.repeats)
            print(json.dumps({"measure": "grammar mask per token", **result}), flush=True)
        if args.concurrency:
            await timed(model, 1, 4, "constrained")  # warm-up: grammar tables, first prefill
        for concurrency in args.concurrency:
            result = await ratio(
                model, concurrency, args.tokens, args.repeats, "constrained", "plain"
            )
            print(json.dumps({"measure": "constrained / unconstrained", **result}), flush=True)
            result = await ratio(model, concurrency, args.tokens, args.repeats, "streamed", "plain")
            print(json.dumps({"measure": "streamed / non-streamed", **result}), flush=True)
        if args.auto_samples:
            result = await auto_rate(model, args.auto_samples)
            print(json.dumps({"measure": "tool_choice=auto calls a tool", **result}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 8])
    parser.add_argument("--auto-samples", type=int, default=4)
    parser.add_argument("--libraries", action="store_true")
    asyncio.run(main(parser.parse_args()))
