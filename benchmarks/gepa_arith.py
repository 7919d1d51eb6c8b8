"""GEPA on arith with the embedded model: does it find, accept and keep a better prompt?

usage: uv run python benchmarks/gepa_arith.py scripted|embedded RUN_DIR [MAX_METRIC_CALLS=250]
       [scenario=arith] [GEPAConfig key=value ...]   (e.g. scenario=arith_retry pareto_size=8)

scripted: a scripted reflector on loopback (a real OpenAI-compatible HTTP server that litellm
  calls) proposes three instructions in turn, from a generic seed ("Answer the question.").
embedded: the embedded model reflects on itself (no key needed; weak), 4 iterations at most.
Both use a 16-scenario Pareto set, minibatches of 6, 2 rollouts per scenario at temperature 0.7,
and report greedy val accuracy (first 50 val items, max_tokens 32) of the seed and the best
prompt, and the metric calls used against the budget. Prints the summary and every history
event as JSON.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("WEAVE_DISABLED", "true")

SEED = "Answer the question."
PROPOSALS = [
    "Reply with a bare number and nothing else.",
    "You are a careful calculator. Reply with only the final number.",
    "You are a calculator. Output only the result.",
]


async def main(mode: str, run_dir: Path, budget: int, overrides: dict[str, str]) -> None:
    import art

    from art_rlvr import DEFAULT_BASE_MODEL, TorchBackend, load_scenario
    from art_rlvr.gepa import GEPAConfig, optimize_prompt
    from art_rlvr.testing import ScriptedServer, Step

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("httpx", "LiteLLM", "litellm"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    backend = TorchBackend(path=run_dir / ".art", seed=0)
    model = art.TrainableModel(
        name="measure", project="gepa", run_name=mode, base_model=DEFAULT_BASE_MODEL
    )
    common = {
        "max_metric_calls": budget,
        "pareto_size": 16,
        "traces_per_iteration": 6,
        "group_size": 2,
        "temperature": 0.7,
        "max_tokens": 32,
        "report_val_limit": 50,
    }
    name = overrides.pop("scenario", "arith")
    common |= overrides  # GEPAConfig validates (and converts) the values
    steps = [Step.reply(f"A better instruction:\n```\n{p}\n```") for p in PROPOSALS]
    server = ScriptedServer(steps, default=steps[-1])
    try:
        await model.register(backend)
        if mode == "scripted":
            os.environ.setdefault("MEASURE_SCRIPTED_KEY", "sk-local")
            config = GEPAConfig(
                reflection={
                    "model": "openai/scripted",
                    "api_base": server.base_url,
                    "api_key_env": "MEASURE_SCRIPTED_KEY",
                },
                **common,
            )
        else:
            config = GEPAConfig(**{"reflection": {"max_tokens": 256}, "max_iterations": 4} | common)
        result = await optimize_prompt(
            model, load_scenario(name, seed=0), seed_prompt=SEED, config=config, run_dir=run_dir
        )
        shown = [r.last_user_text for r in server.chat_requests[:1]]
    finally:
        server.close()
        await backend.close()
    for text in shown:  # what the scripted reflector was shown first (episodes, turn by turn)
        print(f"first reflection prompt ({len(text)} chars):\n{text}")
    print(json.dumps(result.summary(), indent=2))
    for event in result.history:
        print(json.dumps(event.model_dump(mode="json", exclude_none=True)))


if __name__ == "__main__":
    mode, run_dir, *rest = sys.argv[1:]
    budget = int(rest.pop(0)) if rest and "=" not in rest[0] else 250
    pairs = dict(arg.split("=", 1) for arg in rest)
    asyncio.run(main(mode, Path(run_dir), budget, pairs))
