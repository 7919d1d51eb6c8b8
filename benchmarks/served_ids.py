"""Do agents' trained ids equal the ids the server sampled? ART's LangGraph integration and the
OpenAI Agents SDK (the examples of docs/agents.md, loaded from tests/backend/test_agent_frameworks.py),
run against TorchBackend; every turn's ids as the trainer takes them, compared with the ids
read off the HTTP responses, beside what re-rendering the turns from their text would train
(what the trainer did before it kept a record of what it served).

    uv run python benchmarks/served_ids.py --rollouts 8
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("WEAVE_DISABLED", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import art
from openai import AsyncOpenAI

from art_rlvr import DEFAULT_BASE_MODEL, TorchBackend
from art_rlvr.backend.training import train as T

ROOT = Path(__file__).resolve().parents[1]


def examples() -> Any:
    spec = importlib.util.spec_from_file_location(
        "agent_examples", ROOT / "tests" / "test_agent_frameworks.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compare(ex, name: str, trajectories, tokenizer, served, model_name: str, truth) -> None:
    now = T.TurnPolicy(served=served, model=model_name)
    text = T.TurnPolicy(rerender=True, model=model_name)
    got = ex.trained_turns(trajectories, tokenizer, now)
    rerendered = [
        t
        for traj in trajectories
        for t in ex.trained_turns([without_record_ids(ex, traj)], tokenizer, text)
    ]
    truth = sorted(truth)
    exact = sum(1 for t in got if (t.prompt_ids, t.completion_ids) in truth)
    redone = sum(1 for t in rerendered if (t.prompt_ids, t.completion_ids) in truth)
    print(
        f"{name:<28} turns {len(got):>3}  trained = served: {exact}/{len(got)} "
        f"(sources {sorted({t.source for t in got})})  re-rendered from text = served: "
        f"{redone}/{len(rerendered)}"
    )


def without_record_ids(ex, trajectory: art.Trajectory) -> art.Trajectory:
    return ex.without_ids(trajectory) if trajectory.exchanges else trajectory


async def main(args: argparse.Namespace) -> None:
    ex = examples()
    backend = TorchBackend(path=args.path, seed=0)
    model = art.TrainableModel(
        name="served-ids", project="bench", run_name="r", base_model=DEFAULT_BASE_MODEL
    )
    await model.register(backend)
    trainee = backend._trainees[model.name]
    pairs = [(2 + n % 9, 3 + (n * 7) % 11) for n in range(args.rollouts)]

    started = time.perf_counter()
    tap = ex.Tap()
    chat = {"max_tokens": 40, "http_async_client": tap.client(), "invoke_timeout": 900}
    chat["extra_body"] = {"return_token_ids": True}
    rollout = ex.wrap_rollout(model, ex.langgraph_rollout)
    lg = list(await asyncio.gather(*(rollout(model, a, b, **chat) for a, b in pairs)))
    compare(
        ex,
        "ART LangGraph (forced tool)",
        lg,
        trainee.tokenizer,
        trainee.served,
        model.get_inference_name(),
        tap.pairs(),
    )

    tap = ex.Tap()
    client = AsyncOpenAI(
        base_url=model.inference_base_url,
        api_key=model.inference_api_key,
        http_client=tap.client(),
    )
    extra = {"extra_body": {"return_token_ids": True}}
    sdk = await asyncio.gather(
        *(ex.agents_sdk_rollout(model, a, b, client, **extra) for a, b in pairs)
    )
    sdk = [ex.without_ids(t) for t in sdk]
    compare(
        ex,
        "Agents SDK (output_type)",
        sdk,
        trainee.tokenizer,
        trainee.served,
        model.get_inference_name(),
        tap.pairs(),
    )
    typed = sum(1 for t in sdk if not t.logs)
    print(f"Agents SDK runs that ended in a typed output: {typed}/{len(sdk)}")
    print(f"wall time {time.perf_counter() - started:.1f} s, load {os.getloadavg()[0]:.1f}")
    await backend.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--path", default="/tmp/served-ids-bench")
    asyncio.run(main(parser.parse_args()))
